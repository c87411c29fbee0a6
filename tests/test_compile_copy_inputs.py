"""vLLM's compiled-graph input copy (``compilation_config.cudagraph_copy_inputs``, which the core turns on for a model
that builds the embeddings its compiled decoder reads) with M-RoPE positions, as vLLM-Omni's Qwen3-TTS talker has.

vLLM's ``make_copy_and_call`` slices every input with a symbolic size along dim 0; positions ``[3, num_tokens]`` then
fail at the first graph capture (the H200, 2026-12-05: "The size of tensor a (2048) must match the size of tensor b
(128) at non-singleton dimension 1"). ``core.patches.compilation_config`` copies the inputs that vary in dim 0 only
and keep their strides in the copy, through vLLM's own wrapper, and passes the others as given. Real vLLM function,
cpu tensors (and inductor on the cpu for the stride fault, issue 44 item 4).
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


def test_positions_at_the_profile_runs_size_pass_as_given():
    """At the profile run (``num_tokens == max_num_tokens``, the compile-time example's size) the positions' trailing
    dims equal the buffer's, but the buffer is a contiguous clone (row stride ``max``) of the runner's view (row
    stride ``max + 1``): a copy would hand the compiled graph a tensor of other strides than it reads (issue 44
    item 4, the talker's start-time M-RoPE assert; :func:`test_a_compiled_graph_reads_the_positions_it_was_given`).
    They pass as given; the embeddings are still copied."""
    original = getattr(MAKE_COPY_AND_CALL.resolve(), "__wrapped__", MAKE_COPY_AND_CALL.resolve())
    buffers, log = _buffers(), []
    wrapper = copy_leading_dim_inputs(original)([0, 1], buffers, _called(log))
    runner_positions = torch.arange(3 * (MAX_TOKENS + 1), dtype=torch.int64).reshape(3, MAX_TOKENS + 1)
    for n in (MAX_TOKENS, 1, MAX_TOKENS):
        positions = runner_positions[:, :n]
        got_embeds, got_positions = wrapper(torch.ones(n, HIDDEN), positions)
        assert got_positions is positions and got_positions.stride() == (MAX_TOKENS + 1, 1)
        assert got_embeds.data_ptr() == buffers[0].data_ptr()
    assert torch.equal(buffers[1], torch.zeros(3, MAX_TOKENS, dtype=torch.int64))  # never written


def test_a_compiled_graph_reads_the_positions_it_was_given():
    """The fault end to end on the cpu, through inductor and vLLM's copy as vLLM 0.26 runs them on torch < 2.12
    (inductor's ``size_asserts`` off): a graph compiled at the profile run's size from the runner's positions view
    ``[3, max]`` of ``[3, max + 1]`` indexes a rotary cache with them. The core's copy wrapper must give it those
    positions, not a contiguous copy it reads with the old row stride (rows 1-2 shifted, the last two positions
    past the copy's end: ``index out of bounds`` on the H100 at some starts, issue 44 item 4)."""
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.symbolic_shapes import is_symbolic

    original = getattr(MAKE_COPY_AND_CALL.resolve(), "__wrapped__", MAKE_COPY_AND_CALL.resolve())
    cache = torch.randn(4 * MAX_TOKENS, HIDDEN)  # positions < MAX_TOKENS + 40 index it

    def backend(gm, example_inputs):  # VllmBackend's copy around an inductor-compiled graph
        compiled = compile_fx(gm, example_inputs, config_patches={
            "size_asserts": False, "alignment_asserts": False, "scalar_asserts": False})
        metas = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        sym = [i for i, x in enumerate(metas)
               if isinstance(x, FakeTensor) and any(is_symbolic(d) for d in x.size())]
        return copy_leading_dim_inputs(original)(sym, [example_inputs[i].clone() for i in sym], compiled)

    def rope_like(x, positions):
        return x * 2, cache[positions].sum(0)

    runner = torch.zeros(3, MAX_TOKENS + 1, dtype=torch.int64)
    runner[:, :MAX_TOKENS] = torch.arange(MAX_TOKENS) + torch.tensor([[0], [20], [40]])
    compiled = torch.compile(rope_like, backend=backend, fullgraph=True)
    torch._dynamo.reset()
    try:
        for n in (MAX_TOKENS, 5, MAX_TOKENS):  # the profile run first: it compiles
            x, positions = torch.ones(n, HIDDEN), runner[:, :n]
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(positions, 1)
            assert torch.equal(compiled(x, positions)[1], rope_like(x, positions)[1]), n
    finally:
        torch._dynamo.reset()


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
