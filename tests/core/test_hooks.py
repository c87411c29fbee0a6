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


def sampling(max_tokens=8, payload=None):
    from vllm import SamplingParams

    extra = {EXTRA_ARGS_KEY: pack(payload)} if payload is not None else None
    return SamplingParams(max_tokens=max_tokens, extra_args=extra)


# ---------------------------------------------------------------- BatchView
def test_batch_view_spans_and_prefill_rows():
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


def test_batch_view_prefill_rows_of_a_chunk_ending_one_before_the_prompt_end():
    b = batch(ids=["a", "b"], prompt=[9, 9], computed=[0, 0], scheduled=[8, 9])
    assert b.prefill_rows(0) == (0, 0, 8) and b.prefill_rows(1) == (8, 0, 9)


# ------------------------------------------------- on_new_requests / payloads
def test_on_new_requests_unpacks_state_and_seed_and_finish_frees_and_tells_the_model(cpu_backend):
    from core.hooks import MTP_SEED_KEY

    hooks = OmniHooks(cpu_backend)

    class Model:
        gpu_resident_buffer_keys = {("embed", "prefill")}
        finished: list = []

        def on_requests_finished(self, ids):
            self.finished.append(sorted(ids))

    model = Model()
    hooks.bind_model(model)
    th = torch.randn(3, H)
    params = sampling(payload={"text": ["hi"], "embed": {"prefill": th}, "voice": 2})
    params.extra_args[MTP_SEED_KEY] = 17
    hooks.on_new_requests([("a", params)])
    a = hooks.payloads.get("a")
    assert a["text"] == ["hi"] and a["voice"] == 2 and torch.equal(a["embed"]["prefill"], th)
    assert cpu_backend.is_device_tensor(a["embed"]["prefill"])
    assert hooks._mtp_seeds["a"] == 17
    hooks.rows.add_item("a", "x", torch.ones(1))
    hooks.mtp_calls["a"] = 3
    hooks.on_finished_requests(["a", "unknown"])
    assert "a" not in hooks.payloads and len(hooks.payloads) == 0
    assert "a" not in hooks.rows.step and "a" not in hooks.mtp_calls and "a" not in hooks._mtp_seeds
    assert model.finished == [["a", "unknown"]]


def test_request_without_payload_gets_an_empty_entry_without_preprocess(cpu_backend):
    hooks = OmniHooks(cpu_backend)

    class Model:
        pass

    hooks.bind_model(Model())
    hooks.on_new_requests([("b", sampling())])
    assert "b" in hooks.payloads and hooks.payloads.get("b") == {}
    hooks.on_finished_requests(["b"])
    assert len(hooks.payloads) == 0


def test_generation_kind_rejects_max_tokens_other_than_one(cpu_backend):
    hooks = OmniHooks(cpu_backend, GENERATION)
    hooks.bind_model(object())
    with pytest.raises(ValueError, match=r"request g1: .*SamplingParams\(max_tokens=1\), not max_tokens=16"):
        hooks.on_new_requests([("g1", sampling(max_tokens=16, payload={"codes": 1}))])
    assert "g1" not in hooks.payloads
    hooks.on_new_requests([("g2", sampling(max_tokens=1))])
    assert "g2" in hooks.payloads
    # the AR kind accepts any max_tokens
    ar = OmniHooks(cpu_backend, AR)
    ar.bind_model(object())
    ar.on_new_requests([("a", sampling(max_tokens=16))])


def test_unknown_runner_kind_is_refused(cpu_backend):
    with pytest.raises(ValueError, match="runner kind must be one of"):
        OmniHooks(cpu_backend, "talker")


# -------------------------------------------------- prepare_prefill_embeds
def _hooks_with_embeds(cpu_backend, rows: dict[str, int]):
    hooks = OmniHooks(cpu_backend)

    class Model:
        pass

    hooks.bind_model(Model())
    embeds = {}
    for i, r in enumerate(IDS):
        if r in rows:
            embeds[r] = torch.arange(rows[r] * H, dtype=torch.float32).reshape(rows[r], H) + 1000 * (i + 1)
            hooks.payloads.put(r, {"prompt_embeds": embeds[r]})
    return hooks, embeds


def test_prefill_embeds_overlay_only_prompt_rows(cpu_backend):
    # every request has prompt_embeds; the decode request's must not be used
    hooks, emb = _hooks_with_embeds(cpu_backend, {r: p for r, p in zip(IDS, PROMPT)})
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


def test_prefill_embeds_cast_to_the_inputs_dtype_and_skip_requests_without_embeds(cpu_backend):
    hooks, emb = _hooks_with_embeds(cpu_backend, {"last": 20})
    inputs = torch.zeros(NUM_TOKENS, H, dtype=torch.bfloat16)
    hooks.prepare_prefill_embeds(batch(), inputs)
    assert inputs.dtype == torch.bfloat16
    assert torch.equal(inputs[9:13], emb["last"][16:20].to(torch.bfloat16))
    inputs[9:13] = 0
    assert not inputs.any()


def test_needs_embeds_is_false_when_no_request_with_embeds_has_prompt_rows(cpu_backend):
    hooks, _ = _hooks_with_embeds(cpu_backend, {"dec": 5})
    assert not hooks.needs_embeds(batch())
    hooks2, _ = _hooks_with_embeds(cpu_backend, {})
    assert not hooks2.needs_embeds(batch())


def test_too_short_prompt_embeds_is_a_clear_error(cpu_backend):
    hooks, _ = _hooks_with_embeds(cpu_backend, {"mid": 10})  # prompt has 20 tokens; this step needs rows 4..12
    with pytest.raises(ValueError, match=r"request mid: prompt_embeds has 10 rows but the prompt has 20 tokens; "
                                         r"pass one embedding row per prompt token"):
        hooks.prepare_prefill_embeds(batch(), torch.zeros(NUM_TOKENS, H))


# ------------------------------------------------------ build_extra_kwargs
def test_extra_kwargs_are_vllm_omnis_restricted_to_what_the_forward_takes(cpu_backend):
    hooks = OmniHooks(cpu_backend)

    class Plain:
        def forward(self, input_ids, positions):
            pass

    class Accepting:
        def forward(self, input_ids, positions, **kwargs):
            pass

    hooks.bind_model(Plain())
    assert hooks.build_extra_kwargs(batch()) == {}
    hooks.bind_model(Accepting())
    for i, r in enumerate(IDS):
        hooks.payloads.put(r, {"voice": i})
    b = dataclasses.replace(batch(), num_output=np.array([5, 0, 0, 0, 3]))
    kw = hooks.build_extra_kwargs(b, sampler="S")
    assert kw["model_intermediate_buffer"] is kw["runtime_additional_information"]
    assert [p["voice"] for p in kw["model_intermediate_buffer"]] == [0, 1, 2, 3, 4]
    assert [p["generated_len"] for p in kw["model_intermediate_buffer"]] == [5, 0, 0, 0, 3]
    assert kw["model_intermediate_buffer"][0] is hooks.payloads.get("dec")  # the live state, not a copy
    assert kw["request_token_spans"] == [(0, 1), (1, 9), (9, 13), (13, 16), (16, 24)]
    assert kw["sampler"] == "S" and "seq_token_counts" not in kw
    gen = OmniHooks(cpu_backend, GENERATION)
    gen.bind_model(Accepting())
    kw = gen.build_extra_kwargs(batch())
    assert kw["seq_token_counts"] == [1, 8, 4, 3, 8] and kw["request_ids"] == IDS


class _StatefulGeneration:
    """A generation model keeping state per request id, as vLLM-Omni's Qwen3-TTS code2wav under async_chunk:
    its dummy-run state, told which request ids ended."""

    def __init__(self):
        self.ended = []

    def forward(self, input_ids, positions, **kwargs):
        pass

    def get_dummy_runtime_additional_information(self, num_reqs):
        return [{"meta": {"request_id": f"__dummy__{i}", "finished": True}} for i in range(num_reqs)]

    def on_requests_finished(self, ids):
        self.ended.append(sorted(ids))


def test_a_generation_request_naming_its_utterance_is_keyed_by_it_and_released_by_it(cpu_backend):
    """``request_ids``: a request whose state names a ``meta.request_id`` (the utterance its chunk requests share)
    is keyed by it, others by their own id; a dummy batch gets the model's own dummy state (and its ids);
    ``release_request_state`` tells the model the keys ended."""
    from core.payloads import with_state_key

    gen = OmniHooks(cpu_backend, GENERATION)
    model = _StatefulGeneration()
    gen.bind_model(model)
    params = with_state_key(sampling(1, payload={"codes": {"audio": torch.arange(4)}}), "utt-7")
    gen.on_new_requests([("dec", params), ("mid", sampling(1))])
    assert torch.equal(gen.payloads.get("dec")["codes"]["audio"], torch.arange(4))  # the payload kept, key added
    kw = gen.build_extra_kwargs(batch(ids=["dec", "mid"], prompt=[4, 4], computed=[0, 0], scheduled=[4, 4]))
    assert kw["request_ids"] == ["utt-7", "mid"]
    dummy = dataclasses.replace(batch(ids=["d0", "d1"], prompt=[1, 1], computed=[0, 0], scheduled=[1, 1]),
                                dummy=True)
    kw = gen.build_extra_kwargs(dummy)
    assert kw["request_ids"] == ["__dummy__0", "__dummy__1"] and kw["model_intermediate_buffer"][0]["meta"]["finished"]
    assert gen.release_request_state(["utt-7"]) == 1 and model.ended == [["utt-7"]]
    assert OmniHooks(cpu_backend, GENERATION).release_request_state(["x"]) == 0  # nothing bound: nothing told


# ------------------------------------------------------------ preprocess
class _Preprocessing:
    """vLLM-Omni's preprocess: rows = ids * 10 (+ the request's offset state); counts its steps."""

    has_preprocess = True

    def __init__(self):
        self.seen = []

    def preprocess(self, input_ids, input_embeds, **info):
        self.seen.append((info["request_id"], info["_omni_is_prefill"], info["_omni_num_computed_tokens"],
                          info["_omni_prompt_len"], tuple(input_embeds.shape)))
        steps = info.get("meta", {}).get("steps", 0)
        rows = input_ids.float()[:, None].repeat(1, H) * 10 + steps
        return input_ids + 1, rows, {"meta": {"steps": steps + 1}}


def test_preprocess_runs_every_step_for_every_request_and_replaces_its_rows(cpu_backend):
    hooks = OmniHooks(cpu_backend)
    model = _Preprocessing()
    hooks.bind_model(model)
    assert hooks.uses_preprocess and hooks.needs_embeds(batch())
    b = batch()
    ids = torch.arange(NUM_TOKENS)
    embeds = torch.full((NUM_TOKENS + 2, H), -7.0)  # padded like the runner's buffer
    hooks.preprocess(b, ids, embeds)
    assert [m[0] for m in model.seen] == IDS
    assert [m[1:4] for m in model.seen] == [(False, 10, 5), (True, 4, 20), (True, 16, 20), (True, 0, 3),
                                            (True, 0, 5)]
    assert [m[4][0] for m in model.seen] == SCHEDULED
    torch.testing.assert_close(embeds[:NUM_TOKENS], torch.arange(NUM_TOKENS).float()[:, None].repeat(1, H) * 10)
    assert (embeds[NUM_TOKENS:] == -7.0).all()  # padding rows untouched
    assert ids.tolist() == list(range(1, NUM_TOKENS + 1))  # the returned ids replace the rows too
    hooks.preprocess(b, torch.arange(NUM_TOKENS), embeds)  # the update was merged into the state
    assert embeds[0, 0].item() == 1.0 and hooks.payloads.get("mid")["meta"]["steps"] == 2


# --------------------------------------------------- process_model_output
class _Postprocessing:
    has_postprocess = True

    def __init__(self):
        self.mm = []

    def postprocess(self, hidden_states, multimodal_outputs=None, **info):
        self.mm.append(multimodal_outputs)
        return {"hidden_states": {"last": hidden_states[-1:]}, "meta": {"offset": info.get("offset", 0) + 1}}


def test_process_model_output_slices_per_request_and_merges_postprocess(cpu_backend):
    hooks = OmniHooks(cpu_backend)
    model = _Postprocessing()
    hooks.bind_model(model)
    hooks.payloads.put("last", {"offset": 100, "hidden_states": {"last": torch.zeros(1, H)}})
    b = batch()
    hidden = torch.randn(NUM_TOKENS + 3, H)  # padded rows past num_tokens must be ignored
    per_token = torch.arange(NUM_TOKENS + 3, dtype=torch.float32)[:, None].repeat(1, 2)
    waves = [torch.full((i + 1,), float(i)) for i in range(len(IDS))]  # a per-request list (code2wav-style)
    out = hooks.process_model_output(OmniOutput(hidden, {"hidden": per_token, "audio": {"wave": waves}}), b)
    assert out is hidden
    step = hooks.rows.step
    assert set(step) == set(IDS)
    for i, r in enumerate(IDS):
        s, e = b.span(i)
        assert torch.equal(step[r]["hidden"], per_token[s:e])
        assert torch.equal(step[r]["audio.wave"], waves[i])  # nested keys as category.qualifier
        torch.testing.assert_close(hooks.payloads.get(r)["hidden_states"]["last"], hidden[e - 1 : e])
    assert hooks.payloads.get("last")["meta"]["offset"] == 101
    assert model.mm[0]["hidden"] is per_token  # postprocess sees the step's multimodal outputs
    # a plain tensor passes through; a second forward over the same positions emits nothing new
    before = step["mid"]["hidden"].clone()
    assert hooks.process_model_output(hidden, b) is hidden
    assert torch.equal(step["mid"]["hidden"], before)


def test_vllm_omnis_output_namedtuple_and_make_omni_output_are_recognised(cpu_backend):
    from core.models.vllm_omni import load_module

    if load_module is None:  # pragma: no cover
        return
    hooks = OmniHooks(cpu_backend)

    class Made:
        def make_omni_output(self, out, **kwargs):
            self.kwargs = kwargs
            return OmniOutput(out * 2, {"codes": {"audio": torch.ones(out.shape[0], 3)}})

    model = Made()
    hooks.bind_model(model)
    b = batch()
    hidden = torch.ones(NUM_TOKENS, H)
    got = hooks.process_model_output(hidden, b, {"model_intermediate_buffer": []})
    assert torch.equal(got, hidden * 2) and model.kwargs == {"model_intermediate_buffer": []}
    assert hooks.rows.step["mid"]["codes.audio"].shape == (8, 3)
    # text_hidden_states=None (a code2wav-style model) is handed back as None
    hooks.bind_model(object())
    assert hooks.process_model_output(OmniOutput(None, {"model_outputs": [torch.ones(2)] * 5}), b) is None


def _runner_output(req_ids):
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(
        req_ids=list(req_ids),
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[10 + i] for i in range(len(req_ids))],
        num_nans_in_logits={r: 0 for r in req_ids},
        prompt_logprobs_dict={req_ids[0]: None},
    )


def test_get_model_runner_output_wraps_vllms_output_keeping_every_field(cpu_backend):
    from vllm.v1.outputs import ModelRunnerOutput

    hooks = OmniHooks(cpu_backend)
    hooks.bind_model(object())
    b = batch()
    hooks.process_model_output(OmniOutput(torch.zeros(NUM_TOKENS, H), {"h": torch.ones(NUM_TOKENS, 2)}), b)
    hooks.rows.add_item("gone", "h", torch.ones(1, 2))  # a request not in this output (e.g. aborted meanwhile)
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


def test_get_model_runner_output_without_outputs_returns_vllms_object(cpu_backend):
    hooks = OmniHooks(cpu_backend)
    hooks.bind_model(object())
    base = _runner_output(["a"])
    assert hooks.get_model_runner_output(base) is base


# -------------------------------------------------------------- talker MTP
class _Talker:
    """vLLM-Omni's talker shape: preprocess hands ``mtp_inputs`` on decode rows;
    ``talker_mtp`` (four inputs) returns (embeds, codes) before the forward."""

    has_preprocess = True
    talker_mtp_output_key = ("codes", "audio")
    talker_mtp_validity_key = ("meta", "frame_valid")
    mtp_hidden_size = H

    def __init__(self):
        self.calls = []

    def preprocess(self, input_ids, input_embeds, **info):
        update = {}
        if input_ids.shape[0] == 1 and not info["_omni_is_prefill"]:
            update["mtp_inputs"] = (torch.full((1, H), 2.0), torch.full((1, H), 3.0))
        return input_ids, torch.zeros(input_ids.shape[0], H), update

    def talker_mtp(self, input_ids, input_embeds, last_talker_hidden, text_step, **sampling):
        self.calls.append((input_ids.clone(), last_talker_hidden.clone(), text_step.clone(), sampling))
        codes = torch.stack([input_ids, input_ids * 10], dim=-1)
        return input_embeds + last_talker_hidden + text_step, codes


def test_talker_mtp_runs_before_the_forward_on_decode_rows_once_per_step(cpu_backend):
    from core.hooks import MTP_SEED_KEY

    hooks = OmniHooks(cpu_backend)
    model = _Talker()
    hooks.bind_model(model, vllm_config=None)
    assert hooks.mtp_mode == "eager" and hooks.talker_mtp.hidden_size == H  # the cpu driver has no graphs
    params = sampling(payload={"text": ["x"]})
    params.extra_args[MTP_SEED_KEY] = 5
    hooks.on_new_requests([("dec", params)])
    b = dataclasses.replace(batch(), req_ids=["dec", "mid", "last", "dec2", "resum"],
                            num_computed=np.array([10, 4, 16, 3, 0]), num_prompt=np.array([5, 20, 20, 3, 5]),
                            query_start_loc=np.array([0, 1, 9, 13, 14, 22]))
    ids = torch.arange(22)
    embeds = torch.zeros(22, H)
    hooks.preprocess(b, ids, embeds)
    ((mtp_ids, last, text, kw),) = model.calls  # one batched call, the decode rows only
    assert mtp_ids.tolist() == [0, 13] and (last == 2.0).all() and (text == 3.0).all()
    assert isinstance(kw["generators"][0], torch.Generator) and kw["generators"][1] is None  # per-row seeds
    assert (embeds[0] == 5.0).all() and (embeds[13] == 5.0).all() and not embeds[1:13].any()
    assert hooks.payloads.get("dec")["codes"]["audio"].tolist() == [[0, 0]]
    assert hooks.payloads.get("dec2")["codes"]["audio"].tolist() == [[13, 130]]
    assert hooks.payloads.get("dec2")["meta"]["frame_valid"].item() is True
    assert hooks.mtp_calls == {"dec": 1, "dec2": 1}
    hooks.preprocess(b, ids, embeds)
    assert hooks.mtp_calls == {"dec": 2, "dec2": 2}


def test_a_hook_with_a_wrong_signature_fails_at_bind_naming_it(cpu_backend):
    from core.hooks import ModelContractError

    class BadPre:
        has_preprocess = True

        def preprocess(self, input_ids, input_embeds):  # no **kwargs for the request's state
            pass

    class BadMTP:
        def talker_mtp(self, hidden, code0):  # the old two-input form
            pass

    class BadKey:
        talker_mtp_output_key = "residual_codes"

        def talker_mtp(self, a, b, c, d, **kw):
            pass

    class Ignored:
        some_unknown_attribute = object()  # unknown attributes are ignored
        has_preprocess = False

        def preprocess(self):  # not declared (has_preprocess False): not read
            pass

    hooks = OmniHooks(cpu_backend)
    with pytest.raises(ModelContractError, match=r"BadPre\.preprocess.*must accept \*\*kwargs"):
        hooks.bind_model(BadPre())
    with pytest.raises(ModelContractError, match=r"BadMTP\.talker_mtp.*takes 2 positional arguments, the core passes 4"):
        hooks.bind_model(BadMTP())
    with pytest.raises(ModelContractError, match=r"talker_mtp_output_key must be a \(category, qualifier\) pair"):
        hooks.bind_model(BadKey())
    hooks.bind_model(Ignored())
    assert not hooks.uses_preprocess


# --------------------------------------------------------- merge_step_outputs
def test_merge_step_outputs_concatenates_along_tokens():
    a, b, c = torch.randn(2, 3), torch.randn(1, 3), torch.randn(4)
    merged = merge_step_outputs([{"h": a, "w": c}, {"h": b}])
    assert torch.equal(merged["h"], torch.cat([a, b]))
    assert merged["w"] is c  # a single step is passed through, not copied
    assert merge_step_outputs([]) == {}


def test_step_accumulator_equals_merge_step_outputs_read_every_step_or_once():
    """The front end's accumulator: the same tensors as merging all steps, whether read after every step
    (CUMULATIVE outputs: only new rows are copied) or once at the end (FINAL_ONLY)."""
    from core.step_log import StepAccumulator

    g = torch.Generator().manual_seed(3)
    steps = [{"h": torch.randn(n, 3, generator=g), "rate": torch.tensor(float(n))} for n in (5, 1, 1, 2, 1, 1, 1)]
    steps[2]["once"] = torch.randn(4, generator=g)
    every, once = StepAccumulator(), StepAccumulator()
    handed = []
    for k, step in enumerate(steps):
        every.append(step)
        once.append(step)
        got = every.merged()
        want = merge_step_outputs(steps[: k + 1])
        assert set(got) == set(want)
        for key in want:
            assert torch.equal(got[key], want[key]), (k, key)
        handed.append(got["h"])
    final = once.merged()
    assert torch.equal(final["h"], merge_step_outputs(steps)["h"]) and final["rate"].item() == 1.0
    assert final["once"] is steps[2]["once"]  # a name seen once is passed through, not copied
    for k, view in enumerate(handed):  # a view handed out earlier keeps its rows
        assert torch.equal(view, merge_step_outputs(steps[: k + 1])["h"])
    some = StepAccumulator()  # read now and then: several steps folded into the grown buffer at once
    for k, step in enumerate(steps):
        some.append(step)
        if k in (0, 3, 6):
            assert torch.equal(some.merged()["h"], merge_step_outputs(steps[: k + 1])["h"]), k
    assert StepAccumulator().merged() == {}


def test_step_outputs_are_views_of_one_host_tensor_read_after_the_fence():
    """One host tensor per name per step; each request's output is a view of its rows (rows emitted
    before skipped), built on the first read, after the step's fences."""
    from core.outputs import StepOutputs

    host = torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 2)
    step, waited = StepOutputs(), []
    step.add_rows(["a", "b", "c", "d"], [4, 1, 0, 5], {"h": host}, skip=[1, 0, 0, 0])
    step.add_fence(lambda: waited.append(1))
    step.add_item("b", "wave", torch.ones(3))
    assert waited == []  # nothing read yet
    assert set(step) == {"a", "b", "d"} and waited == [1]  # "c" has no rows this step
    assert step["a"]["h"][:, 0].tolist() == [1.0, 2.0, 3.0] and step["b"]["h"][:, 0].tolist() == [4.0]
    assert step["d"]["h"][:, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert all(step[r]["h"].untyped_storage().data_ptr() == host.untyped_storage().data_ptr() for r in "abd")
    assert torch.equal(step["b"]["wave"], torch.ones(3)) and waited == [1]  # fenced once
    step.drop(["a"])
    assert "a" not in step and len(step) == 2
    assert StepOutputs() == {} and not StepOutputs()


def test_a_stock_vllm_model_needs_no_omni_hooks_on_either_runner():
    """``needs_omni_hooks``: V1 runs vLLM's steps untouched for a stock class (no adapter, no hooks), as V2
    keeps vLLM's ModelState; any part of the omni contract, or a forward that is not vLLM's, needs them."""
    from vllm.model_executor.models.llama import LlamaForCausalLM

    from core.hooks.contract import needs_omni_hooks
    from core.models.demo import OmniDemoThinker

    stock = LlamaForCausalLM.__new__(LlamaForCausalLM)
    omni = OmniDemoThinker.__new__(OmniDemoThinker)
    assert not needs_omni_hooks(stock, AR) and needs_omni_hooks(stock, GENERATION)
    assert needs_omni_hooks(omni, AR)


def test_omni_engine_core_output_appends_one_field_to_vllms():
    """OmniScheduler builds OmniEngineCoreOutput positionally from
    ``msgspec.structs.astuple(EngineCoreOutput)``: that needs vLLM's fields,
    in vLLM's order, followed by ours alone (the step-major rows)."""
    import msgspec
    from vllm.v1.engine import EngineCoreOutput

    from core.engine import OmniEngineCoreOutput
    from core.outputs import StepRows

    base = [f.name for f in msgspec.structs.fields(EngineCoreOutput)]
    ours = [f.name for f in msgspec.structs.fields(OmniEngineCoreOutput)]
    assert ours == base + ["omni_rows"]
    eco = EngineCoreOutput(request_id="r-1", new_token_ids=[5, 6], finish_reason=None, stop_reason="x")
    rows = [StepRows(["r-1"], [0], [2], {"hidden": torch.ones(2, 3)})]
    out = OmniEngineCoreOutput(*msgspec.structs.astuple(eco), rows)
    assert msgspec.structs.astuple(out)[:-1] == msgspec.structs.astuple(eco)
    assert out.omni_rows is rows and out.request_id == "r-1" and out.stop_reason == "x"


def test_recomputed_positions_after_preemption_are_not_emitted_twice():
    """vLLM recomputes a preempted request from position 0; the caller already has those rows."""
    import numpy as np
    import torch

    from core.hooks import BatchView, OmniHooks
    from core.outputs import OmniOutput
    from omni_backends.cpu.driver import CpuBackend

    hooks = OmniHooks(CpuBackend())
    hooks.bind_model(object())

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
    assert "r" not in hooks.rows.emitted


def test_a_model_taking_per_request_kwargs_gets_no_full_cuda_graphs(cpu_backend):
    """FULL graphs would freeze the capture's per-request kwargs (voice, payload rows) into every replay:
    bind_model lowers vLLM's graph mode to its piecewise part, before vLLM resolves it and captures."""
    import types

    from vllm.config import CUDAGraphMode

    class Accepting:  # its forward reads vLLM-Omni's per-request state
        def forward(self, input_ids, positions, model_intermediate_buffer=None, **kwargs):
            pass

    for given, want in [(CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.PIECEWISE), (CUDAGraphMode.FULL, CUDAGraphMode.NONE),
                        (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.NONE), (CUDAGraphMode.PIECEWISE, CUDAGraphMode.PIECEWISE),
                        (CUDAGraphMode.NONE, CUDAGraphMode.NONE)]:
        cfg = types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=given),
                                    model_config=types.SimpleNamespace(enforce_eager=False))
        OmniHooks(cpu_backend, AR).bind_model(Accepting(), vllm_config=cfg)
        assert cfg.compilation_config.cudagraph_mode == want, (given, cfg.compilation_config.cudagraph_mode)
    plain = types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE),
                                  model_config=types.SimpleNamespace(enforce_eager=False))
    OmniHooks(cpu_backend, AR).bind_model(object(), vllm_config=plain)
    assert plain.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE  # the thinker keeps FULL graphs


def test_talker_mtp_is_graph_wrapped_only_when_the_engine_runs_graphs(cpu_backend):
    """``--enforce-eager`` (or cudagraph_mode NONE) must run the MTP head eager too, so graph vs eager compares."""
    import dataclasses as dc
    import types

    from vllm.config import CUDAGraphMode

    class GraphBackend:  # the cpu driver, claiming talker-MTP graphs, recording wrap_graph
        name = "graphs"

        def __init__(self):
            self.wrapped = []

        def capabilities(self):
            return dc.replace(cpu_backend.capabilities(), static_graph_modes=("FULL",), talker_mtp_graph=True)

        def wrap_graph(self, fn, vllm_config, mode):
            self.wrapped.append(mode)
            return fn

        def __getattr__(self, name):
            return getattr(cpu_backend, name)

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


def test_finished_requests_keep_a_bounded_record_of_their_talker_mtp_calls(cpu_backend):
    """A multiprocess engine's MTP calls per request stay readable after the request finished (the worker's
    ``omni_state``), for the last ``FINISHED_MTP_RECORD`` requests only: a server keeps no growing state."""
    from core.hooks.omni_hooks import FINISHED_MTP_RECORD

    hooks = OmniHooks(cpu_backend)
    n = FINISHED_MTP_RECORD + 10
    for i in range(n):
        hooks.mtp_calls[f"r{i}"] = i % 7 + 1
    hooks.on_finished_requests([f"r{i}" for i in range(n)])
    assert hooks.mtp_calls == {}
    assert len(hooks.mtp_calls_finished) == FINISHED_MTP_RECORD
    assert "r0" not in hooks.mtp_calls_finished and hooks.mtp_calls_finished[f"r{n - 1}"] == (n - 1) % 7 + 1


def test_step_fences_reuse_a_few_events_in_turn_and_a_driver_without_events_synchronizes():
    """The hooks fence each step's device-to-host copies with an event: made once (``FENCE_EVENTS`` of
    them) and recorded in turn, not one new event per step; a step's wait is the event it recorded. A driver
    that declares no events (``Capabilities.events`` False) gets ``Backend.synchronize``; its ``new_event`` is
    never called and its capabilities are read once."""
    from core.hooks import OmniHooks
    from core.hooks.step_rows import FENCE_EVENTS
    from omni_backends.backend import Capabilities

    class Event:
        def __init__(self) -> None:
            self.records = 0

        def record(self) -> None:
            self.records += 1

        def synchronize(self) -> None:
            pass

    class Backend:
        made: list = []
        asked = 0
        caps = Capabilities(events=True)

        def capabilities(self) -> Capabilities:
            self.asked += 1
            return self.caps

        def new_event(self, enable_timing: bool = False) -> Event:
            self.made.append(Event())
            return self.made[-1]

        def synchronize(self) -> None:
            pass

    backend = Backend()
    hooks = OmniHooks(backend, "ar")
    waits = [hooks.rows.record_fence() for _ in range(3 * FENCE_EVENTS + 1)]
    assert len(backend.made) == FENCE_EVENTS  # before: one new event per step
    assert [w.__self__ for w in waits] == [backend.made[i % FENCE_EVENTS] for i in range(len(waits))]
    assert [e.records for e in backend.made] == [4] + [3] * (FENCE_EVENTS - 1)

    class NoEvents(Backend):
        caps = Capabilities(events=False)

        def new_event(self, enable_timing: bool = False) -> Event:
            raise AssertionError("new_event called on a driver that declares no events")

    bare = NoEvents()
    hooks = OmniHooks(bare, "ar")
    assert all(hooks.rows.record_fence() == bare.synchronize for _ in range(3)) and bare.asked == 1
