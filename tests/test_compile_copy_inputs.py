"""vLLM's compiled-graph input copy (``compilation_config.cudagraph_copy_inputs``, which the core turns on for a model
that builds the embeddings its compiled decoder reads) with M-RoPE positions, as vLLM-Omni's Qwen3-TTS talker has.

vLLM's ``make_copy_and_call`` slices every input with a symbolic size along dim 0; positions ``[3, num_tokens]`` then
fail at the first graph capture (the H200, 2026-12-05: "The size of tensor a (2048) must match the size of tensor b
(128) at non-singleton dimension 1"). ``core.patches.compilation_config`` copies the inputs that vary in dim 0 only,
through vLLM's own wrapper, and passes the others as given. Real vLLM function, cpu tensors.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
backends = pytest.importorskip("vllm.compilation.backends")

from core.patches.compilation_config import MAKE_COPY_AND_CALL, copy_leading_dim_inputs  # noqa: E402

MAX_TOKENS, HIDDEN = 16, 4


def _buffers():
    """What ``VllmBackend`` hands the factory: clones of the compile-time example inputs (the largest size)."""
    embeds = torch.zeros(MAX_TOKENS, HIDDEN)
    positions = torch.zeros(3, MAX_TOKENS + 1, dtype=torch.int64)[:, :MAX_TOKENS]  # vLLM's non-contiguous view
    return [embeds.clone(), positions.clone()]


def _called(log):
    def callable_fn(*args):
        log.append(args)
        return args
    return callable_fn


def test_vllms_own_copy_fails_on_mrope_positions():
    """The fault, on this vLLM: the reason the patch exists (if vLLM slices each input's own dim, drop the patch)."""
    original = getattr(MAKE_COPY_AND_CALL.resolve(), "__wrapped__", MAKE_COPY_AND_CALL.resolve())
    wrapper = original([0, 1], _buffers(), _called([]))
    with pytest.raises(RuntimeError, match="must match the size"):
        wrapper(torch.ones(8, HIDDEN), torch.zeros(3, 8, dtype=torch.int64))


def test_embeddings_are_copied_into_the_static_buffer_and_positions_pass_as_given():
    original = getattr(MAKE_COPY_AND_CALL.resolve(), "__wrapped__", MAKE_COPY_AND_CALL.resolve())
    buffers, log = _buffers(), []
    wrapper = copy_leading_dim_inputs(original)([0, 1], buffers, _called(log))
    for n in (8, 3, 8):
        embeds = torch.full((n, HIDDEN), float(n))
        positions = torch.arange(3 * n, dtype=torch.int64).reshape(3, n)
        got_embeds, got_positions = wrapper(embeds, positions)
        assert got_embeds.data_ptr() == buffers[0].data_ptr() and got_embeds.shape == (n, HIDDEN)
        assert torch.equal(got_embeds, embeds) and got_positions is positions
    assert len(log) == 3


def test_inputs_varying_in_dim_0_only_keep_vllms_copy_of_every_input():
    original = getattr(MAKE_COPY_AND_CALL.resolve(), "__wrapped__", MAKE_COPY_AND_CALL.resolve())
    buffers = [torch.zeros(MAX_TOKENS, HIDDEN), torch.zeros(MAX_TOKENS, dtype=torch.int64)]
    wrapper = copy_leading_dim_inputs(original)([0, 1], buffers, _called([]))
    got_embeds, got_ids = wrapper(torch.ones(5, HIDDEN), torch.arange(5))
    assert got_embeds.data_ptr() == buffers[0].data_ptr() and got_ids.data_ptr() == buffers[1].data_ptr()
    assert torch.equal(got_ids, torch.arange(5))


def test_enable_copy_inputs_installs_the_wrapper_once():
    from types import SimpleNamespace

    from core.patches.compilation_config import enable_copy_inputs

    before = backends.make_copy_and_call
    try:
        cc = SimpleNamespace(cudagraph_copy_inputs=False)
        enable_copy_inputs(cc)
        first = backends.make_copy_and_call
        enable_copy_inputs(cc)
        assert cc.cudagraph_copy_inputs is True and backends.make_copy_and_call is first
        assert first.__wrapped__ is getattr(before, "__wrapped__", before)
    finally:
        backends.make_copy_and_call = before
