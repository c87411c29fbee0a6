"""Device tier: the capture-size policy shared by every driver (issue 5)."""

from __future__ import annotations

import pytest

from omni_backends.backend import capture_sizes

pytestmark = pytest.mark.device_tier

VLLM_LADDER = [1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16)]


@pytest.mark.parametrize("max_batch", [8, 12, 16, 20, 32, 257])
def test_capture_sizes_include_max_and_never_exceed(max_batch):
    sizes = capture_sizes(max_batch)
    assert sizes[-1] == max_batch
    assert all(1 <= s <= max_batch for s in sizes)
    assert sizes == sorted(set(sizes))
    # every size of vLLM's ladder up to the maximum is captured, nothing else but the maximum itself
    assert set(sizes) == {s for s in VLLM_LADDER if s <= max_batch} | {max_batch}


def test_capture_sizes_examples():
    assert capture_sizes(12) == [1, 2, 4, 8, 12]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(257)[-3:] == [248, 256, 257]


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_capture_sizes_rejects_bad_max(bad):
    with pytest.raises(ValueError, match="max_batch"):
        capture_sizes(bad)


def test_every_capture_size_replays_on_device(device_backend, torch_mod):
    """One graph per policy size for max batch 20; each replays its own batch correctly."""
    if not device_backend.capabilities().static_graphs:
        pytest.skip(f"driver {device_backend.name!r} has no static graphs")
    from omni_backends.torch_device import StaticGraph

    torch = torch_mod
    dev = device_backend.device()
    w = torch.randn(256, 256, device=dev)
    pool = device_backend.graph_pool_handle()
    graphs = {}
    for bs in capture_sizes(20):
        x = torch.zeros(bs, 256, device=dev)
        graphs[bs] = StaticGraph(device_backend, lambda t: torch.relu(t @ w), (x,), pool=pool)
    for bs, g in graphs.items():
        new = torch.randn(bs, 256, device=dev)
        g.static_inputs[0].copy_(new)
        out = g.replay()
        device_backend.synchronize()
        assert out.shape == (bs, 256)
        torch.testing.assert_close(out, torch.relu(new @ w), rtol=1e-4, atol=1e-4)
