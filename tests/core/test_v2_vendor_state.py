"""A vendor's own V2 ``ModelState`` composed with the omni hooks (issue 24, "npu on V2"), simulated on CPU
with vLLM's real V2 classes (``DefaultModelState``, ``InputBatch``, ``NewRequestData``, ``CUDAGraphMode``).

vllm-ascend builds its own state: ``AscendModelState(DefaultModelState)``
(``vllm_ascend/worker/v2/model_states/default.py``), installed by replacing vLLM's
``model_runner.init_model_state`` at module level
(``vllm_ascend/patch/worker/patch_v2/patch_model_state.py:26``). Its one override,
``prepare_attn``, builds the NPU attention metadata and keeps it in
``self.attn_metadata`` (vllm-ascend's ACL graph manager reads it back for a FULL
replay). :class:`SimAscendModelState` does the same over vLLM's real
``DefaultModelState``, and :func:`sim_init_model_state` stands for vllm-ascend's
replacement, installed on vLLM's runner module for one test (monkeypatch, undone
after it). What is checked: the omni V2 runner's ``load_model`` composes the omni
hooks with that state in place, the vendor's ``prepare_attn`` stays the one that
runs (its result unchanged), the omni hooks run in ``add_request`` /
``prepare_inputs`` / ``remove_request``, and a vendor state that cannot be composed
is refused with one error naming both classes, the state left as it was built.

No NPU, CANN or vllm-ascend exists here: this is the simulated half; the static
half (which vllm-ascend / vLLM pairs call these seams) is
``tests/test_drift_vendor_sources.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from core.kinds import AR  # noqa: E402
from tests.core.v2_fakes import (  # noqa: E402
    IDS, NUM_TOKENS, PROMPT, SLOT, TinyTalker, greedy_inner, input_batch, needs_vllm, new_request, payloads,
    req_states_for,
)


@dataclasses.dataclass
class VendorAttnMetadata:
    """What a vendor's ``prepare_attn`` builds (vllm-ascend: ``AscendMetadata`` per layer)."""

    num_reqs: int
    num_tokens: int
    for_capture: bool


def sim_ascend_state_cls() -> type:
    """``SimAscendModelState``: vLLM's ``DefaultModelState`` with ``prepare_attn`` overridden the way
    ``AscendModelState.prepare_attn`` is (padded sizes for FULL graphs, else the real ones; the metadata
    kept in ``self.attn_metadata`` and returned)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    class SimAscendModelState(DefaultModelState):
        def prepare_attn(self, input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups,
                         kv_cache_config, for_capture=False, **kwargs):
            full = cudagraph_mode == CUDAGraphMode.FULL
            num_reqs = input_batch.num_reqs_after_padding if full else input_batch.num_reqs
            num_tokens = input_batch.num_tokens_after_padding if full else input_batch.num_tokens
            self.attn_metadata = {"layer.0": VendorAttnMetadata(int(num_reqs), int(num_tokens), for_capture)}
            return self.attn_metadata

    return SimAscendModelState


def sim_init_model_state(state_cls: type):
    """Stands for vllm-ascend's ``init_asecnd_model_state``: the vendor's state whatever the model."""

    def init_model_state(vllm_config, model, encoder_cache, device):
        return state_cls(vllm_config, model, encoder_cache, device)

    return init_model_state


def vendor_runner(backend):
    """The omni V2 runner mixin over a base whose ``load_model`` builds the state the way vLLM's
    ``GPUModelRunner.load_model`` does: through the runner module's ``init_model_state`` global (the name
    vllm-ascend replaces), looked up at call time."""
    import vllm.v1.worker.gpu.model_runner as runner_mod

    from core.runner.v2 import OmniV2RunnerMixin

    class Base:
        def __init__(self, vllm_config, model):
            self.vllm_config, self._model = vllm_config, model

        def load_model(self):
            self.model_state = runner_mod.init_model_state(self.vllm_config, self._model, None, torch.device("cpu"))
            self.sampler = greedy_inner()

    return type("OmniARSimNPUModelRunner", (OmniV2RunnerMixin, Base), {"omni_backend": backend})


def prepare_attn_args(batch):
    from vllm.config import CUDAGraphMode

    return batch, CUDAGraphMode.NONE, (torch.zeros(8, 4, dtype=torch.int32),), torch.arange(NUM_TOKENS), [[]], None


@needs_vllm
def test_the_runner_composes_the_omni_hooks_with_the_vendor_state_and_keeps_its_prepare_attn(
        vllm_config, cpu_selected, monkeypatch):
    import vllm.v1.worker.gpu.model_runner as runner_mod
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.runner.model_state import OmniModelStateMixin, OmniSampler

    vendor = sim_ascend_state_cls()
    monkeypatch.setattr(runner_mod, "init_model_state", sim_init_model_state(vendor))  # vllm-ascend's patch
    model = TinyTalker()
    runner = vendor_runner(cpu_selected)(vllm_config, model)
    runner.load_model()
    state = runner.model_state
    mro = type(state).__mro__
    assert mro[:4] == (type(state), OmniModelStateMixin, vendor, DefaultModelState), mro
    assert type(state).__name__ == "OmniSimAscendModelState" and isinstance(runner.sampler, OmniSampler)

    # the vendor's prepare_attn is the one that runs, and its result is what it returned
    assert type(state).prepare_attn is vendor.prepare_attn
    batch = input_batch(padded=16)
    meta = state.prepare_attn(*prepare_attn_args(batch))
    assert meta is state.attn_metadata
    assert meta == {"layer.0": VendorAttnMetadata(num_reqs=3, num_tokens=NUM_TOKENS, for_capture=False)}
    plain = vendor(vllm_config, TinyTalker(), None, torch.device("cpu"))
    assert plain.prepare_attn(*prepare_attn_args(batch)) == meta  # the same as the uncomposed vendor state's

    # the omni hooks run in the vendor state's add_request / prepare_inputs / remove_request
    hooks = state.omni_hooks
    assert hooks is runner.omni_hooks and hooks.model is model
    pl = payloads()
    for r in IDS:
        state.add_request(SLOT[r], new_request(r, PROMPT[r], pl[r]))
    assert sorted(hooks.payloads.request_ids()) == sorted(IDS)
    kw = state.prepare_inputs(batch, req_states_for(SLOT, PROMPT))
    assert kw["inputs_embeds"].data_ptr() == state.omni_inputs_embeds.data_ptr()
    assert [p["voice"] for p in kw["runtime_additional_information"]] == [1, 2, 3]
    assert kw["request_token_spans"] == [(0, 1), (1, 9), (9, 13)]
    torch.testing.assert_close(kw["inputs_embeds"][1:9], pl["mid"]["thinker_hidden"][4:12] * 3.0)  # preprocess
    assert hooks.mtp_calls == {"dec": 1}  # the talker MTP ran for the decode row, before the forward
    state.remove_request("mid")
    assert sorted(hooks.payloads.request_ids()) == ["dec", "last"]
    assert state.prepare_attn(*prepare_attn_args(batch)) == meta  # the omni hooks did not touch it


@needs_vllm
def test_a_stock_model_on_the_vendor_state_keeps_that_state_exactly(vllm_config, cpu_selected, monkeypatch):
    import vllm.v1.worker.gpu.model_runner as runner_mod

    from tests.core.v2_fakes import StockLike

    vendor = sim_ascend_state_cls()
    monkeypatch.setattr(runner_mod, "init_model_state", sim_init_model_state(vendor))
    runner = vendor_runner(cpu_selected)(vllm_config, StockLike())
    runner.load_model()
    assert type(runner.model_state) is vendor and not hasattr(runner.sampler, "state")


def _uncomposable_states() -> list[tuple[type, str]]:
    """Vendor states the omni hooks cannot be composed with, each with the reason the error gives."""
    vendor = sim_ascend_state_cls()

    class HooksOwnState(vendor):  # a vendor state with an attribute of the omni state's own
        omni_hooks = "the vendor's"

    class BatchViewState(vendor):  # ... or a method the omni state defines differently
        def batch_view(self, input_batch, req_states):
            return "the vendor's"

    class NoRemoveRequestState(vendor):  # vLLM 0.23's ModelState: no remove_request, never called
        remove_request = None

    return [(HooksOwnState, "defines omni_hooks"), (BatchViewState, "defines batch_view"),
            (NoRemoveRequestState, "has no remove_request")]


@needs_vllm
@pytest.mark.parametrize("case", range(3), ids=["omni_hooks", "batch_view", "no-remove_request"])
def test_a_vendor_state_that_cannot_be_composed_is_one_error_naming_both_classes_state_untouched(
        vllm_config, cpu_selected, case):
    from core.runner.model_state import ModelStateCompositionError, compose_model_state

    cls, why = _uncomposable_states()[case]
    state = cls(vllm_config, TinyTalker(), None, torch.device("cpu"))
    before = dict(vars(state))
    with pytest.raises(ModelStateCompositionError) as err:
        compose_model_state(state, cpu_selected, AR)
    msg = str(err.value)
    assert "core.runner.model_state.OmniModelStateMixin" in msg and f"{cls.__module__}.{cls.__qualname__}" in msg
    assert why in msg and "VLLM_USE_V2_MODEL_RUNNER=0" in msg
    assert type(state) is cls and vars(state) == before
    assert state.prepare_attn(*prepare_attn_args(input_batch())) == state.attn_metadata  # still the vendor's state
