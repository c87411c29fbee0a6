"""Device tier: capture/replay through the driver's torch-level graph primitive (issue 5).

The graph primitive is what vLLM's ``CUDAGraphWrapper`` (and its vendor
twins) build on: ``Backend.new_graph`` / ``graph_capture`` /
``graph_pool_handle``, used here through :class:`omni_backends.torch_device.StaticGraph`.
"""

from __future__ import annotations

import pytest

from omni_backends.torch_device import StaleGraphInputError, StaticGraph

pytestmark = pytest.mark.device_tier

HIDDEN, BATCH = 512, 8


@pytest.fixture()
def graph_backend(device_backend):
    if not device_backend.capabilities().static_graphs:
        pytest.skip(f"driver {device_backend.name!r} has no static graphs (capabilities().static_graph_modes is empty)")
    return device_backend


def _decode_step(torch, dev):
    """A decode-like step: RMS norm, gated MLP, residual, logits; weights fixed."""
    g = torch.Generator(device=dev).manual_seed(0)
    w1 = torch.randn(HIDDEN, 4 * HIDDEN, device=dev, generator=g) / HIDDEN**0.5
    w2 = torch.randn(2 * HIDDEN, HIDDEN, device=dev, generator=g) / HIDDEN**0.5
    wo = torch.randn(HIDDEN, 1000, device=dev, generator=g) / HIDDEN**0.5

    def step(x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        a, b = (h @ w1).chunk(2, dim=-1)
        h = x + (torch.nn.functional.silu(a) * b) @ w2
        return h @ wo

    return step


def _captured(backend, torch, debug=False):
    """(device, step, persistent input x, StaticGraph of step over x)."""
    dev = backend.device()
    step = _decode_step(torch, dev)
    x = torch.randn(BATCH, HIDDEN, device=dev)
    return dev, step, x, StaticGraph(backend, step, (x,), debug=debug)


def test_eager_equals_replay_on_random_inputs(graph_backend, torch_mod):
    torch = torch_mod
    dev, step, x, sg = _captured(graph_backend, torch)
    for i in range(20):
        new = torch.randn(BATCH, HIDDEN, device=dev) * (1 + i % 3)
        x.copy_(new)
        out = sg.replay()
        ref = step(new)
        graph_backend.synchronize()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_addresses_stable_and_in_place_update_seen(graph_backend, torch_mod):
    torch = torch_mod
    dev, step, x, sg = _captured(graph_backend, torch)
    in_addr, out_addr = x.data_ptr(), sg.outputs.data_ptr()
    first = sg.replay().clone()
    x.copy_(torch.randn(BATCH, HIDDEN, device=dev))  # persistent buffer updated in place
    second = sg.replay()
    assert x.data_ptr() == in_addr and second.data_ptr() == out_addr
    graph_backend.synchronize()
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, step(x), rtol=1e-4, atol=1e-4)


def test_fresh_tensor_is_detected_in_debug_mode(graph_backend, torch_mod):
    torch = torch_mod
    dev, step, x, sg = _captured(graph_backend, torch, debug=True)
    sg.replay(x)  # the captured tensor passes
    fresh = torch.randn(BATCH, HIDDEN, device=dev)
    with pytest.raises(StaleGraphInputError, match="input 0 is not the persistent tensor"):
        sg.replay(fresh)
    # why the check exists: without it the graph silently reads the old buffer
    stale = sg.replay().clone()
    graph_backend.synchronize()
    torch.testing.assert_close(stale, step(x), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(stale, step(fresh))


def test_shared_pool_and_buffer_fed_graph(graph_backend, torch_mod, pinned_pair):
    """Two graphs share one pool; inputs arrive through the driver's buffer copy.

    Graphs in one pool are replayed in capture order (torch's rule for shared
    pools: a later capture may reuse an earlier one's freed intermediates, so
    replaying an earlier graph after a later one can overwrite the later
    graph's outputs -- the first H200 run of this test, replaying out of
    order, showed exactly that)."""
    torch = torch_mod
    dev = graph_backend.device()
    step = _decode_step(torch, dev)
    pool = graph_backend.graph_pool_handle()
    small = torch.zeros(4, HIDDEN, device=dev)
    buf = pinned_pair((BATCH, HIDDEN))
    g_small = StaticGraph(graph_backend, step, (small,), pool=pool)
    g_big = StaticGraph(graph_backend, step, (buf.gpu,), pool=pool)
    for _ in range(10):
        host = torch.randn(BATCH, HIDDEN)
        buf.cpu.copy_(host)
        graph_backend.copy_to_device(buf)
        small.copy_(buf.gpu[:4])
        out_small = g_small.replay()  # capture order: small, then big
        out_big = g_big.replay()
        graph_backend.synchronize()
        ref = step(host.to(dev))
        torch.testing.assert_close(out_big, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out_small, ref[:4], rtol=1e-4, atol=1e-4)



def test_capture_on_a_driver_stream(graph_backend, torch_mod):
    """graph_capture accepts the stream new_stream() returns; the graph replays on any current stream."""
    torch = torch_mod
    dev = graph_backend.device()
    x = torch.randn(BATCH, HIDDEN, device=dev)
    w = torch.randn(HIDDEN, HIDDEN, device=dev)
    side = graph_backend.new_stream()
    side.wait_stream(graph_backend.current_stream())
    with graph_backend.stream_context(side):
        torch.relu(x @ w)  # warm-up on the side stream
    graph_backend.current_stream().wait_stream(side)
    graph = graph_backend.new_graph()
    with graph_backend.graph_capture(graph, stream=side):
        out = torch.relu(x @ w)
    x.copy_(torch.randn(BATCH, HIDDEN, device=dev))
    graph.replay()
    graph_backend.synchronize()
    torch.testing.assert_close(out, torch.relu(x @ w), rtol=1e-4, atol=1e-4)
