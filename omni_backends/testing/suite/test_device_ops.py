"""Device operations, streams/events and generators (device tier)."""

from __future__ import annotations

import pytest
import torch

from omni_backends.testing.kit import expect
from omni_backends.testing.suite._helpers import (host_memory_device, keep_device_busy, ordering_check, pattern,
                                                  queue_in_flight, snapshot)

pytestmark = pytest.mark.device_tier


def test_device_identity(backend):
    dev = backend.device()
    expect(isinstance(dev, torch.device) and dev.type == backend.device_type, "device-ops",
           f"device() returned {dev!r}; expected a torch.device of type {backend.device_type!r}")
    n = backend.device_count()
    expect(isinstance(n, int) and n >= 1, "device-ops", f"device_count() returned {n!r} with the device present")
    backend.set_device(0)
    expect(backend.device(0).type == backend.device_type, "device-ops", f"device(0) returned {backend.device(0)!r}")
    if not host_memory_device(backend):
        expect(backend.device(0) == torch.device(backend.device_type, 0), "device-ops",
               f"device(0) returned {backend.device(0)!r}; expected torch.device({backend.device_type!r}, 0)")
    with pytest.raises(RuntimeError):
        backend.set_device(n)  # one past the last visible device


def test_memory_info_and_empty_cache(backend):
    free, total = backend.memory_info()
    expect(isinstance(free, int) and isinstance(total, int), "device-ops", f"memory_info() -> {(free, total)!r}")
    expect(0 <= free <= total and total > 0, "device-ops", f"memory_info() -> free={free} total={total} bytes")
    expect(backend.empty_cache() is None, "device-ops", "empty_cache() returned a value")
    expect(backend.synchronize() is None, "device-ops", "synchronize() returned a value")


def test_memory_info_follows_an_allocation(backend):
    """``memory_info()`` sees a device allocation (free drops, total stays) and ``empty_cache()`` hands the
    freed memory back (free rises again)."""
    if host_memory_device(backend):
        pytest.skip(f"driver {backend.name!r} keeps tensors in host memory: memory_info() reports host memory, "
                    "which the other processes of the host change")
    free, total = backend.memory_info()
    nbytes = min(1 << 30, free // 4)
    x = torch.empty(nbytes, dtype=torch.uint8, device=backend.device())
    x.fill_(1)
    backend.synchronize()
    free2, total2 = backend.memory_info()
    expect(total2 == total, "device-ops", f"memory_info() total changed from {total} to {total2} bytes")
    expect(free2 <= free - nbytes // 2, "device-ops",
           f"memory_info() free went from {free} to {free2} bytes after allocating {nbytes} bytes on the device")
    del x
    backend.empty_cache()
    free3, _ = backend.memory_info()
    expect(free3 >= free2 + nbytes // 2, "device-ops",
           f"memory_info() free went from {free2} to {free3} bytes after freeing {nbytes} bytes and empty_cache()")


def test_is_device_tensor(backend):
    t = torch.ones(3, device=backend.device())
    expect(backend.is_device_tensor(t), "device-ops", f"is_device_tensor() is False for a tensor on {t.device}")
    if not host_memory_device(backend):
        expect(not backend.is_device_tensor(torch.ones(3)), "device-ops", "is_device_tensor() is True for a CPU tensor")


def _same_stream(a, b) -> bool:
    return a is b or a == b


def test_to_host_is_complete_on_return(backend):
    busy = keep_device_busy(backend)
    x = torch.arange(1 << 20, dtype=torch.float32, device=backend.device()) * 3 + 1
    host = backend.to_host(x)
    expect(host.device.type == "cpu", "to-host", f"to_host() returned a tensor on {host.device}")
    want = torch.arange(1 << 20, dtype=torch.float32) * 3 + 1
    expect(torch.equal(host, want), "to-host",
           f"to_host() returned incomplete data: {int((host != want).sum())} of {want.numel()} elements differ")
    del busy


def test_queue_copy_follows_the_declared_copy_model(backend, record_property):
    """``queue_copy`` leaves its copy in flight on the current stream (queued behind work there, its destination
    read off the stream does not hold the copy yet), as the ordering checks need; where the driver declares
    ``Capabilities.synchronous_copies`` the copy has landed on return instead."""
    n = 1 << 18
    dst = torch.zeros(n, dtype=torch.int64, device=backend.device())
    src, want = pattern(n, 7).to(backend.device()), pattern(n, 7)
    if backend.capabilities().synchronous_copies:
        backend.synchronize()
        backend.queue_copy(dst, src)
        held = snapshot(backend, dst)
        expect(torch.equal(held, want), "kit-ops",
               f"driver {backend.name!r} declares Capabilities.synchronous_copies but queue_copy(dst, src) returned "
               f"with {int((held != want).sum())} of {n} elements not yet copied: its copies are queued, so drop "
               "the flag (the kit's ordering checks then run on them)")
        return
    busy = queue_in_flight(backend, dst, src, want, record_property, "kit-ops")
    backend.synchronize()
    expect(torch.equal(backend.to_host(dst), want), "kit-ops",
           "the copy queued by queue_copy(dst, src) has not landed after synchronize()")
    del busy


def test_to_host_waits_for_queued_copies(backend, record_property):
    """Copies still queued on the current stream (``queue_copy``, behind queued work, shown in flight) land
    before ``to_host`` returns: the ordering stress runs on a simulated device too, whose queued copies land only
    at a flush."""
    ordering_check(backend, record_property, "to-host")
    n = 1 << 18
    for step in range(1, 4):
        dst = torch.zeros(n, dtype=torch.int64, device=backend.device())
        src, want = pattern(n, step).to(backend.device()), pattern(n, step)
        busy = queue_in_flight(backend, dst, src, want, record_property, "to-host")
        host = backend.to_host(dst)
        expect(torch.equal(host, want), "to-host",
               f"step {step}: to_host() returned before the copy queued into the tensor landed "
               f"({int((host != want).sum())} of {n} elements are not the copied values)")
        del busy


def test_stream_context_sets_and_restores_the_current_stream(backend):
    before = backend.current_stream()
    side, other = backend.new_stream(), backend.new_stream()
    with backend.stream_context(side):
        inside = backend.current_stream()
        expect(_same_stream(inside, side), "stream-context",
               f"inside stream_context(s) the current stream is {inside!r}, not s={side!r}")
        with backend.stream_context(other):
            expect(_same_stream(backend.current_stream(), other), "stream-context",
                   "inside a nested stream_context(s2) the current stream is not s2")
        expect(_same_stream(backend.current_stream(), side), "stream-context",
               f"after a nested stream_context(s2) ended the current stream is {backend.current_stream()!r}, "
               f"not the outer block's {side!r}")
    after = backend.current_stream()
    expect(_same_stream(after, before), "stream-context",
           f"after stream_context(s) ended the current stream is {after!r}, not the one before it ({before!r}): "
           "the previous stream was not restored")
    with pytest.raises(ZeroDivisionError):
        with backend.stream_context(side):
            1 / 0
    expect(_same_stream(backend.current_stream(), before), "stream-context",
           "after a stream_context(s) block ended with an exception the previous stream was not restored")


def test_stream_event_ordering(backend, record_property):
    """Work queued on a side stream (a copy behind queued work there, shown in flight) is complete for work
    issued after waiting on an event recorded on that stream after it."""
    ordering_check(backend, record_property, "streams-events")
    dev = backend.device()
    n = 1 << 16
    src = torch.arange(n, dtype=torch.float32, device=dev)
    side = backend.new_stream()
    done = backend.new_event()
    side.wait_stream(backend.current_stream())
    with backend.stream_context(side):
        out = src * 3
        landed = torch.zeros(n, dtype=torch.float32, device=dev)
        busy = queue_in_flight(backend, landed, out, torch.arange(n, dtype=torch.float32) * 3, record_property,
                               "streams-events")
        done.record()
    done.wait(backend.current_stream())
    res = landed + 1
    host = backend.to_host(res)
    expect(torch.equal(host, torch.arange(n, dtype=torch.float32) * 3 + 1), "streams-events",
           "work issued after waiting on an event recorded on a side stream saw incomplete side-stream results")
    backend.synchronize()
    expect(done.query(), "streams-events", "event.query() is False after synchronize()")
    del busy


def test_event_timing(backend):
    start, end = backend.new_event(enable_timing=True), backend.new_event(enable_timing=True)
    start.record()
    torch.ones(1 << 16, device=backend.device()).sum()
    end.record()
    end.synchronize()
    expect(end.query(), "streams-events", "event.query() is False after event.synchronize()")
    ms = start.elapsed_time(end)
    expect(isinstance(ms, float) and ms >= 0.0, "streams-events", f"elapsed_time() returned {ms!r} (want ms >= 0)")


def test_generator_reproducible(backend):
    dev = backend.device()
    g1, g2, g3 = backend.generator(1234), backend.generator(1234), backend.generator(4321)
    expect(isinstance(g1, torch.Generator) and g1.device.type == backend.device_type, "generator",
           f"generator() returned {g1!r} on {getattr(g1, 'device', None)}")
    a = torch.rand(4096, device=dev, generator=g1)
    b = torch.rand(4096, device=dev, generator=g2)
    c = torch.rand(4096, device=dev, generator=g3)
    expect(torch.equal(a, b), "generator", "two generators with the same seed produced different streams")
    expect(not torch.equal(a, c), "generator", "generators with different seeds produced the same stream")
    expect(not torch.equal(a, torch.rand(4096, device=dev, generator=g1)), "generator",
           "a generator repeated its stream instead of advancing")
