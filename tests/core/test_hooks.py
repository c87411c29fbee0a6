"""core.hooks without an engine: BatchView arithmetic under chunked prefill,
the RFC-005 hooks on the real cpu driver (``CpuBackend``), and the wrapping
of vLLM's real ``ModelRunnerOutput``.

Batch used throughout (rows in runner order, flattened tokens)::

    req   prompt  computed  scheduled  rows     this step
    dec     5       10         1       0..1    decode (past the prompt)
    mid    20        4         8       1..9    middle prefill chunk: prompt 4..12, no sample
    last   20       16         4       9..13   last prefill chunk: prompt 16..20, samples
    whole   3        0         3      13..16   whole prompt at once, samples
    resum   5        0         8      16..24   resumed after preemption: 5 prompt + 3 output tokens
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from core.hooks import BatchView, OmniHooks  # noqa: E402
from core.kinds import AR, GENERATION  # noqa: E402
from core.outputs import OmniModelRunnerOutput, OmniOutput, merge_step_outputs  # noqa: E402
from core.payloads import EXTRA_ARGS_KEY, pack  # noqa: E402

H = 4
IDS = ["dec", "mid", "last", "whole", "resum"]
PROMPT = [5, 20, 20, 3, 5]
COMPUTED = [10, 4, 16, 0, 0]
SCHEDULED = [1, 8, 4, 3, 8]
NUM_TOKENS = sum(SCHEDULED)  # 24


def batch(ids=IDS, prompt=PROMPT, computed=COMPUTED, scheduled=SCHEDULED) -> BatchView:
    return BatchView(
        req_ids=list(ids),
        query_start_loc=np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32),
        num_computed=np.array(computed, dtype=np.int32),
        num_prompt=np.array(prompt, dtype=np.int32),
    )


@pytest.fixture
def backend():
    from omni_backends.cpu.driver import CpuBackend

    probe = CpuBackend.probe()
    if not probe.usable:
        pytest.skip(f"the cpu driver is not usable here: {probe.reason}")
    return CpuBackend()


def sampling(max_tokens=8, payload=None):
    from vllm import SamplingParams

    extra = {EXTRA_ARGS_KEY: pack(payload)} if payload is not None else None
    return SamplingParams(max_tokens=max_tokens, extra_args=extra)


# ---------------------------------------------------------------- BatchView
def test_batch_view_spans_prefill_rows_and_sampling():
    b = batch()
    assert b.num_reqs == 5
    assert [b.span(i) for i in range(5)] == [(0, 1), (1, 9), (9, 13), (13, 16), (16, 24)]
    # (batch_start, prompt_offset, count)
    assert [b.prefill_rows(i) for i in range(5)] == [
        (0, 10, 0),  # decode: no prompt rows
        (1, 4, 8),  # prompt positions 4..12 at batch rows 1..9
        (9, 16, 4),  # prompt positions 16..20
        (13, 0, 3),
        (16, 0, 5),  # only the 5 prompt rows, not the 3 recomputed output tokens
    ]
    assert [b.samples(i) for i in range(5)] == [True, False, True, True, True]
    assert [b.completes_prefill(i) for i in range(5)] == [False, False, True, True, True]


def test_batch_view_chunk_ending_exactly_one_before_the_prompt_end_does_not_sample():
    b = batch(ids=["a", "b"], prompt=[9, 9], computed=[0, 0], scheduled=[8, 9])
    assert (b.samples(0), b.completes_prefill(0)) == (False, False)
    assert (b.samples(1), b.completes_prefill(1)) == (True, True)
    assert b.prefill_rows(1) == (8, 0, 9)


# ------------------------------------------------- on_new_requests / payloads
class _Preprocessing:
    device_resident_payload_keys = ("prompt_embeds",)

    def __init__(self):
        self.seen = []

    def omni_preprocess(self, payload):
        self.seen.append(sorted(payload))
        return {"prompt_embeds": payload["thinker_hidden"] * 2, "voice": payload.get("voice", 0) + 100}


def test_on_new_requests_unpacks_payloads_runs_preprocess_once_and_frees(backend):
    hooks = OmniHooks(backend)
    model = _Preprocessing()
    hooks.bind_model(model)
    th = torch.randn(3, H)
    hooks.on_new_requests([("a", sampling(payload={"thinker_hidden": th, "voice": 2}))])
    assert model.seen == [["thinker_hidden", "voice"]], "preprocess runs once per request, on the unpacked payload"
    a = hooks.payloads.get("a")
    assert torch.equal(a["prompt_embeds"], th * 2) and a["voice"] == 102
    assert torch.equal(a["thinker_hidden"], th)
    assert backend.is_device_tensor(a["prompt_embeds"])
    hooks._add("a", "x", torch.ones(1))
    hooks.mtp_calls["a"] = 3
    hooks.on_finished_requests(["a", "unknown"])
    assert "a" not in hooks.payloads and len(hooks.payloads) == 0
    assert "a" not in hooks._step_outputs and "a" not in hooks.mtp_calls


def test_request_without_payload_gets_an_empty_entry_without_preprocess(backend):
    hooks = OmniHooks(backend)

    class Model:
        pass

    hooks.bind_model(Model())
    hooks.on_new_requests([("b", sampling())])
    assert "b" in hooks.payloads and hooks.payloads.get("b") == {}
    hooks.on_finished_requests(["b"])
    assert len(hooks.payloads) == 0


def test_generation_kind_rejects_max_tokens_other_than_one(backend):
    hooks = OmniHooks(backend, GENERATION)
    hooks.bind_model(object())
    with pytest.raises(ValueError, match=r"request g1: .*SamplingParams\(max_tokens=1\), not max_tokens=16"):
        hooks.on_new_requests([("g1", sampling(max_tokens=16, payload={"codes": 1}))])
    assert "g1" not in hooks.payloads
    hooks.on_new_requests([("g2", sampling(max_tokens=1))])
    assert "g2" in hooks.payloads
    # the AR kind accepts any max_tokens
    ar = OmniHooks(backend, AR)
    ar.bind_model(object())
    ar.on_new_requests([("a", sampling(max_tokens=16))])


def test_unknown_runner_kind_is_refused(backend):
    with pytest.raises(ValueError, match="runner kind must be one of"):
        OmniHooks(backend, "talker")


# -------------------------------------------------- prepare_prefill_embeds
def _hooks_with_embeds(backend, rows: dict[str, int]):
    hooks = OmniHooks(backend)

    class Model:
        pass

    hooks.bind_model(Model())
    embeds = {}
    for i, r in enumerate(IDS):
        if r in rows:
            embeds[r] = torch.arange(rows[r] * H, dtype=torch.float32).reshape(rows[r], H) + 1000 * (i + 1)
            hooks.payloads.put(r, {"prompt_embeds": embeds[r]})
    return hooks, embeds


def test_prefill_embeds_overlay_only_prompt_rows(backend):
    # every request has prompt_embeds; the decode request's must not be used
    hooks, emb = _hooks_with_embeds(backend, {r: p for r, p in zip(IDS, PROMPT)})
    b = batch()
    assert hooks.needs_embeds(b)
    inputs = torch.full((NUM_TOKENS + 2, H), -7.0)  # padded like the runner's buffer
    hooks.prepare_prefill_embeds(b, inputs)
    expect = torch.full((NUM_TOKENS + 2, H), -7.0)
    expect[1:9] = emb["mid"][4:12]
    expect[9:13] = emb["last"][16:20]
    expect[13:16] = emb["whole"][0:3]
    expect[16:21] = emb["resum"][0:5]  # rows 21..24 are output tokens: untouched
    torch.testing.assert_close(inputs, expect, rtol=0, atol=0)


def test_prefill_embeds_cast_to_the_inputs_dtype_and_skip_requests_without_embeds(backend):
    hooks, emb = _hooks_with_embeds(backend, {"last": 20})
    inputs = torch.zeros(NUM_TOKENS, H, dtype=torch.bfloat16)
    hooks.prepare_prefill_embeds(batch(), inputs)
    assert inputs.dtype == torch.bfloat16
    assert torch.equal(inputs[9:13], emb["last"][16:20].to(torch.bfloat16))
    inputs[9:13] = 0
    assert not inputs.any()


def test_needs_embeds_is_false_when_no_request_with_embeds_has_prompt_rows(backend):
    hooks, _ = _hooks_with_embeds(backend, {"dec": 5})
    assert not hooks.needs_embeds(batch())
    hooks2, _ = _hooks_with_embeds(backend, {})
    assert not hooks2.needs_embeds(batch())


def test_too_short_prompt_embeds_is_a_clear_error(backend):
    hooks, _ = _hooks_with_embeds(backend, {"mid": 10})  # prompt has 20 tokens; this step needs rows 4..12
    with pytest.raises(ValueError, match=r"request mid: prompt_embeds has 10 rows but the prompt has 20 tokens; "
                                         r"pass one embedding row per prompt token"):
        hooks.prepare_prefill_embeds(batch(), torch.zeros(NUM_TOKENS, H))


# ------------------------------------------------------ build_extra_kwargs
def test_extra_kwargs_only_for_models_that_accept_them(backend):
    hooks = OmniHooks(backend)

    class Plain:
        pass

    class Accepting:
        accepts_omni_kwargs = True

    hooks.bind_model(Plain())
    assert hooks.build_extra_kwargs(batch()) == {}
    hooks.bind_model(Accepting())
    for i, r in enumerate(IDS):
        hooks.payloads.put(r, {"voice": i})
    kw = hooks.build_extra_kwargs(batch())
    assert [p["voice"] for p in kw["runtime_additional_information"]] == [0, 1, 2, 3, 4]
    assert kw["request_token_spans"] == [(0, 1), (1, 9), (9, 13), (13, 16), (16, 24)]


# --------------------------------------------------- process_model_output
class _Postprocessing:
    def omni_postprocess_request(self, hidden, payload):
        return {"wave": hidden.sum(-1) + payload.get("offset", 0)}


def test_process_model_output_slices_per_request_and_runs_postprocess(backend):
    hooks = OmniHooks(backend)
    hooks.bind_model(_Postprocessing())
    hooks.payloads.put("last", {"offset": 100})
    b = batch()
    hidden = torch.randn(NUM_TOKENS + 3, H)  # padded rows past num_tokens must be ignored
    per_token = torch.arange(NUM_TOKENS + 3, dtype=torch.float32)[:, None].repeat(1, 2)
    out = hooks.process_model_output(OmniOutput(hidden, {"hidden": per_token}), b)
    assert out is hidden
    step = hooks._step_outputs
    assert set(step) == set(IDS)
    for i, r in enumerate(IDS):
        s, e = b.span(i)
        assert torch.equal(step[r]["hidden"], per_token[s:e])
        expect_wave = hidden[s:e].sum(-1) + (100 if r == "last" else 0)
        torch.testing.assert_close(step[r]["wave"], expect_wave)
    # a plain tensor passes through; a second forward over the same positions emits nothing new
    # (positions are emitted once: see test_recomputed_positions_after_preemption_are_not_emitted_twice)
    before = step["mid"]["wave"].clone()
    assert hooks.process_model_output(hidden, b) is hidden
    assert torch.equal(step["mid"]["wave"], before)


def _runner_output(req_ids):
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(
        req_ids=list(req_ids),
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[10 + i] for i in range(len(req_ids))],
        num_nans_in_logits={r: 0 for r in req_ids},
        prompt_logprobs_dict={req_ids[0]: None},
    )


def test_get_model_runner_output_wraps_vllms_output_keeping_every_field(backend):
    from vllm.v1.outputs import ModelRunnerOutput

    hooks = OmniHooks(backend)
    hooks.bind_model(object())
    b = batch()
    hooks.process_model_output(OmniOutput(torch.zeros(NUM_TOKENS, H), {"h": torch.ones(NUM_TOKENS, 2)}), b)
    hooks._add("gone", "h", torch.ones(1, 2))  # a request not in this output (e.g. aborted meanwhile)
    base = _runner_output(IDS)
    out = hooks.get_model_runner_output(base)
    assert isinstance(out, OmniModelRunnerOutput) and isinstance(out, ModelRunnerOutput)
    for f in dataclasses.fields(ModelRunnerOutput):
        assert getattr(out, f.name) is getattr(base, f.name), f.name
    assert set(out.multimodal_outputs) == set(IDS)
    assert out.multimodal_outputs["mid"]["h"].shape == (8, 2)
    # the step's outputs are handed over once
    again = _runner_output(IDS)
    assert hooks.get_model_runner_output(again) is again


def test_get_model_runner_output_without_outputs_returns_vllms_object(backend):
    hooks = OmniHooks(backend)
    hooks.bind_model(object())
    base = _runner_output(["a"])
    assert hooks.get_model_runner_output(base) is base


# -------------------------------------------------------------- talker MTP
class _Talker:
    talker_mtp_output_key = "codes"

    def __init__(self):
        self.calls = []

    def talker_mtp(self, hidden, code0):
        self.calls.append((hidden.clone(), code0.clone()))
        return torch.stack([code0 * 10, code0 * 10 + 1], dim=-1)


def test_talker_mtp_runs_once_per_sampled_token_on_the_last_row(backend):
    hooks = OmniHooks(backend)
    model = _Talker()
    hooks.bind_model(model, vllm_config=None)
    assert hooks.mtp_mode == "eager"  # the cpu driver has no graphs
    b = batch()
    hidden = torch.arange(NUM_TOKENS, dtype=torch.float32)[:, None].repeat(1, H)
    sampled = torch.tensor([[5], [6], [7], [8], [9]], dtype=torch.int32)
    hooks.run_talker_mtp(hidden, sampled, b)
    ((h, c0),) = model.calls
    assert h[:, 0].tolist() == [0, 12, 15, 23]  # last scheduled row of dec, last, whole, resum ("mid" does not sample)
    assert c0.dtype == torch.int64 and c0.tolist() == [5, 7, 8, 9]
    assert hooks._step_outputs["last"]["codes"].tolist() == [[70, 71]]
    assert "mid" not in hooks._step_outputs
    hooks.run_talker_mtp(hidden, sampled, b)
    assert hooks.mtp_calls == {"dec": 2, "last": 2, "whole": 2, "resum": 2}
    assert hooks._step_outputs["dec"]["codes"].shape == (2, 2)


# --------------------------------------------------------- merge_step_outputs
def test_merge_step_outputs_concatenates_along_tokens():
    a, b, c = torch.randn(2, 3), torch.randn(1, 3), torch.randn(4)
    merged = merge_step_outputs([{"h": a, "w": c}, {"h": b}])
    assert torch.equal(merged["h"], torch.cat([a, b]))
    assert merged["w"] is c  # a single step is passed through, not copied
    assert merge_step_outputs([]) == {}


def test_omni_engine_core_output_appends_one_field_to_vllms():
    """OmniScheduler builds OmniEngineCoreOutput positionally from
    ``msgspec.structs.astuple(EngineCoreOutput)``: that needs vLLM's fields,
    in vLLM's order, followed by ours alone."""
    import msgspec
    from vllm.v1.engine import EngineCoreOutput

    from core.engine import OmniEngineCoreOutput

    base = [f.name for f in msgspec.structs.fields(EngineCoreOutput)]
    ours = [f.name for f in msgspec.structs.fields(OmniEngineCoreOutput)]
    assert ours == base + ["multimodal_outputs"]
    eco = EngineCoreOutput(request_id="r-1", new_token_ids=[5, 6], finish_reason=None, stop_reason="x")
    mm = {"hidden": torch.ones(2, 3)}
    out = OmniEngineCoreOutput(*msgspec.structs.astuple(eco), mm)
    assert msgspec.structs.astuple(out)[:-1] == msgspec.structs.astuple(eco)
    assert out.multimodal_outputs is mm and out.request_id == "r-1" and out.stop_reason == "x"


def test_recomputed_positions_after_preemption_are_not_emitted_twice():
    """vLLM recomputes a preempted request from position 0; the caller already has those rows."""
    import numpy as np
    import torch

    from core.hooks import BatchView, OmniHooks
    from core.outputs import OmniOutput
    from omni_backends.cpu.driver import CpuBackend

    hooks = OmniHooks(CpuBackend())
    hooks.model = object()
    hooks._model_postprocess = None

    def step(num_computed, n, prompt=4):
        h = torch.arange(num_computed, num_computed + n, dtype=torch.float32)[:, None].repeat(1, 2)
        batch = BatchView(["r"], np.array([0, n]), np.array([num_computed]), np.array([prompt]))
        hooks.process_model_output(OmniOutput(h, {"hidden": h}), batch)
        return hooks.take_step_outputs().get("r", {}).get("hidden")

    got = [step(0, 4), step(4, 1)]  # prefill 0..3, decode 4
    assert step(0, 5) is None  # preempted, recomputed 0..4: nothing new
    got.append(step(5, 1))  # decode 5
    rows = torch.cat(got)[:, 0].tolist()
    assert rows == [0, 1, 2, 3, 4, 5]
    hooks.on_finished_requests(["r"])
    assert "r" not in hooks._emitted


def test_a_model_taking_per_request_kwargs_gets_no_full_cuda_graphs(backend):
    """FULL graphs would freeze the capture's per-request kwargs (voice, payload rows) into every replay:
    bind_model lowers vLLM's graph mode to its piecewise part, before vLLM resolves it and captures."""
    import types

    from vllm.config import CUDAGraphMode

    class Accepting:
        accepts_omni_kwargs = True

    for given, want in [(CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.PIECEWISE), (CUDAGraphMode.FULL, CUDAGraphMode.NONE),
                        (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.NONE), (CUDAGraphMode.PIECEWISE, CUDAGraphMode.PIECEWISE),
                        (CUDAGraphMode.NONE, CUDAGraphMode.NONE)]:
        cfg = types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=given),
                                    model_config=types.SimpleNamespace(enforce_eager=False))
        OmniHooks(backend, AR).bind_model(Accepting(), vllm_config=cfg)
        assert cfg.compilation_config.cudagraph_mode == want, (given, cfg.compilation_config.cudagraph_mode)
    plain = types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE),
                                  model_config=types.SimpleNamespace(enforce_eager=False))
    OmniHooks(backend, AR).bind_model(object(), vllm_config=plain)
    assert plain.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE  # the thinker keeps FULL graphs


def test_talker_mtp_is_graph_wrapped_only_when_the_engine_runs_graphs(backend):
    """``--enforce-eager`` (or cudagraph_mode NONE) must run the MTP head eager too, so graph vs eager compares."""
    import dataclasses as dc
    import types

    from vllm.config import CUDAGraphMode

    class GraphBackend:  # the cpu driver, claiming talker-MTP graphs, recording wrap_graph
        name = "graphs"

        def __init__(self):
            self.wrapped = []

        def capabilities(self):
            return dc.replace(backend.capabilities(), static_graph_modes=("FULL",), talker_mtp_graph=True)

        def wrap_graph(self, fn, vllm_config, mode):
            self.wrapped.append(mode)
            return fn

        def __getattr__(self, name):
            return getattr(backend, name)

    class SafeTalker(_Talker):
        talker_mtp_graph_safe = True

    def cfg(eager, mode):
        return types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=mode),
                                     model_config=types.SimpleNamespace(enforce_eager=eager))

    for eager, mode, want in [(False, CUDAGraphMode.FULL_AND_PIECEWISE, "graph"), (True, CUDAGraphMode.NONE, "eager"),
                              (False, CUDAGraphMode.NONE, "eager"), (False, CUDAGraphMode.PIECEWISE, "graph")]:
        gb = GraphBackend()
        hooks = OmniHooks(gb)
        hooks.bind_model(SafeTalker(), vllm_config=cfg(eager, mode))
        assert hooks.mtp_mode == want, (eager, mode)
        assert gb.wrapped == ([CUDAGraphMode.FULL] if want == "graph" else [])
