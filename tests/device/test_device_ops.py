"""Device tier: the driver's device operations on the real device (issue 5)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.device_tier


def _needs_accelerator(backend):
    if backend.device_type == "cpu":
        pytest.skip(f"driver {backend.name!r} keeps tensors in host memory: no separate device memory, streams or "
                    "events to order")


def test_device_and_set_device(device_backend, torch_mod):
    torch = torch_mod
    n = device_backend.device_count()
    assert n >= 1
    device_backend.set_device(0)
    dev = device_backend.device()
    assert dev.type == device_backend.device_type
    if device_backend.device_type != "cpu":
        assert device_backend.device(0) == torch.device(device_backend.device_type, 0)
    with pytest.raises(RuntimeError, match="out of range"):
        device_backend.set_device(n + 7)
    t = torch.ones(3, device=dev)
    assert device_backend.is_device_tensor(t)
    if device_backend.device_type != "cpu":
        assert not device_backend.is_device_tensor(torch.ones(3))


def test_stream_event_ordering(device_backend, torch_mod):
    """A write on a side stream, behind long work, is seen by the main stream after it waits on an event."""
    _needs_accelerator(device_backend)
    torch = torch_mod
    dev = device_backend.device()
    a = torch.randn(4096, 4096, device=dev)
    out = torch.zeros(1 << 20, device=dev)
    main = device_backend.current_stream()
    side = device_backend.new_stream()
    side.wait_stream(main)
    ev = device_backend.new_event()
    with device_backend.stream_context(side):
        assert device_backend.current_stream() == side
        b = a
        for _ in range(8):  # ~ms of work, so an unordered reader would see zeros
            b = torch.tanh(b @ a / 64)
        out.copy_(torch.full_like(out, 7.0) + 0 * b[0, 0])
        ev.record()
    assert device_backend.current_stream() == main
    main.wait_event(ev)
    total = out.sum()
    device_backend.synchronize()
    assert total.item() == 7.0 * out.numel()


def test_timing_events(device_backend, torch_mod):
    _needs_accelerator(device_backend)
    torch = torch_mod
    start, end = device_backend.new_event(enable_timing=True), device_backend.new_event(enable_timing=True)
    x = torch.randn(4096, 4096, device=device_backend.device())
    start.record()
    for _ in range(5):
        x = x @ x / 64
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 0.0 < ms < 10_000.0


def test_memory_info_and_empty_cache(device_backend, torch_mod):
    torch = torch_mod
    free, total = device_backend.memory_info()
    assert 0 < free <= total
    if device_backend.device_type == "cpu":
        return
    nbytes = 1 << 30
    x = torch.empty(nbytes, dtype=torch.uint8, device=device_backend.device())
    x.fill_(1)
    device_backend.synchronize()
    free2, total2 = device_backend.memory_info()
    assert total2 == total
    assert free2 <= free - nbytes // 2, (free, free2)
    del x
    device_backend.empty_cache()
    free3, _ = device_backend.memory_info()
    assert free3 >= free2 + nbytes // 2, (free2, free3)


def test_seeded_generator(device_backend, torch_mod):
    torch = torch_mod
    dev = device_backend.device()
    g1, g2, g3 = device_backend.generator(1234), device_backend.generator(1234), device_backend.generator(4321)
    assert g1.device.type == device_backend.device_type
    a = torch.randn(1000, device=dev, generator=g1)
    b = torch.randn(1000, device=dev, generator=g2)
    c = torch.randn(1000, device=dev, generator=g3)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # the stream continues: a second draw differs from the first
    assert not torch.equal(torch.randn(1000, device=dev, generator=g1), a)


def test_to_host_is_complete(device_backend, torch_mod):
    """to_host returns data the caller may read at once, even behind queued work."""
    torch = torch_mod
    dev = device_backend.device()
    for step in range(5):
        x = torch.randn(1024, 1024, device=dev)
        for _ in range(4):  # queue work so a missing wait would read stale memory
            x = torch.tanh(x @ x.T / 1024)
        y = x * (step + 1)
        host = device_backend.to_host(y)
        assert host.device.type == "cpu"
        # compare with a copy made after a full synchronize
        device_backend.synchronize()
        assert torch.equal(host, y.cpu())
