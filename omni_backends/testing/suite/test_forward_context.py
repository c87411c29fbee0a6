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


def _modes(capabilities) -> list:
    from vllm.config import CUDAGraphMode

    return [CUDAGraphMode.NONE] + [CUDAGraphMode[m] for m in capabilities.static_graph_modes
                                   if CUDAGraphMode[m] in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)]


def _seen(enter, model, dev, n) -> object:
    with enter:
        model(torch.zeros(n, device=dev))
    return model.seen


def test_round_trip(backend, capabilities, vllm_config):
    """Each argument reaches the model as passed: ``attn_metadata``, ``slot_mapping`` (the same objects),
    the runtime mode, the batch descriptor; and the context ends with the block."""
    from vllm.forward_context import BatchDescriptor, is_forward_context_available

    dev = backend.device()
    model = _Probe()
    for mode in _modes(capabilities):
        attn = {"model.layers.0.self_attn.attn": object()}
        slots = {"model.layers.0.self_attn.attn": torch.arange(8, device=dev)}
        desc = BatchDescriptor(num_tokens=8, num_reqs=2, uniform=False)
        fc = _seen(backend.forward_context(attn, vllm_config, num_tokens=8, cudagraph_runtime_mode=mode,
                                           batch_descriptor=desc, slot_mapping=slots), model, dev, 8)
        expect(fc.attn_metadata is attn, "forward-context", f"mode {mode.name}: the model saw attn_metadata="
               f"{fc.attn_metadata!r}, not the object passed in")
        expect(fc.cudagraph_runtime_mode == mode, "forward-context",
               f"the model saw cudagraph_runtime_mode={fc.cudagraph_runtime_mode}, passed {mode}")
        expect(fc.batch_descriptor == desc, "forward-context",
               f"the model saw batch_descriptor={fc.batch_descriptor}, passed {desc}")
        expect(fc.slot_mapping is slots, "forward-context",
               f"mode {mode.name}: the model saw slot_mapping={fc.slot_mapping!r}, not the dict passed in (the "
               "attention layers write the KV cache at those slots)")
        expect(not is_forward_context_available(), "forward-context",
               "the forward context is still set after the with-block ended")


def test_what_vllm_derives_from_the_arguments(backend, capabilities, vllm_config):
    """Against vLLM's own ``set_forward_context`` given the same arguments (the oracle): what vLLM derives from
    them -- the batch descriptor it makes of ``num_tokens`` where none is passed, the slot mapping, the mode --
    is what the model sees through the driver's ``forward_context``."""
    from vllm.forward_context import set_forward_context

    dev = backend.device()
    model = _Probe()
    for mode in _modes(capabilities):
        for n in (8, 24):
            slots = {"model.layers.0.self_attn.attn": torch.arange(n, device=dev)}
            kw = dict(num_tokens=n, cudagraph_runtime_mode=mode, slot_mapping=slots)
            want = _seen(set_forward_context(None, vllm_config, **kw), model, dev, n)
            got = _seen(backend.forward_context(None, vllm_config, **kw), model, dev, n)
            for field in ("batch_descriptor", "cudagraph_runtime_mode", "slot_mapping", "attn_metadata"):
                a, b = getattr(got, field), getattr(want, field)
                same = a is b if field in ("slot_mapping", "attn_metadata") else a == b  # objects passed through
                expect(same, "forward-context",
                       f"mode {mode.name}, num_tokens={n}, no batch_descriptor: the model saw {field}="
                       f"{getattr(got, field)!r} where vLLM's set_forward_context gives {getattr(want, field)!r} "
                       "for the same arguments" + (" (num_tokens was not passed on)" if field == "batch_descriptor"
                                                   else ""))


def test_defaults_mean_eager(backend, vllm_config):
    from vllm.config import CUDAGraphMode

    model = _Probe()
    with backend.forward_context(None, vllm_config, num_tokens=4):
        model(torch.zeros(4, device=backend.device()))
    expect(model.seen.cudagraph_runtime_mode == CUDAGraphMode.NONE, "forward-context",
           f"cudagraph_runtime_mode=None must mean CUDAGraphMode.NONE, the model saw {model.seen.cudagraph_runtime_mode}")
    expect(model.seen.attn_metadata is None, "forward-context", "attn_metadata=None did not reach the model as None")
