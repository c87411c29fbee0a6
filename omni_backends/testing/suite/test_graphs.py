"""Static graph capture/replay correctness (device tier; only for drivers that claim static graphs)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from omni_backends.testing.kit import ContractViolation, expect

pytestmark = pytest.mark.device_tier


@pytest.fixture
def graphs(backend, capabilities):
    if not capabilities.static_graphs:
        pytest.skip(f"driver {backend.name!r} declares no static graph modes (capabilities().static_graph_modes == ()); "
                    "graph capture/replay does not apply")
    return backend


def _forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x * w
    h.add_(1.0)
    return torch.relu(h).cumsum(0)


def test_replay_recomputes_from_persistent_inputs(graphs):
    backend = graphs
    dev = backend.device()
    x = torch.linspace(-4, 4, 64, device=dev)
    w = torch.full((64,), 2.0, device=dev)
    first = _forward(x, w)  # warm-up outside the capture, as vLLM does
    backend.synchronize()
    graph = backend.new_graph()
    with backend.graph_capture(graph):
        y = _forward(x, w)
    graph.replay()
    backend.synchronize()
    expect(torch.allclose(backend.to_host(y), backend.to_host(first)), "graph-replay",
           "the first replay's output differs from the eager result of the captured work")
    captured = backend.to_host(y).clone()
    for step in (1, 2, 3):
        x.copy_(torch.linspace(-4, 4, 64) * (step + 1) + step)  # in place: the address stays
        graph.replay()
        backend.synchronize()
        got = backend.to_host(y)
        want = backend.to_host(_forward(x, w))
        stale = torch.equal(got, captured) and not torch.equal(want, captured)
        expect(not stale, "graph-replay",
               f"replay {step} after updating the persistent input in place left the captured output stale "
               "(it still holds the values from capture)")
        expect(torch.allclose(got, want), "graph-replay",
               f"replay {step} output differs from the eager result on the same inputs "
               f"(max abs diff {float((got - want).abs().max()):.3g})")


def test_graphs_share_a_pool(graphs):
    backend = graphs
    dev = backend.device()
    x = torch.arange(32, dtype=torch.float32, device=dev)
    pool = backend.graph_pool_handle()
    g1, g2 = backend.new_graph(), backend.new_graph()
    y1 = x + 1
    y2 = y1 * 2
    backend.synchronize()
    with backend.graph_capture(g1, pool=pool):
        y1 = x + 1
    with backend.graph_capture(g2, pool=pool):
        y2 = y1 * 2
    x.copy_(torch.arange(32, dtype=torch.float32) * 5)
    g1.replay()
    g2.replay()
    backend.synchronize()
    want = (torch.arange(32, dtype=torch.float32) * 5 + 1) * 2
    expect(torch.equal(backend.to_host(y2), want), "graph-replay",
           "two graphs captured into one pool and replayed in capture order gave the wrong result")


def _host_randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _warm_up(backend, fn, *args) -> None:
    """Run ``fn`` once on a side stream, as torch asks before a capture (lazy initialisations, such as a
    matmul library's handle, then happen outside the graph)."""
    side = backend.new_stream()
    side.wait_stream(backend.current_stream())
    with backend.stream_context(side):
        fn(*args)
    backend.current_stream().wait_stream(side)
    backend.synchronize()


def test_every_capture_size_replays_in_one_pool(graphs):
    """One graph per capture size of a max batch of 20 (``capture_sizes(20)``), all captured into one pool, as
    vLLM captures them; replayed in capture order, each computes its own batch from new persistent-input values."""
    from omni_backends.backend import capture_sizes

    backend = graphs
    dev = backend.device()
    w = _host_randn(256, 256, seed=1).to(dev) / 16
    pool = backend.graph_pool_handle()
    captured = {}
    for bs in capture_sizes(20):
        x = torch.zeros(bs, 256, device=dev)
        _warm_up(backend, lambda t: torch.relu(t @ w), x)
        graph = backend.new_graph()
        with backend.graph_capture(graph, pool=pool):
            y = torch.relu(x @ w)
        captured[bs] = (graph, x, y)
    for bs, (graph, x, y) in captured.items():  # capture order: the rule for graphs sharing a pool
        new = _host_randn(bs, 256, seed=bs)
        x.copy_(new.to(dev))
        graph.replay()
        backend.synchronize()
        got, want = backend.to_host(y), torch.relu(new @ backend.to_host(w))
        expect(tuple(got.shape) == (bs, 256) and torch.allclose(got, want, rtol=1e-4, atol=1e-4), "graph-replay",
               f"the graph of capture size {bs} (one pool with sizes {list(captured)}) replayed a wrong result "
               f"(max abs diff {float((got - want).abs().max()):.3g})")


def test_capture_on_a_driver_stream(graphs):
    """``graph_capture(graph, stream=...)`` accepts the stream ``new_stream()`` returns; the graph replays on the
    current stream."""
    backend = graphs
    dev = backend.device()
    x, w = _host_randn(8, 256, seed=2).to(dev), _host_randn(256, 256, seed=3).to(dev) / 16
    side = backend.new_stream()
    side.wait_stream(backend.current_stream())
    with backend.stream_context(side):
        torch.relu(x @ w)  # warm-up on the capture's stream
    backend.current_stream().wait_stream(side)
    graph = backend.new_graph()
    with backend.graph_capture(graph, stream=side):
        out = torch.relu(x @ w)
    x.copy_(_host_randn(8, 256, seed=4).to(dev))
    graph.replay()
    backend.synchronize()
    got, want = backend.to_host(out), backend.to_host(torch.relu(x @ w))
    expect(torch.allclose(got, want, rtol=1e-4, atol=1e-4), "graph-replay",
           "a graph captured on a new_stream() stream and replayed on the current stream gave a wrong result "
           f"(max abs diff {float((got - want).abs().max()):.3g})")


def test_without_static_graphs_new_graph_refuses(backend, capabilities):
    if capabilities.static_graphs:
        pytest.skip(f"driver {backend.name!r} has static graphs {capabilities.static_graph_modes}")
    with pytest.raises(NotImplementedError):
        backend.new_graph()


def _runtime_modes(capabilities) -> list:
    """The ``CUDAGraphMode`` runtime modes (``PIECEWISE`` / ``FULL``) the declared ``static_graph_modes`` use:
    ``FULL_AND_PIECEWISE`` runs both, ``FULL_DECODE_ONLY`` runs ``FULL``."""
    from vllm.config import CUDAGraphMode

    out = []
    for name in capabilities.static_graph_modes:
        mode = CUDAGraphMode[name]
        for runtime in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            if runtime not in out and runtime in _uses(mode, CUDAGraphMode):
                out.append(runtime)
    return out


def _uses(mode, CUDAGraphMode) -> set:
    uses = set()
    if mode.has_full_cudagraphs():
        uses.add(CUDAGraphMode.FULL)
    if mode.has_piecewise_cudagraphs():
        uses.add(CUDAGraphMode.PIECEWISE)
    return uses


def _wrap(backend, runnable, cfg, mode):
    """``backend.wrap_graph(...)``; any error names the graph-wrapping contract."""
    try:
        return backend.wrap_graph(runnable, cfg, mode)
    except Exception as exc:
        raise ContractViolation("graph-wrapping", f"wrap_graph(runnable, vllm_config, {mode.name}) raised "
                                f"{type(exc).__name__}: {exc}") from exc


def _vllm_config():
    from omni_backends.testing.kit import vllm_missing_reason

    missing = vllm_missing_reason()
    if missing:
        pytest.skip(f"{missing}; wrap_graph takes vLLM's VllmConfig and CUDAGraphMode")
    from vllm.config import VllmConfig

    return VllmConfig()


def test_wrap_graph_runs_eagerly_outside_a_graph_mode(backend, capabilities):
    """``wrap_graph`` returns a callable computing the same as the runnable when no
    forward context is set and in mode NONE (drivers without graphs: the runnable itself)."""
    cfg = _vllm_config()
    from vllm.config import CUDAGraphMode

    dev = backend.device()
    w = torch.full((16,), 3.0, device=dev)

    def runnable(x):
        return _forward(x, w)

    for mode in _runtime_modes(capabilities) or [CUDAGraphMode.FULL]:
        wrapped = _wrap(backend, runnable, cfg, mode)
        if not capabilities.static_graphs:
            expect(wrapped is runnable, "graph-wrapping",
                   "wrap_graph() without static graphs must return the runnable itself")
        x = torch.linspace(-2, 2, 16, device=dev)
        expect(torch.equal(backend.to_host(wrapped(x)), backend.to_host(runnable(x))), "graph-wrapping",
               f"wrap_graph(runnable, mode={mode.name}) called outside a forward context computed a different result")
        with backend.forward_context(None, cfg, num_tokens=16, cudagraph_runtime_mode=CUDAGraphMode.NONE):
            y = wrapped(x)
        expect(torch.equal(backend.to_host(y), backend.to_host(runnable(x))), "graph-wrapping",
               f"wrap_graph(runnable, mode={mode.name}) in a mode-NONE forward context computed a different result")


def test_wrap_graph_captures_then_replays_in_each_declared_mode(graphs, capabilities):
    """In a forward context of each declared graph runtime mode, the first call of the wrapped runnable
    captures (on a side stream, as vLLM's ``capture_model``), later calls replay: with new
    values written into the persistent input each time, the output follows them, as eager would compute."""
    backend = graphs
    cfg = _vllm_config()
    from vllm.forward_context import BatchDescriptor

    dev = backend.device()
    n = 32
    w = torch.full((n,), 2.0, device=dev)
    for mode in _runtime_modes(capabilities):
        calls = []

        def runnable(x):
            calls.append(1)
            return _forward(x, w)

        x = torch.zeros(n, device=dev)  # the persistent input buffer
        _forward(x, w)  # warm-up outside the capture, as vLLM's dummy runs do
        backend.synchronize()
        wrapped = _wrap(backend, runnable, cfg, mode)
        desc = BatchDescriptor(num_tokens=n) if mode.name == "PIECEWISE" else BatchDescriptor(num_tokens=n, num_reqs=n,
                                                                                                uniform=True)
        outs = []
        capture_stream = backend.new_stream()
        capture_stream.wait_stream(backend.current_stream())
        for step in range(4):
            new = torch.linspace(-4, 4, n) * (step + 1) + step
            x.copy_(new.to(dev))  # in place: the address the capture saw stays
            try:
                # the capturing call on a side stream, as vLLM's graph_capture() does (CUDA refuses to capture on
                # the default stream); replays on the current stream
                ctx = backend.stream_context(capture_stream) if step == 0 else contextlib.nullcontext()
                with ctx, backend.forward_context(None, cfg, num_tokens=n, cudagraph_runtime_mode=mode,
                                                  batch_descriptor=desc):
                    y = wrapped(x)
                backend.synchronize()
            except ContractViolation:
                raise
            except Exception as exc:
                raise ContractViolation("graph-wrapping", f"call {step} of wrap_graph(runnable, vllm_config, "
                                        f"{mode.name}) in a {mode.name} forward context raised "
                                        f"{type(exc).__name__}: {exc}") from exc
            got, want = backend.to_host(y).clone(), _forward(new, backend.to_host(w))
            outs.append(got)
            stale = step > 0 and torch.equal(got, outs[0]) and not torch.equal(want, outs[0])
            expect(not stale, "graph-wrapping",
                   f"call {step} in mode {mode.name} returned the output of the first (capturing) call: the wrapper "
                   "did not replay the graph on the new input values")
            expect(torch.allclose(got, want), "graph-wrapping",
                   f"call {step} in mode {mode.name} differs from the eager result on the same inputs "
                   f"(max abs diff {float((got - want).abs().max()):.3g})")
        expect(len(calls) < 4, "graph-wrapping",
               f"the runnable ran on each of the 4 calls in mode {mode.name}: nothing was captured and replayed")
