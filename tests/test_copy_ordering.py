"""CPU->device copies never reuse a pinned source while its copy is in flight (issue 5), on the ``--device``
driver (the kit's ``backend``; ``pytest --device cuda -m device_tier`` on the H200).

Each step writes fresh data into the pinned host side, copies it to the
device behind queued device work (so the copy is still pending when the host
moves on), and has the device checksum what arrived. The checksums of the
driver's non-blocking path must equal those of blocking copies and of the
host data, over many steps. A raw ``non_blocking=True`` copy with no guard
is run the same way as a negative control: it must show mismatches, which
proves the test can see the race it guards against.

Repository-only (the kit's ``copy-ordering`` contract is the vendor-facing
check): these run this repository's buffer paths -- vLLM's ``CpuGpuBuffer``
(``TorchCpuGpuBuffer`` where vLLM is absent), fenced by the driver's
``fence_buffer`` where it has one -- for 120 steps, with the negative control.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.device_tier

STEPS = 120
N = 1 << 16  # 64 Ki int32 values = 256 KiB per step


@pytest.fixture(scope="module")
def pinned_pair(backend):
    """Factory ``(shape, dtype=float32, fenced=True) -> buffer``: a
    ``vllm.v1.utils.CpuGpuBuffer`` when vLLM is importable, else
    :class:`omni_backends.torch_device.TorchCpuGpuBuffer`; pinned where the
    driver pins; wrapped by the driver's ``fence_buffer`` when ``fenced`` and
    the driver has one."""
    pin = backend.capabilities().pinned_memory
    try:
        from vllm.v1.utils import CpuGpuBuffer as cls
    except Exception:  # no vLLM here, or a vLLM that cannot load on this host
        from omni_backends.torch_device import TorchCpuGpuBuffer as cls

    def make(shape, dtype=None, fenced=True):
        dtype = dtype or torch.float32
        buf = cls(*shape, dtype=dtype, device=backend.device(), pin_memory=pin, with_numpy=dtype != torch.bfloat16)
        if fenced and hasattr(backend, "fence_buffer"):
            return backend.fence_buffer(buf)
        return buf

    return make


def _busy(dev):
    """Queue ~2 ms of device work, so a following copy is still pending when the host continues."""
    if dev.type == "cpu":
        return lambda: None
    a = torch.randn(4096, 4096, device=dev)  # one fp32 product ~ 2 ms on an H200

    def run():
        torch.mm(a, a)

    return run


def _checksums(backend, buf, mode):
    """Run STEPS steps; return (device checksums, host checksums) as lists of floats."""
    dev = backend.device()
    busy = _busy(dev)
    gen = torch.Generator().manual_seed(99)
    data = torch.randint(0, 1000, (STEPS, N), dtype=torch.int32, generator=gen)  # made up front: a fast host loop
    expected = data.double().sum(dim=1).tolist()
    sums = torch.zeros(STEPS, dtype=torch.float64, device=dev)
    for s in range(STEPS):
        buf.cpu.copy_(data[s])  # the host write (waits on a fenced buffer's pending copy)
        busy()
        if mode == "driver":
            backend.copy_to_device(buf)
        elif mode == "blocking":
            buf.gpu.copy_(buf.cpu, non_blocking=False)
        elif mode == "raw":
            buf.gpu.copy_(buf.cpu, non_blocking=True)
        else:
            raise AssertionError(mode)
        sums[s] = buf.gpu.double().sum()
    backend.synchronize()
    return sums.tolist(), expected


def test_async_copy_checksums_equal_blocking(backend, pinned_pair):
    fenced = pinned_pair((N,), torch.int32)
    got_async, want = _checksums(backend, fenced, "driver")
    got_block, want2 = _checksums(backend, pinned_pair((N,), torch.int32, fenced=False), "blocking")
    assert want == want2  # same host data both runs
    bad = [s for s in range(STEPS) if got_async[s] != want[s]]
    assert not bad, f"driver copy: {len(bad)}/{STEPS} steps saw a rewritten source, first {bad[:5]}"
    assert got_async == got_block


def test_unfenced_buffer_copy_is_safe(backend, pinned_pair):
    """copy_to_device on a plain CpuGpuBuffer-like pair waits for its copy (the fallback of the contract)."""
    got, want = _checksums(backend, pinned_pair((N,), torch.int32, fenced=False), "driver")
    assert got == want


def test_raw_non_blocking_copy_races(backend, pinned_pair):
    """Negative control: without the guard the same loop corrupts checksums on an async device."""
    if backend.device_type == "cpu" or not backend.capabilities().pinned_memory:
        pytest.skip(f"driver {backend.name!r}: copies are synchronous, there is no in-flight source to race")
    got, want = _checksums(backend, pinned_pair((N,), torch.int32, fenced=False), "raw")
    bad = sum(g != w for g, w in zip(got, want))
    assert bad > 0, "the unguarded control showed no race: the ordering test has no power on this device"


def test_device_to_host_through_fenced_buffer(backend, pinned_pair):
    """copy_to_cpu returns at once; reading .cpu/.np afterwards sees complete data."""
    if not hasattr(backend, "fence_buffer"):
        pytest.skip(f"driver {backend.name!r} has no fence_buffer")
    dev = backend.device()
    busy = _busy(dev)
    buf = pinned_pair((N,), torch.int32)
    for s in range(20):
        busy()
        buf.gpu.copy_(torch.arange(N, dtype=torch.int32, device=dev) * (s + 1))
        buf.copy_to_cpu()
        host = buf.np  # waits on the copy's event
        assert int(host[1]) == s + 1 and int(host[N - 1]) == (N - 1) * (s + 1)
        assert not buf.in_flight


def test_partial_copy_touches_only_n_rows(backend, pinned_pair):
    buf = pinned_pair((64, 3), torch.int32)
    buf.cpu.copy_(torch.arange(192, dtype=torch.int32).view(64, 3))
    backend.copy_to_device(buf)
    buf.cpu.fill_(-1)  # rewritten at once: safe under the contract
    dev = backend.copy_to_device(buf, 10)
    assert tuple(dev.shape) == (10, 3)
    host = backend.to_host(buf.gpu)
    assert bool((host[:10] == -1).all())
    assert torch.equal(host[10:], torch.arange(30, 192, dtype=torch.int32).view(54, 3))
