"""Seeded requests whose prompts together exceed a step's token budget.

vLLM's V1 model runner rewinds a seeded request's ``torch.Generator`` (``set_offset(get_offset() - 4)``, in
``GPUModelRunner._bookkeeping_sync``) when the token sampled for it is discarded -- a prefill split over steps
(chunked prefill). A generator without offsets (a CPU one: ``RuntimeError: CPU Generator does not use offset``)
killed the engine core there. A driver declares its generators (``Capabilities.generator_offsets``); where they
cannot rewind, the engine factory turns vLLM's chunked prefill off unless the caller chose it
(:func:`core.stage.engine_defaults`), so a prompt waits for a step with room instead of being split.

Unit tests: the defaults per capability. Engine test (the demo thinker on ``--device``): four seeded sampled
requests whose prompts need two steps' budget all finish, each giving what the same seed gives alone.
"""

from __future__ import annotations

import os
import types

import pytest

from omni_backends.backend import Capabilities


def _backend(**caps) -> types.SimpleNamespace:
    return types.SimpleNamespace(name="dev", capabilities=lambda: Capabilities(**caps))


# --------------------------------------------------------------------------- units
def test_a_driver_whose_generators_cannot_rewind_gets_vllms_chunked_prefill_off():
    from core.stage import engine_defaults

    assert engine_defaults(_backend(generator_offsets=False), {}) == {"enable_chunked_prefill": False}


def test_a_driver_whose_generators_rewind_keeps_vllms_own_default():
    from core.stage import engine_defaults

    assert engine_defaults(_backend(generator_offsets=True), {}) == {}
    assert Capabilities().generator_offsets is True  # vLLM's runner assumes offsets (CUDA's Philox generators)


def test_the_callers_chunked_prefill_choice_is_kept():
    from core.stage import engine_defaults

    for choice in (True, False):
        assert engine_defaults(_backend(generator_offsets=False), {"enable_chunked_prefill": choice}) == {}


def test_the_cpu_driver_declares_generators_without_offsets():
    """What the driver declares is what torch's CPU generator does."""
    import torch

    from omni_backends.cpu.driver import CpuBackend

    with pytest.raises(RuntimeError, match="offset"):
        torch.Generator().get_offset()  # a generator on torch's default device, the CPU
    assert CpuBackend().capabilities().generator_offsets is False


# --------------------------------------------------------------------------- engine
PROMPT_LEN, MAX_MODEL_LEN, MAX_TOKENS = 40, 64, 6


def _prompts() -> list[list[int]]:
    import random

    rng = random.Random(5)
    return [[rng.randrange(2, 512) for _ in range(PROMPT_LEN)] for _ in range(4)]


@pytest.mark.engine_tier
def test_seeded_requests_over_one_steps_budget_all_finish(demo_dir, test_device, monkeypatch):
    """Four seeded, sampled requests of 40 tokens in one batch, 64 tokens a step: with vLLM's chunked prefill
    the second prompt would be split (its sampled token discarded, its generator rewound). Every request
    finishes with its tokens, and a seed gives the same tokens in the batch as alone."""
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    from vllm import SamplingParams

    from core.pipeline.release import release_engine
    from core.stage import make_engine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = make_engine(os.path.join(demo_dir, "thinker"), device=test_device, dtype="float32", enforce_eager=True,
                      max_model_len=MAX_MODEL_LEN, max_num_seqs=4, max_num_batched_tokens=MAX_MODEL_LEN, seed=0)
    try:
        params = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=1.0, seed=100 + i,
                                 detokenize=False) for i in range(4)]
        prompts = [{"prompt_token_ids": p} for p in _prompts()]
        batch = llm.generate(prompts, params, use_tqdm=False)
        alone = llm.generate(prompts[3:], params[3:], use_tqdm=False)
    finally:
        release_engine(llm, "thinker")
    tokens = [list(o.outputs[0].token_ids) for o in batch]
    assert [len(t) for t in tokens] == [MAX_TOKENS] * 4, tokens
    assert tokens[3] == list(alone[0].outputs[0].token_ids)
