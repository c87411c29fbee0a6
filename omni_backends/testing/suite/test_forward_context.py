"""Forward-context round trip: what goes in is what the model sees (device tier, needs vLLM)."""

from __future__ import annotations

import pytest
import torch

from omni_backends.testing.kit import expect, vllm_missing_reason

pytestmark = pytest.mark.device_tier


@pytest.fixture(scope="module")
def vllm_config():
    missing = vllm_missing_reason()
    if missing:
        pytest.skip(f"{missing}; the forward context is vLLM's (vllm.forward_context.get_forward_context)")
    from vllm.config import VllmConfig

    return VllmConfig()


class _Probe(torch.nn.Module):
    """A model that records what it sees in vLLM's forward context."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        self.seen = get_forward_context()
        return x + 1


def test_round_trip(backend, capabilities, vllm_config):
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, is_forward_context_available

    dev = backend.device()
    modes = [CUDAGraphMode.NONE] + [CUDAGraphMode[m] for m in capabilities.static_graph_modes
                                    if CUDAGraphMode[m] in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)]
    model = _Probe()
    for mode in modes:
        attn = {"model.layers.0.self_attn.attn": object()}
        slots = {"model.layers.0.self_attn.attn": torch.arange(8, device=dev)}
        desc = BatchDescriptor(num_tokens=8, num_reqs=2, uniform=False)
        with backend.forward_context(attn, vllm_config, num_tokens=8, cudagraph_runtime_mode=mode,
                                     batch_descriptor=desc, slot_mapping=slots):
            model(torch.zeros(8, device=dev))
        fc = model.seen
        expect(fc.attn_metadata is attn, "forward-context", f"mode {mode.name}: the model saw attn_metadata="
               f"{fc.attn_metadata!r}, not the object passed in")
        expect(fc.cudagraph_runtime_mode == mode, "forward-context",
               f"the model saw cudagraph_runtime_mode={fc.cudagraph_runtime_mode}, passed {mode}")
        expect(fc.batch_descriptor == desc, "forward-context",
               f"the model saw batch_descriptor={fc.batch_descriptor}, passed {desc}")
        expect(fc.slot_mapping is None or fc.slot_mapping is slots, "forward-context",
               f"the model saw a slot_mapping that is not the one passed in: {fc.slot_mapping!r}")
        expect(not is_forward_context_available(), "forward-context",
               "the forward context is still set after the with-block ended")


def test_defaults_mean_eager(backend, vllm_config):
    from vllm.config import CUDAGraphMode

    model = _Probe()
    with backend.forward_context(None, vllm_config, num_tokens=4):
        model(torch.zeros(4, device=backend.device()))
    expect(model.seen.cudagraph_runtime_mode == CUDAGraphMode.NONE, "forward-context",
           f"cudagraph_runtime_mode=None must mean CUDAGraphMode.NONE, the model saw {model.seen.cudagraph_runtime_mode}")
    expect(model.seen.attn_metadata is None, "forward-context", "attn_metadata=None did not reach the model as None")
