"""A simulated device whose copy engine completes copies late and out of order.

Device memory is CPU tensors. A non-blocking copy between host and device is
queued on the :class:`CopyEngine` and *executes later*: it reads its source
when it runs (as a DMA engine does), after a random delay of 1..``max_delay``
ticks, and copies that are due together complete in random order. Every
kernel-like read of device memory (:meth:`SimDeviceTensor.read`) is one tick.
So on this device

- a kernel that reads a device buffer right after a non-blocking H2D copy may
  see the *previous* contents (stale read);
- rewriting a host buffer while a copy from it is still queued changes what
  arrives (in-flight source reuse) -- the engine records each such write as a
  violation;
- a non-blocking D2H copy returns a host tensor that is still garbage.

A blocking copy (``non_blocking=False``) first completes every queued copy that
touches the same memory, then copies at once -- the guarantee a real blocking
copy gives. :class:`SimCpuGpuBuffer` has vLLM ``CpuGpuBuffer``'s interface
(``.cpu``, ``.gpu``, ``.np``, ``copy_to_gpu``/``copy_to_cpu`` as non-blocking
copies), so driver code written against ``CpuGpuBuffer`` runs on it unchanged.
"""

from __future__ import annotations

import dataclasses
import random
import types
from typing import Any

import torch

GARBAGE = -7777  # what a host tensor holds before its D2H copy completed


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@dataclasses.dataclass
class _Copy:
    dst: torch.Tensor
    src: torch.Tensor
    due: int

    def run(self) -> None:
        self.dst.copy_(self.src)  # reads the source now, not when it was queued


class CopyEngine:
    """Queue of pending copies that complete late (1..``max_delay`` ticks) and out of order."""

    def __init__(self, seed: int = 0, max_delay: int = 4) -> None:
        self.rng = random.Random(seed)
        self.max_delay = max_delay
        self.clock = 0
        self.pending: list[_Copy] = []
        self.violations: list[str] = []
        self.completed = 0  # queued copies that ran
        self.blocking = 0  # blocking copies

    def submit(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.pending.append(_Copy(dst, src, self.clock + self.rng.randint(1, self.max_delay)))

    def tick(self) -> None:
        """Time passes: copies that are due complete, in random order."""
        self.clock += 1
        due = [c for c in self.pending if c.due <= self.clock]
        self.rng.shuffle(due)
        for c in due:
            self.pending.remove(c)
            c.run()
            self.completed += 1

    def complete_touching(self, t: torch.Tensor) -> None:
        """Complete every queued copy that reads or writes ``t``'s memory (in queue order)."""
        for c in [c for c in self.pending if _same_memory(c.dst, t) or _same_memory(c.src, t)]:
            self.pending.remove(c)
            c.run()
            self.completed += 1

    def synchronize(self) -> None:
        for c in list(self.pending):
            self.pending.remove(c)
            c.run()
            self.completed += 1

    def host_write(self, host: torch.Tensor, values: torch.Tensor) -> None:
        """The host program writes ``values`` into ``host``; records a violation if a
        queued copy still has to read that memory."""
        if any(_same_memory(c.src, host) for c in self.pending):
            self.violations.append(f"host buffer rewritten at tick {self.clock} while a copy from it is in flight")
        host.copy_(values)


class SimDeviceTensor:
    """A tensor in the simulated device's memory (backed by a CPU tensor)."""

    def __init__(self, data: torch.Tensor, engine: CopyEngine, device_type: str) -> None:
        self.data = data
        self.engine = engine
        self.device = types.SimpleNamespace(type=device_type, index=0)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def __getitem__(self, idx: Any) -> "SimDeviceTensor":
        return SimDeviceTensor(self.data[idx], self.engine, self.device.type)

    def copy_(self, src: Any, non_blocking: bool = False) -> "SimDeviceTensor":
        """H2D (``src`` a CPU tensor) or D2D copy into this tensor."""
        src_data = src.data if isinstance(src, SimDeviceTensor) else src
        if non_blocking:
            self.engine.submit(self.data, src_data)
        else:
            self.engine.complete_touching(self.data)
            self.engine.complete_touching(src_data)
            self.data.copy_(src_data)
            self.engine.blocking += 1
        return self

    def read(self) -> torch.Tensor:
        """What a kernel launched now sees (one tick of device time passes first)."""
        self.engine.tick()
        return self.data.clone()

    def to(self, device: Any, non_blocking: bool = False) -> torch.Tensor:
        """D2H copy: a blocking one is complete; a non-blocking one returns a host
        tensor that holds :data:`GARBAGE` until the engine completes the copy."""
        if str(device) != "cpu":
            raise ValueError(f"simulated device copies only to cpu, not {device!r}")
        out = torch.full_like(self.data, GARBAGE)
        if non_blocking:
            self.engine.submit(out, self.data)
        else:
            self.engine.complete_touching(self.data)
            out.copy_(self.data)
        return out


class SimCpuGpuBuffer:
    """vLLM ``CpuGpuBuffer`` on the simulated device: ``.cpu`` host tensor
    ("pinned"), ``.gpu`` device tensor, ``.np`` numpy view of ``.cpu``;
    ``copy_to_gpu(n)`` is vLLM's non-blocking ``gpu[:n].copy_(cpu[:n], non_blocking=True)``."""

    def __init__(self, *size: int, dtype: torch.dtype, engine: CopyEngine, device_type: str) -> None:
        self.cpu = torch.zeros(*size, dtype=dtype)
        self.gpu = SimDeviceTensor(torch.zeros(*size, dtype=dtype), engine, device_type)
        self.np = self.cpu.numpy()

    def copy_to_gpu(self, n: int | None = None) -> SimDeviceTensor:
        if n is None:
            return self.gpu.copy_(self.cpu, non_blocking=True)
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)

    def copy_to_cpu(self, n: int | None = None) -> torch.Tensor:
        if n is None:
            self.gpu.engine.submit(self.cpu, self.gpu.data)
            return self.cpu
        self.gpu.engine.submit(self.cpu[:n], self.gpu.data[:n])
        return self.cpu[:n]
