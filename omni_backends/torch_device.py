"""Device operations on PyTorch's device-generic API, shared by accelerator drivers.

``torch.accelerator`` (current device, synchronize, memory) plus
``torch.Stream`` / ``torch.Event`` work for every in-tree accelerator
(CUDA, XPU) and for PrivateUse1 backends that register with it (torch_npu).
Drivers whose device follows that API subclass :class:`TorchAcceleratorBackend`
and provide only what torch has no generic form for (the graph class).
Also here: the CPU/device buffer copy contracts (:class:`FencedHostBuffer`,
:func:`copy_host_to_device`, :func:`copy_host_to_device_blocking`).
Nothing here rebinds an attribute of ``torch``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager, Iterator

from omni_backends.backend import Backend


class TorchAcceleratorBackend(Backend):
    """A :class:`~omni_backends.backend.Backend` whose device operations are
    ``torch.accelerator``'s (the way vLLM's ``CudaPlatformBase`` is a ``Platform``).

    Writes the device part of the required group (``device``, ``device_count``,
    ``synchronize``, ``memory_info``, ``to_host``), ``peak_memory``, and the
    device kit operations (``set_device``, streams, events, ``empty_cache``).
    A subclass sets ``device_type`` (``"cuda"``, ``"xpu"``, ``"npu"``) and still
    writes ``probe``, ``capabilities`` (:meth:`to_host` reads its D2H ordering
    flag), the forward context, graph wrapping and the runner bases -- or
    inherits the last three from
    :class:`~omni_backends.vllm_upstream.VllmUpstreamBackend` as well.
    """

    def device(self, index: int | None = None):
        import torch

        if index is None:
            index = torch.accelerator.current_device_index()
        return torch.device(self.device_type, index)

    def set_device(self, index: int) -> None:
        import torch

        count = torch.accelerator.device_count()
        if not 0 <= index < count:
            raise RuntimeError(f"{self.device_type} device index {index} out of range: {count} visible")
        torch.accelerator.set_device_index(index)

    def device_count(self) -> int:
        import torch

        acc = torch.accelerator.current_accelerator(check_available=True)
        if acc is None or acc.type != self.device_type:
            return 0
        return torch.accelerator.device_count()

    def synchronize(self) -> None:
        import torch

        torch.accelerator.synchronize()

    def new_stream(self) -> Any:
        import torch

        return torch.Stream(device=self.device())

    def current_stream(self) -> Any:
        import torch

        return torch.accelerator.current_stream()

    @contextlib.contextmanager
    def _stream_ctx(self, stream: Any) -> Iterator[Any]:
        import torch

        prev = torch.accelerator.current_stream()
        torch.accelerator.set_stream(stream)
        try:
            yield stream
        finally:
            torch.accelerator.set_stream(prev)

    def stream_context(self, stream: Any) -> ContextManager[Any]:
        return self._stream_ctx(stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        import torch

        return torch.Event(device=self.device(), enable_timing=enable_timing)

    def memory_info(self) -> tuple[int, int]:
        import torch

        get = getattr(torch.accelerator, "get_memory_info", None)  # torch >= 2.9
        if get is None:  # older torch: the device module's twin (torch.cuda.mem_get_info, ...)
            get = getattr(torch, self.device_type).mem_get_info
        free, total = get()
        return int(free), int(total)

    def peak_memory(self) -> int | None:
        """``torch.accelerator.max_memory_reserved()`` (older torch: the device module's twin), bytes; ``None``
        if neither exists or the call fails (device not initialised in this process)."""
        import torch

        fn = getattr(torch.accelerator, "max_memory_reserved", None) or getattr(
            getattr(torch, self.device_type, None), "max_memory_reserved", None)
        try:
            return int(fn()) if fn is not None else None
        except Exception:  # e.g. no device context in this process
            return None

    def empty_cache(self) -> None:
        import torch

        fn = getattr(torch.accelerator, "empty_cache", None) or getattr(torch, self.device_type).empty_cache
        fn()

    def to_host(self, tensor):
        """D2H copy that is complete on return: pinned non-blocking copy + event
        sync where D2H is stream-ordered, a blocking copy otherwise."""
        import torch

        if tensor.device.type == "cpu":
            return tensor
        if not self.capabilities().d2h_stream_ordered:
            return tensor.to("cpu", non_blocking=False)
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        ev = torch.Event(device=tensor.device)
        ev.record()
        ev.synchronize()
        return out


# --------------------------------------------------------------------------
# CPU/device buffer copies: the fenced-host-buffer contract
# --------------------------------------------------------------------------
class TorchCpuGpuBuffer:
    """The fields and copies of ``vllm.v1.utils.CpuGpuBuffer``, built with torch alone.

    Used only where vLLM is not installed but the device is (the device tier
    on a GPU machine without vLLM): ``.cpu`` (``pin_memory`` host tensor),
    ``.gpu`` (zeros on ``device``), ``.np`` (NumPy view of ``.cpu``, absent when
    ``with_numpy`` is False; bfloat16 requires False), and non-blocking
    ``copy_to_gpu(n)`` / ``copy_to_cpu(n)`` over the first ``n`` rows.
    """

    def __init__(self, *size: int, dtype: Any, device: Any, pin_memory: bool, with_numpy: bool = True) -> None:
        import torch

        if with_numpy and dtype == torch.bfloat16:
            raise ValueError("bfloat16 tensors have no NumPy view: pass with_numpy=False (vLLM's CpuGpuBuffer rule)")
        self.cpu = torch.zeros(*size, dtype=dtype, device="cpu", pin_memory=pin_memory)
        self.gpu = torch.zeros_like(self.cpu, device=device)
        if with_numpy:
            self.np = self.cpu.numpy()

    def copy_to_gpu(self, n: int | None = None) -> Any:
        cpu, gpu = (self.cpu, self.gpu) if n is None else (self.cpu[:n], self.gpu[:n])
        return gpu.copy_(cpu, non_blocking=True)

    def copy_to_cpu(self, n: int | None = None) -> Any:
        cpu, gpu = (self.cpu, self.gpu) if n is None else (self.cpu[:n], self.gpu[:n])
        return cpu.copy_(gpu, non_blocking=True)


class FencedHostBuffer:
    """A ``vllm.v1.utils.CpuGpuBuffer`` whose host side waits for its in-flight copies.

    The hazard it removes: ``gpu.copy_(cpu, non_blocking=True)`` from pinned
    memory returns before the DMA engine has read ``cpu``; a host write to
    ``cpu`` right after the call can land *before* the read, and the device
    then sees the new data (or a mix). vLLM's runner guards its own buffers
    with ``prepare_inputs_event`` around input preparation; this class gives
    every buffer the same guard without the caller having to remember it.

    Contract:

    - :meth:`copy_to_gpu` / :meth:`copy_to_cpu` issue a non-blocking copy on
      the *current* stream and record one event right after it. They return
      at once (no host wait), so the host keeps running ahead of the device.
    - Reading the attribute :attr:`cpu` or :attr:`np` while a copy is in
      flight waits on that event first (``Event.synchronize``: waits for the
      copy and for whatever the stream ran before it, nothing queued after).
      So ``buf.np[:n] = x`` or ``buf.cpu[:n].copy_(t)`` after a copy is safe,
      and after :meth:`copy_to_cpu` the data read through ``.cpu`` is complete.
    - A reference to ``.cpu`` / ``.np`` taken *before* a copy and written
      *after* it bypasses the guard: take the attribute again after each copy
      (or call :meth:`wait_host` first).
    - :attr:`gpu` never waits: the device side is stream-ordered.

    ``buffer`` is any object with ``.cpu`` (pinned ``torch.Tensor``), ``.gpu``
    (device tensor of the same shape and dtype) and optionally ``.np`` -- in
    production a ``vllm.v1.utils.CpuGpuBuffer``. ``event`` is a ``torch.Event``
    on the device of ``.gpu``.
    """

    __slots__ = ("_buf", "_event", "_pending", "__weakref__")

    def __init__(self, buffer: Any, event: Any) -> None:
        if not (hasattr(buffer, "cpu") and hasattr(buffer, "gpu")):
            raise TypeError(f"FencedHostBuffer needs an object with .cpu and .gpu tensors (a CpuGpuBuffer), got {buffer!r}")
        if buffer.cpu.shape != buffer.gpu.shape or buffer.cpu.dtype != buffer.gpu.dtype:
            raise ValueError(
                f"host and device sides differ: cpu {tuple(buffer.cpu.shape)} {buffer.cpu.dtype} vs "
                f"gpu {tuple(buffer.gpu.shape)} {buffer.gpu.dtype}"
            )
        self._buf = buffer
        self._event = event
        self._pending = False

    # -- host side: guarded
    def wait_host(self) -> None:
        """Block until the last copy issued through this buffer has finished."""
        if self._pending:
            self._event.synchronize()
            self._pending = False

    @property
    def cpu(self) -> Any:
        """The pinned host tensor, after any in-flight copy has finished."""
        if self._pending:
            self.wait_host()
        return self._buf.cpu

    @property
    def np(self) -> Any:
        """NumPy view of :attr:`cpu` (absent for bfloat16), after any in-flight copy."""
        if self._pending:
            self.wait_host()
        return self._buf.np

    # -- device side: stream-ordered, never waits
    @property
    def gpu(self) -> Any:
        """The device tensor."""
        return self._buf.gpu

    @property
    def inner(self) -> Any:
        """The wrapped buffer (e.g. the ``CpuGpuBuffer``). Writes through it are unguarded."""
        return self._buf

    @property
    def in_flight(self) -> bool:
        """True while a copy issued through this buffer may still read or write the host side."""
        return self._pending and not self._event.query()

    def copy_to_gpu(self, n: int | None = None) -> Any:
        """Copy ``cpu[:n]`` to ``gpu[:n]`` non-blocking; returns the device slice.

        Stream-ordered before the next kernel on the current stream. ``n``
        counts rows of dimension 0; ``None`` copies everything.
        """
        buf = self._buf
        if n is None:
            gpu = buf.gpu.copy_(buf.cpu, non_blocking=True)
        else:
            gpu = buf.gpu[:n].copy_(buf.cpu[:n], non_blocking=True)
        self._event.record()
        self._pending = True
        return gpu

    def copy_to_cpu(self, n: int | None = None) -> Any:
        """Copy ``gpu[:n]`` to ``cpu[:n]`` non-blocking; returns the host slice.

        The data is complete once :attr:`cpu` / :attr:`np` is read again (or
        after :meth:`wait_host`); the returned slice itself is *not* guarded.
        """
        cpu, gpu = self._buf.cpu, self._buf.gpu
        if n is not None:
            cpu, gpu = cpu[:n], gpu[:n]
        cpu.copy_(gpu, non_blocking=True)
        self._event.record()
        self._pending = True
        return cpu

    def __repr__(self) -> str:
        return f"FencedHostBuffer(shape={tuple(self._buf.gpu.shape)}, dtype={self._buf.gpu.dtype}, pending={self._pending})"


def copy_host_to_device(buffer: Any, n: int | None = None) -> Any:
    """``Backend.copy_to_device`` for drivers whose H2D copies are stream-ordered.

    A :class:`FencedHostBuffer` copies non-blocking and fences its host side
    (see its contract). Any other ``CpuGpuBuffer``-like object cannot fence
    later host writes, so its copy is made non-blocking and then waited for
    (its event), which keeps the promise "the caller may rewrite ``cpu`` right
    after" at the price of a host wait. Returns the device slice.
    """
    if type(buffer) is FencedHostBuffer:  # the hot path: no import, no subclass walk
        return buffer.copy_to_gpu(n)
    if isinstance(buffer, FencedHostBuffer):
        return buffer.copy_to_gpu(n)
    import torch

    cpu, gpu = buffer.cpu, buffer.gpu
    if n is not None:
        cpu, gpu = cpu[:n], gpu[:n]
    gpu.copy_(cpu, non_blocking=True)
    ev = torch.Event(device=gpu.device)
    ev.record()
    ev.synchronize()
    return gpu


def copy_host_to_device_blocking(buffer: Any, n: int | None = None) -> Any:
    """``Backend.copy_to_device`` for drivers whose H2D copies are *not*
    stream-ordered (``Capabilities.h2d_stream_ordered=False``): a blocking copy
    of ``buffer.cpu[:n]`` into ``buffer.gpu[:n]``, so on return the device slice
    is complete and ``buffer.cpu`` may be rewritten. Returns the device slice."""
    src = buffer.cpu if n is None else buffer.cpu[:n]
    dst = buffer.gpu if n is None else buffer.gpu[:n]
    dst.copy_(src, non_blocking=False)
    return dst


def __getattr__(name: str) -> Any:
    if name == "TorchAcceleratorOps":
        warnings.warn("omni_backends.torch_device.TorchAcceleratorOps is deprecated: subclass TorchAcceleratorBackend "
                      "(a Backend) instead; the alias will be removed in the next release",
                      DeprecationWarning, stacklevel=2)
        return TorchAcceleratorBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------
# Captured graphs over persistent inputs
# --------------------------------------------------------------------------
class StaleGraphInputError(ValueError):
    """A replay was given a tensor that is not the persistent input captured in the graph."""


class StaticGraph:
    """One captured device graph over persistent (static) input tensors.

    Built on a driver's torch-level graph primitive (``Backend.new_graph``,
    ``Backend.graph_capture``, ``Backend.graph_pool_handle``), the way
    ``CUDAGraphWrapper`` is built on ``torch.cuda.CUDAGraph``.

    ``fn(*static_inputs)`` is run ``warmup`` times on a side stream, then
    captured once. A replay re-runs the captured kernels on the *same memory*:
    new input values must be written in place into ``static_inputs`` (e.g.
    ``x.copy_(new)`` or ``Backend.copy_to_device`` into a persistent buffer);
    outputs are the same tensors (:attr:`outputs`) every replay, overwritten.

    Graphs sharing a ``pool`` must be replayed in the order they were
    captured (torch's rule: a later capture may reuse an earlier capture's
    freed intermediates, so replaying the earlier graph afterwards can
    overwrite the later graph's outputs).

    With ``debug=True`` (or ``check=True`` on one call), :meth:`replay` takes
    the inputs the caller believes it is feeding and raises
    :class:`StaleGraphInputError` if any is not the captured tensor (a freshly
    allocated tensor would be silently ignored by the graph). vLLM's
    ``CUDAGraphWrapper`` makes the same address check under
    ``VLLM_LOGGING_LEVEL=DEBUG``.
    """

    def __init__(
        self,
        backend: Any,
        fn: Any,
        static_inputs: tuple[Any, ...] | list[Any],
        *,
        pool: Any = None,
        warmup: int = 2,
        debug: bool = False,
    ) -> None:
        if not backend.capabilities().static_graphs:
            raise NotImplementedError(f"driver {backend.name!r} has no static graphs (capabilities().static_graph_modes is empty)")
        self.static_inputs = tuple(static_inputs)
        self.debug = debug
        self._addresses = tuple(t.data_ptr() for t in self.static_inputs)
        main = backend.current_stream()
        side = backend.new_stream()
        side.wait_stream(main)
        with backend.stream_context(side):
            for _ in range(warmup):
                fn(*self.static_inputs)
        main.wait_stream(side)
        self.graph = backend.new_graph()
        with backend.graph_capture(self.graph, pool=pool):
            self.outputs = fn(*self.static_inputs)

    def check_inputs(self, *inputs: Any) -> None:
        """Raise :class:`StaleGraphInputError` unless ``inputs`` are the captured tensors (same storage address)."""
        if len(inputs) != len(self._addresses):
            raise StaleGraphInputError(f"graph was captured with {len(self._addresses)} inputs, replay got {len(inputs)}")
        for i, (t, addr) in enumerate(zip(inputs, self._addresses)):
            if t.data_ptr() != addr:
                raise StaleGraphInputError(
                    f"input {i} is not the persistent tensor captured in the graph (address {t.data_ptr():#x} != "
                    f"{addr:#x}): a fresh tensor is ignored by replay. Write new values in place into "
                    f"static_inputs[{i}] (tensor.copy_(new)) instead of passing a new tensor."
                )

    def replay(self, *inputs: Any, check: bool = False) -> Any:
        """Replay the graph on the current stream and return :attr:`outputs` (not synchronized).

        ``inputs`` are only checked (debug mode or ``check=True``); values come
        from the persistent ``static_inputs``.
        """
        if (check or self.debug) and inputs:
            self.check_inputs(*inputs)
        self.graph.replay()
        return self.outputs
