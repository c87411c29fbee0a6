"""Issue 25: the step-major transport of multimodal outputs (``core.outputs.StepRows``).

A step's outputs travel runner -> scheduler -> front end as one :class:`~core.outputs.StepRows` per step (the
step's host tensors and each request's row range), carried by the step's first ``EngineCoreOutput``; the front
end logs the steps (:class:`~core.step_log.StepLog`) and slices a request's rows when its output is made.

Unit tests: vLLM's msgpack boundary, the scheduler's attach / hold / per-front-end split, the log. Engine test
(the demo thinker on cpu, a KV cache too small for the batch so vLLM preempts, chunked prefill): every output
kind gives each request the hidden states of the one-shot reference, with the front end's log folded every few
steps; and a multiprocess engine (outputs through vLLM's msgpack over ZMQ) gives the same tokens and rows.
"""

from __future__ import annotations

import os

import pytest
import torch

from core.outputs import StepRows
from core.step_log import StepLog

pytest.importorskip("vllm")


# --------------------------------------------------------------------------- units
def test_step_rows_cross_vllms_msgpack_boundary_on_the_first_output_only():
    """What the engine-core process sends (``MsgpackEncoder``) and the front end decodes
    (``attach_omni_frontend``'s ``MsgpackDecoder(OmniEngineCoreOutputs)``): the carrier's rows and items come
    back equal, large tensors (vLLM's out-of-band buffers) and small ones alike; other outputs carry none."""
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from core.engine import OmniEngineCoreOutput, OmniEngineCoreOutputs

    big, small = torch.randn(300, 128), torch.arange(6, dtype=torch.int64).reshape(3, 2)
    rows = [StepRows(["a", "b"], [0, 100], [100, 300], {"hidden": big, "codes": small}),
            StepRows(item_req_ids=["b"], item_names=["sr"], item_values=[torch.tensor(24000)])]
    outs = [OmniEngineCoreOutput(request_id="a", new_token_ids=[1], omni_rows=rows),
            EngineCoreOutput(request_id="b", new_token_ids=[2])]
    frames = MsgpackEncoder().encode(OmniEngineCoreOutputs(outputs=outs))
    got = MsgpackDecoder(OmniEngineCoreOutputs).decode(frames)
    first, second = got.outputs
    assert second.request_id == "b" and second.omni_rows is None
    (r0, r1) = first.omni_rows
    assert (r0.req_ids, r0.starts, r0.ends) == (["a", "b"], [0, 100], [100, 300])
    assert torch.equal(r0.tensors["hidden"], big) and torch.equal(r0.tensors["codes"], small)
    assert r1.item_req_ids == ["b"] and r1.item_names == ["sr"] and int(r1.item_values[0]) == 24000


class _StubScheduler:
    """The part of vLLM's ``Scheduler`` the omni mixin relies on: ``requests``, ``add_request``,
    ``update_from_output`` returning ``{client_index: EngineCoreOutputs}``."""

    def __init__(self) -> None:
        self.requests: dict = {}
        self.next_outputs: dict = {}

    def add_request(self, request) -> None:
        self.requests[request.request_id] = request

    def update_from_output(self, scheduler_output, model_runner_output):
        out, self.next_outputs = self.next_outputs, {}
        return out


class _Req:
    def __init__(self, request_id: str, client_index: int = 0) -> None:
        self.request_id, self.client_index = request_id, client_index


class _RunnerOut:
    def __init__(self, rows) -> None:
        self.omni_rows = rows


def _outputs(*ids):
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

    return EngineCoreOutputs(outputs=[EngineCoreOutput(request_id=r, new_token_ids=[0]) for r in ids])


def test_scheduler_attaches_each_steps_rows_once_and_holds_them_over_a_step_without_outputs():
    from core.engine import OmniEngineCoreOutput, omni_scheduler_cls

    sched = omni_scheduler_cls(_StubScheduler)()
    for r in ("a", "b"):
        sched.add_request(_Req(r))
    step1 = StepRows(["a", "b"], [0, 4], [4, 8], {"h": torch.zeros(8, 2)})
    assert sched.update_from_output(None, _RunnerOut([step1])) == {}  # chunked prefill: no output at all
    step2 = StepRows(["a", "b"], [0, 1], [1, 2], {"h": torch.ones(2, 2)})
    sched.next_outputs = {0: _outputs("a", "b")}
    (batch,) = sched.update_from_output(None, _RunnerOut([step2])).values()
    first, second = batch.outputs
    assert type(first) is OmniEngineCoreOutput and first.omni_rows == [step1, step2]  # held one first, in order
    assert type(second) is not OmniEngineCoreOutput  # nothing per request
    sched.next_outputs = {0: _outputs("b")}
    (batch,) = sched.update_from_output(None, _RunnerOut(None)).values()
    assert type(batch.outputs[0]) is not OmniEngineCoreOutput  # a step without rows adds nothing
    sched.requests.clear()  # every request gone: rows of a step without outputs are not kept
    sched.update_from_output(None, _RunnerOut([step2]))
    assert sched._omni_held == {}


def test_scheduler_gives_each_front_end_the_rows_of_its_own_requests():
    from core.engine import omni_scheduler_cls

    sched = omni_scheduler_cls(_StubScheduler)()
    sched.add_request(_Req("a", 0))
    sched.add_request(_Req("b", 1))
    sched.add_request(_Req("c", 1))
    h = torch.arange(6.0)[:, None]
    step = StepRows(["a", "b", "c"], [0, 2, 4], [2, 4, 6], {"h": h}, ["c"], ["sr"], [torch.tensor(1)])
    sched.next_outputs = {0: _outputs("a"), 1: _outputs("c")}
    result = sched.update_from_output(None, _RunnerOut([step]))
    (to0,), (to1,) = result[0].outputs[0].omni_rows, result[1].outputs[0].omni_rows
    assert (to0.req_ids, to0.starts, to0.ends, to0.item_req_ids) == (["a"], [0], [2], [])
    assert (to1.req_ids, to1.starts, to1.ends, to1.item_req_ids) == (["b", "c"], [2, 4], [4, 6], ["c"])
    assert to0.tensors["h"] is h and to1.tensors["h"] is h  # the step's tensor, not a copy per front end


def test_step_log_gathers_a_requests_rows_over_steps_and_refuses_cleared_steps():
    """The log holds each step's rows in its own slabs (the step's tensors are not kept): one step's rows are
    a view, several steps' one gather; per-request values come after them."""
    h1, h2 = torch.arange(5.0)[:, None], torch.arange(10.0, 12.0)[:, None]
    log = StepLog()
    log.extend([StepRows(["a", "b"], [0, 3], [3, 5], {"h": h1})])
    log.extend([StepRows(["b", "a"], [0, 1], [1, 2], {"h": h2}),
                StepRows(item_req_ids=["a", "a"], item_names=["w", "w"], item_values=[torch.ones(1), torch.zeros(2)])])
    log.extend([StepRows(["a"], [0], [1], {"h": torch.tensor([[20.0]])})])
    h1[:] = -1  # the log copied the rows: the producer's tensors may be reused
    (rows, items) = log.steps("a", 0)
    assert rows["h"][:, 0].tolist() == [0.0, 1.0, 2.0, 11.0, 20.0]
    assert items["w"].tolist() == [1.0, 0.0, 0.0]  # a name twice in a step: concatenated
    (one,) = log.steps("b", 1)
    assert one["h"][:, 0].tolist() == [10.0]
    again = log.steps("b", 1)[0]["h"]
    assert again.untyped_storage().data_ptr() == one["h"].untyped_storage().data_ptr()  # one step: a view of the slab
    assert log.steps("b", log.end) == [] and log.steps("unknown", 0) == []
    since = log.end
    log.clear()
    assert len(log) == 0 and log.end == since == 4  # positions count the StepRows logged
    with pytest.raises(ValueError, match="cleared before it read them"):
        log.steps("a", 1)


def test_runner_output_hands_the_step_over_step_major():
    """``get_model_runner_output``: the step's host tensor itself with each request's rows (no per-request
    view made), requests missing from vLLM's output left out; per request on reading ``multimodal_outputs``."""
    import numpy as np
    from vllm.v1.outputs import ModelRunnerOutput

    from core.hooks import BatchView, OmniHooks
    from core.outputs import OmniModelRunnerOutput, OmniOutput
    from omni_backends.cpu.driver import CpuBackend

    hooks = OmniHooks(CpuBackend())
    hooks.bind_model(object())
    h = torch.arange(6.0)[:, None].repeat(1, 2)
    batch = BatchView(["a", "b", "c"], np.array([0, 4, 5, 6]), np.array([0, 3, 9]), np.array([4, 3, 2]))
    hooks.process_model_output(OmniOutput(h, {"hidden": h}), batch)
    base = ModelRunnerOutput(req_ids=["a", "c"], req_id_to_index={"a": 0, "c": 1})
    out = hooks.get_model_runner_output(base)
    assert isinstance(out, OmniModelRunnerOutput)
    (rows,) = out.omni_rows
    assert (rows.req_ids, rows.starts, rows.ends) == (["a", "c"], [0, 5], [4, 6])
    assert torch.equal(rows.tensors["hidden"], h) and rows.tensors["hidden"] is not h  # one host copy of the step
    assert out.multimodal_outputs["c"]["hidden"][:, 0].tolist() == [5.0] and "b" not in out.multimodal_outputs


# --------------------------------------------------------------------------- engines
KINDS = ("FINAL_ONLY", "CUMULATIVE", "DELTA")
MAX_TOKENS = 40


def _prompts():
    import random

    rng = random.Random(3)
    return [[rng.randrange(2, 512) for _ in range(18 + 5 * i)] for i in range(6)]  # 18..43 tokens


def _engine(demo_dir: str, device: str):
    from core.stage import make_engine

    # 6 blocks of 32 tokens for 6 requests of up to 83 tokens: vLLM must preempt; 32 tokens a step: chunked prefill
    # (asked for: a driver whose generators cannot rewind has it off by default; these requests are greedy)
    return make_engine(os.path.join(demo_dir, "thinker"), device=device, dtype="float32", enforce_eager=True,
                       max_model_len=128, max_num_seqs=6, max_num_batched_tokens=32, block_size=32,
                       num_gpu_blocks_override=6, seed=0, enable_chunked_prefill=True)


def _run(llm) -> dict:
    """The six requests (two per output kind) as one batch; request id -> its outputs in order, as
    ``(token ids, hidden states)``."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from tests.core.engine_scenarios import pause_scheduler, resume_scheduler

    eng = llm.llm_engine
    pause_scheduler(llm)  # every request reaches the scheduler before the first step (multiprocess: no race)
    try:
        for i, p in enumerate(_prompts()):
            kind = KINDS[i % 3]
            params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0, detokenize=False,
                                    output_kind=RequestOutputKind[kind])
            eng.add_request(f"{kind}-{i}", {"prompt_token_ids": p}, params)
    finally:
        resume_scheduler(llm)
    outs: dict = {}
    while eng.has_unfinished_requests():
        for o in eng.step():  # as the caller sees it now (vLLM may extend a CUMULATIVE output's lists later)
            outs.setdefault(o.request_id, []).append((list(o.outputs[0].token_ids), o.multimodal_outputs["hidden"]))
    return outs


def _hidden_of(kind: str, outs: list, prompt_len: int) -> torch.Tensor:
    """The request's hidden states as its caller sees them in ``kind``, checking each output's rows."""
    for tokens, hidden in outs:  # rows = prompt + tokens so far - 1 (CUMULATIVE) / the new ones (DELTA)
        n, rows = len(tokens), hidden.shape[0]
        if kind == "CUMULATIVE":
            assert rows == prompt_len + n - 1, (kind, rows, n)
    if kind == "FINAL_ONLY":
        assert len(outs) == 1
    if kind == "DELTA":  # each output: one row per new token (the first: the prompt's rows, for its token)
        for j, (tokens, hidden) in enumerate(outs):
            assert hidden.shape[0] == len(tokens) + (prompt_len - 1 if j == 0 else 0), (j, hidden.shape, len(tokens))
        return torch.cat([h for _, h in outs])
    return outs[-1][1]


def _tokens_of(kind: str, outs: list) -> list[int]:
    return [t for tokens, _ in outs for t in tokens] if kind == "DELTA" else outs[-1][0]


@pytest.fixture(scope="module")
def preempted_runs(demo_dir, test_device):
    """The batch on an in-process engine, with the front end's log folded every 3 steps, counting vLLM's
    preemptions; then the same on a multiprocess engine."""
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    import core.engine as engine_mod
    from core.pipeline.release import release_engine

    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    mp.setattr(engine_mod, "STEP_LOG_STEPS", 3)
    try:
        llm = _engine(demo_dir, test_device)
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        preempted: list = []
        inner = sched._preempt_request
        sched._preempt_request = lambda request, *a, **k: (preempted.append(request.request_id), inner(request, *a, **k))[1]
        inproc = _run(llm)
        release_engine(llm, "thinker")
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        llm = _engine(demo_dir, test_device)
        multi = _run(llm)
        release_engine(llm, "thinker")
    finally:
        mp.undo()
    return {"inproc": inproc, "mp": multi, "preempted": preempted}


@pytest.mark.engine_tier
@pytest.mark.slow
def test_every_output_kind_gives_the_one_shot_hidden_states_across_preemption(preempted_runs, demo_dir):
    """FINAL_ONLY (one output), CUMULATIVE (every output: all rows so far), DELTA (the new rows; concatenated):
    each request's hidden states equal plain PyTorch's over its prompt and tokens, though vLLM preempted
    requests (recomputing rows the caller already had) and prefilled in chunks."""
    pytest.importorskip("transformers")
    from tests.core.precision import reference_settings, tolerance
    from tests.core.reference import reference_hidden

    outs = preempted_runs["inproc"]
    assert preempted_runs["preempted"], "the KV cache should be too small for the batch: vLLM preempts"
    prompts = _prompts()
    assert len(outs) == len(prompts)
    tol = tolerance("cpu", "float32", "hidden")
    with reference_settings("cpu"):
        expect_of = reference_hidden(os.path.join(demo_dir, "thinker"), "cpu")
        for i, p in enumerate(prompts):
            kind = KINDS[i % 3]
            mine = outs[f"{kind}-{i}"]
            tokens = _tokens_of(kind, mine)
            assert len(tokens) == MAX_TOKENS
            hidden = _hidden_of(kind, mine, len(p))
            assert hidden.shape == (len(p) + MAX_TOKENS - 1, 128), (kind, hidden.shape)
            torch.testing.assert_close(hidden, expect_of(p + tokens[:-1]), **tol)


@pytest.mark.engine_tier
@pytest.mark.slow
def test_a_multiprocess_engine_gives_the_same_outputs(preempted_runs):
    """The same batch with the engine core in its own process (the step's rows through vLLM's msgpack over
    ZMQ): the same tokens and the same rows per output; the hidden states to the fp32 tolerance (vLLM's
    multiprocess engine preempts a request at another step here -- the transport before the step-major one
    gave the same 1.7e-6 difference on the same rows, 2026-12-02)."""
    from tests.core.precision import tolerance

    a, b = preempted_runs["inproc"], preempted_runs["mp"]
    assert a.keys() == b.keys()
    for rid in a:
        kind = rid.split("-")[0]
        assert _tokens_of(kind, a[rid]) == _tokens_of(kind, b[rid]), rid
        assert [h.shape for _, h in a[rid]] == [h.shape for _, h in b[rid]], rid
        for (_, x), (_, y) in zip(a[rid], b[rid]):
            torch.testing.assert_close(x, y, **tolerance("cpu", "float32", "hidden"))
