"""``bench.static_graph.StaticGraph`` (one captured graph over persistent inputs, with the debug-mode
address check) on the ``--device`` driver's graph primitive (the kit's ``backend``; ``pytest --device cuda
-m device_tier`` on the H200); skips on a driver without static graphs.

Repository-only: the driver's own graph primitive is the kit's ``graph-replay`` contract
(``omni_backends/testing/suite/test_graphs.py``); these test this repository's helper over it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bench.static_graph import StaleGraphInputError, StaticGraph  # noqa: E402

pytestmark = pytest.mark.device_tier

HIDDEN, BATCH = 512, 8


@pytest.fixture()
def graph_backend(backend, capabilities):
    if not capabilities.static_graphs:
        pytest.skip(f"driver {backend.name!r} has no static graphs (capabilities().static_graph_modes is empty)")
    return backend


def _decode_step(dev):
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


def _captured(backend, debug=False):
    """(device, step, persistent input x, StaticGraph of step over x)."""
    dev = backend.device()
    step = _decode_step(dev)
    x = torch.randn(BATCH, HIDDEN, device=dev)
    return dev, step, x, StaticGraph(backend, step, (x,), debug=debug)


def test_addresses_stable_and_in_place_update_seen(graph_backend):
    dev, step, x, sg = _captured(graph_backend)
    in_addr, out_addr = x.data_ptr(), sg.outputs.data_ptr()
    first = sg.replay().clone()
    x.copy_(torch.randn(BATCH, HIDDEN, device=dev))  # persistent buffer updated in place
    second = sg.replay()
    assert x.data_ptr() == in_addr and second.data_ptr() == out_addr
    graph_backend.synchronize()
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, step(x), rtol=1e-4, atol=1e-4)


def test_fresh_tensor_is_detected_in_debug_mode(graph_backend):
    dev, step, x, sg = _captured(graph_backend, debug=True)
    sg.replay(x)  # the captured tensor passes
    fresh = torch.randn(BATCH, HIDDEN, device=dev)
    with pytest.raises(StaleGraphInputError, match="input 0 is not the persistent tensor"):
        sg.replay(fresh)
    # why the check exists: without it the graph silently reads the old buffer
    stale = sg.replay().clone()
    graph_backend.synchronize()
    torch.testing.assert_close(stale, step(x), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(stale, step(fresh))
