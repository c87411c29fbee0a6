"""CPU/device buffers and copy ordering (device tier).

The ordering contract holds whatever the device's ordering capabilities are:
where H2D is not stream-ordered (``Capabilities.h2d_stream_ordered`` False)
the driver must copy blocking or make the consumer wait, and nowhere may a
copy still be reading ``buffer.cpu`` when ``copy_to_device`` returns.
"""

from __future__ import annotations

import pytest
import torch

from omni_backends.testing.kit import expect, vllm_missing_reason
from omni_backends.testing.suite._helpers import keep_device_busy, pattern

pytestmark = pytest.mark.device_tier

N = 1 << 18


def _make(backend, *size, **kw):
    """``backend.make_buffer``; skips with the reason where the driver's pair needs vLLM and vLLM is absent."""
    try:
        return backend.make_buffer(*size, **kw)
    except ImportError as exc:
        missing = vllm_missing_reason()
        if missing and "vllm" in str(exc):
            pytest.skip(f"{missing}; this driver's make_buffer() needs it ({exc})")
        raise


def test_make_buffer_pair(backend):
    buf = _make(backend, 64, dtype=torch.int32)
    expect(buf.cpu.device.type == "cpu" and tuple(buf.cpu.shape) == (64,), "buffer",
           f".cpu is {tuple(buf.cpu.shape)} on {buf.cpu.device}")
    expect(backend.is_device_tensor(buf.gpu) and tuple(buf.gpu.shape) == (64,), "buffer",
           f".gpu is {tuple(buf.gpu.shape)} on {buf.gpu.device}")
    expect(buf.cpu.dtype == buf.gpu.dtype == torch.int32, "buffer", f"dtypes {buf.cpu.dtype}/{buf.gpu.dtype}")
    buf.np[:4] = [7, 8, 9, 10]
    expect(buf.cpu[:4].tolist() == [7, 8, 9, 10], "buffer", ".np does not share memory with .cpu")
    if backend.capabilities().pinned_memory:
        expect(buf.cpu.is_pinned(), "buffer", "capabilities().pinned_memory is True but .cpu is not pinned")
    bf = _make(backend, 8, 4, dtype=torch.bfloat16, numpy=False)
    expect(tuple(bf.gpu.shape) == (8, 4) and bf.gpu.dtype == torch.bfloat16, "buffer", "bfloat16 buffer without numpy")


def test_copy_is_visible_to_the_next_kernel(backend):
    buf = _make(backend, N, dtype=torch.int64)
    for step in range(1, 4):
        busy = keep_device_busy(backend)
        buf.cpu.copy_(pattern(N, step))
        dev = backend.copy_to_device(buf, N // 2 + step)
        consumed = dev * 1  # the next kernel on the current stream
        host = backend.to_host(consumed)
        want = pattern(N, step)[: N // 2 + step]
        expect(tuple(dev.shape) == (N // 2 + step,), "copy-ordering", f"copy_to_device(n) returned shape {tuple(dev.shape)}")
        expect(torch.equal(host, want), "copy-ordering",
               f"step {step}: the kernel after copy_to_device() read stale data "
               f"({int((host != want).sum())} of {want.numel()} elements are not the copied values)")
        del busy


def test_source_may_be_rewritten_right_after_copy(backend):
    buf = _make(backend, N, dtype=torch.int64)
    for step in range(1, 4):
        busy = keep_device_busy(backend)
        buf.cpu.copy_(pattern(N, step))
        backend.copy_to_device(buf)
        buf.cpu.copy_(pattern(N, 100 + step))  # the caller reuses its staging buffer at once
        backend.synchronize()
        got = backend.to_host(buf.gpu)
        reused = torch.equal(got, pattern(N, 100 + step))
        expect(not reused, "copy-ordering",
               f"step {step}: copy_to_device() returned while its source was still in flight: the device received "
               "the values the caller wrote into buffer.cpu afterwards (an in-flight source was reused)")
        expect(torch.equal(got, pattern(N, step)), "copy-ordering",
               f"step {step}: after synchronize() buffer.gpu holds neither the copied values nor the later ones "
               f"({int((got != pattern(N, step)).sum())} elements wrong)")
        del busy
