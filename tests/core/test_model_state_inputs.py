"""The omni V2 ``ModelState`` (core.runner.model_state) on CPU tensors, without a V2 engine: how vLLM builds it, the
payload lifecycle, and the model inputs it prepares (preprocess, the talker MTP before the forward, one persistent
``inputs_embeds``, the omni kwargs, the embeds seam under the name the installed vLLM calls). The fakes and the
stand-ins for vLLM classes that do not construct on CPU: ``tests/core/v2_fakes.py``.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from core.kinds import AR, GENERATION  # noqa: E402
from tests.core.v2_fakes import (  # noqa: E402
    H, IDS, MAX_REQS, MAX_TOKENS, NUM_TOKENS, PROMPT, VOCAB, TinyTalker, add_all, greedy_inner, input_batch,
    make_state,
    needs_vllm, omni_sampler, payloads,
)


# -------------------------------------------------------------- vLLM picks it
@needs_vllm
def test_the_runner_composes_the_omni_hooks_with_the_state_vllm_built_without_touching_its_globals(vllm_config):
    import vllm.v1.worker.gpu.model_runner as runner_mod
    import vllm.v1.worker.gpu.model_states as states_mod
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.runner.model_state import OmniModelStateMixin, model_state_cls
    from core.models.demo import OmniDemoCode2Wav, OmniDemoTalker, OmniDemoThinker

    before = (runner_mod.init_model_state, states_mod.init_model_state, states_mod.resolve_model_state_cls)
    model = TinyTalker()
    assert states_mod.resolve_model_state_cls(vllm_config, model) is DefaultModelState  # vLLM's own choice
    state = make_state(vllm_config, model)
    assert type(state) is model_state_cls(AR)
    assert isinstance(state, DefaultModelState) and isinstance(state, OmniModelStateMixin)
    assert (runner_mod.init_model_state, states_mod.init_model_state, states_mod.resolve_model_state_cls) == before
    assert state.omni_hooks.kind == AR and state.omni_hooks.model is model
    # the demo models no longer choose a state: the runner composes (kind from the runner)
    for cls in (OmniDemoThinker, OmniDemoTalker, OmniDemoCode2Wav):
        assert not hasattr(cls, "get_model_state_cls")
    assert model_state_cls(GENERATION).omni_kind == GENERATION
    with pytest.raises(ValueError, match="runner kind must be one of"):
        model_state_cls("talker")


@needs_vllm
def test_a_model_that_declares_the_omni_state_itself_still_gets_it_bound_once(vllm_config):
    from vllm.v1.worker.gpu.model_states import init_model_state

    from core.runner.model_state import compose_model_state, model_state_cls
    from omni_backends.registry import get_backend

    model = TinyTalker()
    model.get_model_state_cls = lambda: model_state_cls(AR)
    state = init_model_state(vllm_config, model, None, torch.device("cpu"))
    assert type(state) is model_state_cls(AR) and state.omni_hooks is None  # inert until the runner binds it
    assert compose_model_state(state, get_backend(), AR) is state
    assert type(state) is model_state_cls(AR) and state.omni_hooks.model is model


@needs_vllm
def test_speculative_decoding_is_refused_with_the_fix_and_the_state_is_left_as_vllm_built_it(vllm_config):
    from vllm.v1.worker.gpu.model_states import init_model_state
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.runner.model_state import compose_model_state
    from omni_backends.registry import get_backend

    state = init_model_state(vllm_config, TinyTalker(), None, torch.device("cpu"))
    before = dict(vars(state))
    state.vllm_config = types.SimpleNamespace(**{f: getattr(vllm_config, f) for f in ("model_config",
                                                                                       "scheduler_config")})
    state.vllm_config.speculative_config = object()
    before["vllm_config"] = state.vllm_config
    with pytest.raises(ValueError, match="does not support speculative decoding.*VLLM_USE_V2_MODEL_RUNNER=0"):
        compose_model_state(state, get_backend(), AR)
    assert type(state) is DefaultModelState and vars(state) == before


# -------------------------------------------------------- payload lifecycle
@needs_vllm
def test_add_request_stores_the_payload_and_remove_request_frees_it(vllm_config):
    model = TinyTalker()
    state = make_state(vllm_config, model)
    pl = payloads()
    add_all(state, pl)
    hooks = state.omni_hooks
    assert sorted(hooks.payloads.request_ids()) == sorted(IDS)
    for r in IDS:
        torch.testing.assert_close(hooks.payloads.get(r)["thinker_hidden"], pl[r]["thinker_hidden"])
        assert hooks.payloads.get(r)["voice"] == pl[r]["voice"]
    state.remove_request("mid")  # finished, aborted or preempted: vLLM removes it from the state
    assert sorted(hooks.payloads.request_ids()) == ["dec", "last"]
    state.remove_request("never-added")  # vLLM may remove an id twice (streaming re-add)
    assert len(hooks.payloads) == 2


# ----------------------------------------------------------- prepare_inputs
@needs_vllm
def test_prepare_inputs_runs_preprocess_and_the_mtp_into_one_persistent_buffer(vllm_config):
    model = TinyTalker()
    state = make_state(vllm_config, model)
    pl = payloads()
    rs = add_all(state, pl)
    buf = state.omni_inputs_embeds
    assert buf.shape == (MAX_TOKENS, H) and not state.runner_builds_embeds
    padded = 16
    b = input_batch(padded=padded)
    kw = state.prepare_inputs(b, rs)
    emb = kw["inputs_embeds"]
    assert emb.shape == (padded, H) and emb.data_ptr() == buf.data_ptr()
    expect = model.embed_input_ids(b.input_ids[:NUM_TOKENS]).detach()
    expect[0] += 1.0  # the decode row: the talker MTP's embeds (before the forward)
    expect[1:9] = pl["mid"]["thinker_hidden"][4:12] * 3.0  # preprocess: prompt positions 4..12
    expect[9:13] = pl["last"]["thinker_hidden"][16:20] * 3.0  # prompt positions 16..20
    torch.testing.assert_close(emb[:NUM_TOKENS], expect)
    assert [p["voice"] for p in kw["runtime_additional_information"]] == [1, 2, 3]
    assert kw["model_intermediate_buffer"] is kw["runtime_additional_information"]
    assert [p["request_id"] for p in kw["model_intermediate_buffer"]] == IDS
    assert [p["_omni_is_prefill"] for p in kw["model_intermediate_buffer"]] == [False, True, True]
    assert kw["request_token_spans"] == [(0, 1), (1, 9), (9, 13)]
    assert state.omni_hooks.mtp_calls == {"dec": 1}  # the decode row only
    code0 = int(b.input_ids[0])
    assert state.omni_hooks.payloads.get("dec")["codes"]["audio"].tolist() == [
        [code0, *model.mtp(torch.zeros(1, H), torch.tensor([code0]))[0].tolist()]]
    # the next step writes the same buffer in place (what a FULL graph captured)
    kw2 = state.prepare_inputs(input_batch(padded=padded, seed=4), rs)
    assert kw2["inputs_embeds"].data_ptr() == buf.data_ptr()
    dummy = state.prepare_dummy_inputs(2, 8)
    assert dummy["inputs_embeds"].data_ptr() == buf.data_ptr() and dummy["inputs_embeds"].shape == (8, H)


@needs_vllm
def test_a_dummy_batch_gets_inputs_but_runs_no_request_hooks(vllm_config):
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    model = TinyTalker()
    state = make_state(vllm_config, model)
    rs = add_all(state, payloads())
    dummy = InputBatch.make_dummy(2, 6, InputBuffers(MAX_REQS, MAX_TOKENS, torch.device("cpu")))
    assert state.batch_view(dummy, rs) is None
    kw = state.prepare_inputs(dummy, rs)
    assert kw["inputs_embeds"].shape == (6, H) and state._pending is None
    model(**{"input_ids": None, "positions": None, **kw})
    sampler, _ = omni_sampler(state, greedy_inner())
    sampler(torch.randn(2, VOCAB), dummy)
    assert state.omni_hooks.rows.step == {} and state.omni_hooks.mtp_calls == {}
    # nothing is stored for the dummy's made-up ids (vLLM never removes them: each profile / warm-up run of a
    # V2 engine left entries behind, seen as empty payloads on the H200's v2-graphs run)
    assert sorted(state.omni_hooks.payloads.request_ids()) == sorted(IDS)


@needs_vllm
def test_the_embeds_overlay_is_bound_under_the_name_the_installed_vllm_calls(vllm_config, monkeypatch):
    """vLLM 0.32+ call ``prepare_inputs_embeds``, 0.26 ``get_mm_embeddings`` (same parameters): the state binds
    the omni overlay under whichever the installed ``DefaultModelState`` has (``MS_PREPARE_INPUTS_EMBEDS``)."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.runner import model_state as ms

    assert ms.model_state_cls(AR).prepare_inputs_embeds is ms.OmniModelStateMixin.omni_inputs_embeds
    calls = []

    def old_spelling(self, scheduled_encoder_inputs, input_batch, req_states):  # vLLM 0.26's name
        calls.append(scheduled_encoder_inputs)
        return torch.zeros(int(input_batch.num_tokens_after_padding), H)

    from vllm.v1.worker.gpu.model_states.interface import ModelState

    monkeypatch.delattr(DefaultModelState, "prepare_inputs_embeds")
    monkeypatch.delattr(ModelState, "prepare_inputs_embeds")
    monkeypatch.setattr(DefaultModelState, "get_mm_embeddings", old_spelling, raising=False)
    ms.omni_state_cls.cache_clear()
    try:
        cls = ms.model_state_cls(AR)
        assert cls.vllm_embeds_seam == "get_mm_embeddings" and "prepare_inputs_embeds" not in vars(cls)
        assert cls.get_mm_embeddings is ms.OmniModelStateMixin.omni_inputs_embeds
        model = TinyTalker()
        state = make_state(vllm_config, model)
        pl = payloads()
        for p in pl.values():  # vLLM-Omni's prompt-embeds overlay: a top-level prompt_embeds in the state
            p["prompt_embeds"] = p["thinker_hidden"] * 3.0
        rs = add_all(state, pl)
        b = input_batch(padded=16)
        emb = state.get_mm_embeddings({"enc": []}, b, rs)
        assert calls == [{"enc": []}]  # vLLM's own embeds first ...
        torch.testing.assert_close(emb[1:9], pl["mid"]["thinker_hidden"][4:12] * 3.0)  # ... then the omni overlay
    finally:
        ms.omni_state_cls.cache_clear()


@needs_vllm
def test_models_without_prompt_embeds_keep_vllms_input_ids_path(vllm_config):
    """A thinker-like model (no preprocess hook) gets no omni inputs_embeds:
    vLLM's input_ids path, the same compiled graphs as stock vLLM (a 4e-5
    logprob gap to stock vLLM was seen on the H200 when every model took embeds)."""

    class Thinker(TinyTalker):
        has_preprocess = False

    assert make_state(vllm_config, TinyTalker()).omni_inputs_embeds is not None
    state = make_state(vllm_config, Thinker())
    assert state.omni_inputs_embeds is None


# ---------------------------------------------------------- one call signature
def _presence(inputs: dict) -> tuple[bool, bool]:
    from core.model_io import call_signature

    return call_signature((), inputs)


@needs_vllm
@pytest.mark.parametrize("model_kind", ["preprocess", "thinker", "raw-tokens"])
def test_real_steps_dummy_runs_and_graph_captures_call_the_model_alike(vllm_config, model_kind):
    """The model inputs as vLLM's V2 runner composes them (``execute_model`` / ``_dummy_run``: ``input_ids``,
    ``inputs_embeds=None``, then ``prepare_inputs``; CUDA-graph capture: the input buffer's ``input_ids``, then
    ``prepare_dummy_inputs``) carry the same of ``input_ids`` / ``inputs_embeds`` on all three paths. vLLM
    compiles the model on its first call (the profile run) and drops the guards: on the H200 (2026-12-02) the
    talker's captures passed ``input_ids=None`` where its steps passed them, and its engine failed at every start
    from vLLM's AOT compile cache (``CUBLAS_STATUS_EXECUTION_FAILED`` in the loaded graph's first GEMM)."""
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    class Thinker(TinyTalker):
        has_preprocess = False

    class RawTokens(TinyTalker):
        requires_raw_input_tokens = True

    model = {"preprocess": TinyTalker, "thinker": Thinker, "raw-tokens": RawTokens}[model_kind]()
    state = make_state(vllm_config, model)
    rs = add_all(state, payloads() if model_kind != "thinker" else {r: {"voice": 1} for r in IDS})
    real_batch = input_batch(padded=16)
    real = {"input_ids": real_batch.input_ids, "inputs_embeds": None, **state.prepare_inputs(real_batch, rs)}
    bufs = InputBuffers(MAX_REQS, MAX_TOKENS, torch.device("cpu"))
    dummy_batch = InputBatch.make_dummy(2, 6, bufs)
    dummy = {"input_ids": dummy_batch.input_ids, "inputs_embeds": None, **state.prepare_inputs(dummy_batch, rs)}
    capture = {"input_ids": bufs.input_ids[:8], **state.prepare_dummy_inputs(2, 8)}
    expected = {"preprocess": (True, True), "thinker": (True, False), "raw-tokens": (True, True)}[model_kind]
    assert _presence(real) == _presence(dummy) == _presence(capture) == expected


@needs_vllm
def test_prompt_embeds_for_a_model_without_an_embeds_path_is_a_clear_error_not_a_new_signature(vllm_config):
    class Thinker(TinyTalker):
        has_preprocess = False

    state = make_state(vllm_config, Thinker())
    pl = {r: {"prompt_embeds": torch.randn(PROMPT[r], H)} for r in IDS}
    rs = add_all(state, pl)
    with pytest.raises(ValueError, match="brings prompt_embeds to Thinker.*preprocess hook.*enable_prompt_embeds"):
        state.prepare_inputs(input_batch(padded=16), rs)
