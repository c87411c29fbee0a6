"""Helpers shared by the suite's modules (import torch; used only inside the suite)."""

from __future__ import annotations

import torch


def host_memory_device(backend) -> bool:
    """True when the driver's tensors live in host memory (the cpu driver, a simulated device)."""
    return backend.device().type == "cpu"


def keep_device_busy(backend, rounds: int = 24) -> torch.Tensor:
    """Queue enough work on the current stream that a copy issued next waits behind it.

    On an accelerator this makes a race between a queued copy and a host write
    show every time; on a host-memory device work runs when issued, so nothing
    is queued. Returns the last result (keep it alive until synchronised).
    """
    if host_memory_device(backend):
        return torch.zeros(1)
    a = torch.rand(2048, 2048, device=backend.device(), generator=backend.generator(7)) / 2048
    for _ in range(rounds):
        a = a @ a + 1e-3
    return a


def pattern(n: int, step: int, dtype=torch.int64) -> torch.Tensor:
    """A recognisable host tensor for step ``step``: ``step * 1_000_000 + arange(n)``."""
    return torch.arange(n, dtype=dtype) + step * 1_000_000
