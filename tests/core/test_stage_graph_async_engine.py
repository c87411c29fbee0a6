"""The async engine factory (``core.stage.make_async_engine``): vLLM's ``AsyncLLM`` over the omni runner, its
multimodal outputs through ``AsyncLLM``'s per-request queue (issue 26).

One real tiny thinker engine (the demo model, cpu) for the module. ``AsyncLLM`` hands each output to a
``RequestOutputCollector`` that merges outputs the consumer has not taken yet; the multimodal outputs must
survive that merge (steps concatenated), equal what ``FINAL_ONLY`` gives, and be freed with the request.
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]

PROMPT = "Hello omni models"


@pytest.fixture(scope="module")
def thinker(loop, demo_dir, test_device):
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from core.pipeline.release import release_engine
    from core.stage import make_async_engine

    # built outside the loop (as StageGraph does): vLLM then starts its output tasks on the first request's loop
    eng = loop.run_until_complete(asyncio.to_thread(
        make_async_engine, os.path.join(demo_dir, "thinker"), device=test_device, dtype="float32", max_model_len=512,
        max_num_seqs=8, enforce_eager=True, seed=0))
    yield eng
    release_engine(eng, "thinker")
    loop.run_until_complete(asyncio.sleep(0.1))  # let the cancelled output tasks finish on their loop


def _params(kind_name: str, max_tokens: int = 12):
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=7,
                          output_kind=getattr(RequestOutputKind, kind_name))


async def _collect(eng, kind_name: str, rid: str, slow: bool = False) -> list:
    outs = []
    async for out in eng.generate(PROMPT, _params(kind_name), request_id=rid):
        outs.append(out)
        if slow and len(outs) == 1:  # take nothing more until the engine is done: vLLM merges the rest
            while rid in eng.output_processor.external_req_ids:
                await asyncio.sleep(0.01)
    return outs


@pytest.fixture(scope="module")
def final_only(loop, thinker):
    (out,) = loop.run_until_complete(_collect(thinker, "FINAL_ONLY", "final"))
    return out


def test_final_only_output_carries_every_steps_hidden_states(final_only):
    hidden = final_only.multimodal_outputs["hidden"]
    n = len(final_only.prompt_token_ids) + len(final_only.outputs[0].token_ids)
    # one row per token the thinker ran: the prompt, then every sampled token but the last (never fed back)
    assert hidden.shape == (n - 1, 128), hidden.shape
    assert len(final_only.outputs[0].token_ids) == 12


def test_delta_outputs_merged_by_a_slow_consumer_keep_every_step(loop, thinker, final_only):
    outs = loop.run_until_complete(_collect(thinker, "DELTA", "delta-slow", slow=True))
    assert max(len(o.outputs[0].token_ids) for o in outs) > 1, "no output was merged: the test proves nothing"
    tokens = [t for o in outs for t in o.outputs[0].token_ids]
    assert tokens == list(final_only.outputs[0].token_ids)  # same seed, same tokens
    hidden = torch.cat([o.multimodal_outputs["hidden"] for o in outs])
    assert torch.equal(hidden, final_only.multimodal_outputs["hidden"])
    assert outs[-1].finished


def test_delta_outputs_taken_one_by_one_concatenate_to_the_final(loop, thinker, final_only):
    outs = loop.run_until_complete(_collect(thinker, "DELTA", "delta-fast"))
    hidden = torch.cat([o.multimodal_outputs["hidden"] for o in outs])
    assert torch.equal(hidden, final_only.multimodal_outputs["hidden"])


def test_cumulative_outputs_hold_every_step_so_far(loop, thinker, final_only):
    outs = loop.run_until_complete(_collect(thinker, "CUMULATIVE", "cumulative"))
    rows = [o.multimodal_outputs["hidden"].shape[0] for o in outs]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)  # growing, one more step each time
    assert torch.equal(outs[-1].multimodal_outputs["hidden"], final_only.multimodal_outputs["hidden"])


def test_release_ends_the_engine_process(loop, demo_dir, test_device):
    """``release_engine`` takes an AsyncLLM: shut down, its engine-core process gone."""
    from core.pipeline.release import engine_core_processes, release_engine
    from core.stage import make_async_engine

    eng = make_async_engine(os.path.join(demo_dir, "code2wav"), kind="generation", device=test_device, dtype="float32",
                            max_model_len=1024, max_num_seqs=8, enforce_eager=True, skip_tokenizer_init=True)
    procs = engine_core_processes(eng)
    assert len(procs) == 1 and procs[0].is_alive()
    release_engine(eng, "code2wav")
    assert not procs[0].is_alive()


def test_closing_the_stream_aborts_the_request_and_frees_its_outputs(loop, thinker):
    async def take_one_then_close():
        gen = thinker.generate(PROMPT, _params("DELTA", max_tokens=200), request_id="closed")
        first = await gen.__anext__()
        held = "closed" in thinker.output_processor.external_req_ids
        await gen.aclose()  # what a client that goes away does: AsyncLLM.generate aborts the request
        return first, held

    first, held = loop.run_until_complete(take_one_then_close())
    assert held and first.multimodal_outputs["hidden"].shape[0] >= 1
    assert "closed" not in thinker.output_processor.external_req_ids
    assert not thinker.output_processor.request_states  # its state, and the steps it held, are gone


@pytest.mark.parametrize("kw, word", [
    ({"seed": -1}, "seed"), ({"max_model_len": 0}, "max_model_len"), ({"max_num_seqs": "8"}, "max_num_seqs"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
])
def test_the_async_factory_refuses_bad_arguments_as_make_engine_does(kw, word):
    from core.stage import make_async_engine, make_engine

    with pytest.raises(ValueError, match=word) as a:
        make_async_engine("/nowhere", **kw)
    with pytest.raises(ValueError, match=word) as b:
        make_engine("/nowhere", **kw)
    assert str(a.value) == str(b.value)


def test_the_async_factory_refuses_an_unknown_kind_and_an_empty_model():
    from core.stage import make_async_engine

    with pytest.raises(ValueError, match="kind must be one of"):
        make_async_engine("/nowhere", kind="video")
    with pytest.raises(ValueError, match="model must be a model path"):
        make_async_engine("  ")
