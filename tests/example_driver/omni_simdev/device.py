"""simdev: a simulated accelerator whose memory is CPU tensors.

What it simulates, so that ordering bugs in a driver show up on a CPU box:

- **asynchronous copies**: :meth:`SimDevice.copy` with ``blocking=False``
  queues the copy on the current :class:`SimStream`; it runs (and only then
  reads its source) when the stream is flushed: at ``synchronize()``, an
  event ``synchronize()``/``wait()``, or a stream ``wait_stream()``. Kernels
  (plain torch ops) run when issued, so on this device a queued copy is *not*
  ordered before the next kernel (``h2d_stream_ordered`` False).
- **streams and events**: ordering points that flush queued work.
- **static graphs**: :class:`SimGraph` records the aten ops issued inside
  :meth:`SimGraph.capture` (a ``TorchDispatchMode`` scoped to the block) and
  :meth:`SimGraph.replay` re-runs them on the same tensors, writing results
  into the captured outputs, as a device graph replays on fixed addresses.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class SimStream:
    """A stream: a queue of pending asynchronous work (copies)."""

    def __init__(self, device: "SimDevice") -> None:
        self._device = device
        self._pending: list[Callable[[], None]] = []

    def enqueue(self, work: Callable[[], None]) -> None:
        self._pending.append(work)

    def synchronize(self) -> None:
        """Run every queued item in order."""
        while self._pending:
            self._pending.pop(0)()

    def query(self) -> bool:
        return not self._pending

    def wait_stream(self, other: "SimStream") -> None:
        """Order later work on this stream after everything queued on ``other``."""
        other.synchronize()

    def wait_event(self, event: "SimEvent") -> None:
        event.synchronize()

    def record_event(self, event: "SimEvent | None" = None) -> "SimEvent":
        event = event or SimEvent(self._device)
        event.record(self)
        return event


class SimEvent:
    """An event: marks a point on a stream; waiting on it flushes that stream."""

    def __init__(self, device: "SimDevice", enable_timing: bool = False) -> None:
        self._device = device
        self.enable_timing = enable_timing
        self._stream: SimStream | None = None
        self._t: float | None = None

    def record(self, stream: SimStream | None = None) -> None:
        self._stream = stream or self._device.current_stream()
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def wait(self, stream: SimStream | None = None) -> None:
        self.synchronize()

    def query(self) -> bool:
        return self._stream is None or self._stream.query()

    def elapsed_time(self, end: "SimEvent") -> float:
        """Milliseconds between this event and ``end``; both need ``enable_timing``."""
        if not (self.enable_timing and end.enable_timing and self._t is not None and end._t is not None):
            raise RuntimeError("elapsed_time needs two recorded events created with enable_timing=True")
        end.synchronize()
        return (end._t - self._t) * 1000.0


class _Recorder(TorchDispatchMode):
    """Records each aten op (func, args, kwargs, outputs) issued while active."""

    def __init__(self, ops: list[tuple[Any, tuple, dict, Any]]) -> None:
        super().__init__()
        self._ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self._ops.append((func, args, kwargs, out))
        return out


class SimGraph:
    """A static graph: the ops captured once, replayed on the same tensors."""

    def __init__(self) -> None:
        self._ops: list[tuple[Any, tuple, dict, Any]] = []
        self.pool: Any = None

    @contextlib.contextmanager
    def capture(self, pool: Any = None) -> Iterator["SimGraph"]:
        if self._ops:
            raise RuntimeError("this SimGraph was already captured; make a new one")
        self.pool = pool
        with _Recorder(self._ops):
            yield self

    def replay(self) -> None:
        """Re-run every captured op; out-of-place results are written into the captured outputs."""
        for func, args, kwargs, out in self._ops:
            result = func(*args, **kwargs)
            for old, new in zip(tree_leaves(out), tree_leaves(result)):
                if isinstance(old, torch.Tensor) and old is not new and old.data_ptr() != new.data_ptr():
                    old.copy_(new)


class SimDevice:
    """One simulated device: its streams (per thread current stream) and copy engine."""

    def __init__(self) -> None:
        self.default_stream = SimStream(self)
        self._streams: list[SimStream] = [self.default_stream]
        self._local = threading.local()

    def new_stream(self) -> SimStream:
        s = SimStream(self)
        self._streams.append(s)
        return s

    def current_stream(self) -> SimStream:
        return getattr(self._local, "stream", None) or self.default_stream

    @contextlib.contextmanager
    def use_stream(self, stream: SimStream) -> Iterator[SimStream]:
        prev = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield stream
        finally:
            self._local.stream = prev

    def synchronize(self) -> None:
        for s in self._streams:
            s.synchronize()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, *, blocking: bool) -> torch.Tensor:
        """Copy ``src`` into ``dst``. Blocking: done on return. Non-blocking: queued on
        the current stream; the source is read when the stream is flushed."""
        if blocking:
            self.current_stream().synchronize()  # earlier queued writes to dst land first
            dst.copy_(src)
        else:
            self.current_stream().enqueue(lambda: dst.copy_(src))
        return dst
