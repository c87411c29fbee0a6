"""Device operations on PyTorch's device-generic API, shared by accelerator drivers.

``torch.accelerator`` (current device, synchronize, memory) plus
``torch.Stream`` / ``torch.Event`` work for every in-tree accelerator
(CUDA, XPU) and for PrivateUse1 backends that register with it (torch_npu).
Drivers whose device follows that API subclass :class:`TorchAcceleratorBackend`
and provide only what torch has no generic form for (the graph class).
:class:`GenericKitOps` holds the device-generic forms of three operations of
the conformance kit's :class:`~omni_backends.testing.kit_ops.KitOps`, which both
shared bases include.
Also here: the CPU/device buffer copy contracts (:class:`FencedHostBuffer`,
:func:`copy_host_to_device`, :func:`copy_host_to_device_blocking`).
Nothing here rebinds an attribute of ``torch``.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator

from omni_backends.backend import Backend


class GenericKitOps:
    """Device-generic forms of seven :class:`~omni_backends.testing.kit_ops.KitOps`
    operations for a :class:`~omni_backends.backend.Backend` subclass to include
    (they read only ``self.name``, ``self.device()`` and ``self.device_type``):
    ``generator``, ``queue_copy``, ``is_device_tensor``, ``write_kv_cache``, and the graph
    primitive of a device without static graphs (``new_graph``,
    ``graph_capture``, ``graph_pool_handle`` raise ``NotImplementedError``; a
    driver with graphs overrides them). The core never calls them."""

    def generator(self, seed: int) -> Any:
        """``torch.Generator(device=self.device()).manual_seed(seed)``: the same seed yields the same stream."""
        import torch

        return torch.Generator(device=self.device()).manual_seed(int(seed))

    def queue_copy(self, dst: Any, src: Any) -> None:
        """``dst.copy_(src, non_blocking=True)``: torch queues the copy on the current stream of an
        accelerator. On tensors torch sees as host tensors it completes at once: a driver whose device queues
        copies there (a simulated device) writes its own, one whose device has no queue declares
        ``Capabilities.synchronous_copies`` (the conformance kit fails ``kit-ops`` otherwise)."""
        dst.copy_(src, non_blocking=True)

    def is_device_tensor(self, tensor: Any) -> bool:
        """True if ``tensor`` lives on this driver's device type (``tensor.device.type == device_type``,
        what ``t.is_cuda`` asks on CUDA)."""
        return tensor.device.type == self.device_type

    def new_graph(self) -> Any:
        """No static graphs here: raises ``NotImplementedError`` (``capabilities().static_graph_modes`` is empty)."""
        raise NotImplementedError(f"driver {getattr(self, 'name', '?')!r} has no static graphs "
                                  "(capabilities().static_graph_modes is empty)")

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]:
        """No static graphs here: raises ``NotImplementedError``."""
        raise NotImplementedError(f"driver {getattr(self, 'name', '?')!r} has no static graphs")

    def graph_pool_handle(self) -> Any:
        """No static graphs here: raises ``NotImplementedError``."""
        raise NotImplementedError(f"driver {getattr(self, 'name', '?')!r} has no static graphs")

    def write_kv_cache(self, key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any) -> None:
        """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into
        the paged caches ``[num_blocks, block_size, num_kv_heads, head_size]``
        (vLLM's flash layout) at ``slot_mapping`` (int64 ``[>= num_tokens]``,
        slot = block * block_size + offset). A slot < 0 is padding and is never
        written. The torch (non-kernel) write path; a driver may override it with
        the vendor kernel (``reshape_and_cache_flash``) if that skips padding too.
        Raises ``ValueError`` if a slot is past the end of the cache."""
        import torch

        slots = slot_mapping[: key.shape[0]].to(torch.int64)
        real = slots >= 0
        capacity = key_cache.shape[0] * key_cache.shape[1]
        if bool((slots >= capacity).any()):
            raise ValueError(f"slot_mapping has a slot >= the cache's {capacity} slots; check the block table")
        for src, cache in ((key, key_cache), (value, value_cache)):
            cache.view(capacity, *cache.shape[2:]).index_copy_(0, slots[real], src[real].to(cache.dtype))


class TorchAcceleratorBackend(GenericKitOps, Backend):
    """A :class:`~omni_backends.backend.Backend` whose device operations are
    ``torch.accelerator``'s (the way vLLM's ``CudaPlatformBase`` is a ``Platform``).

    Writes the device part of the required group (``device``, ``device_count``,
    ``synchronize``, ``memory_info``, ``to_host``), ``peak_memory``, ``new_event``
    (``torch.Event``), and the kit's device operations (``set_device``, streams,
    ``empty_cache``; :class:`~omni_backends.testing.kit_ops.KitOps`).
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
    """``KitOps.copy_to_device`` for drivers whose H2D copies are stream-ordered.

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
    """``KitOps.copy_to_device`` for drivers whose H2D copies are *not*
    stream-ordered (``Capabilities.h2d_stream_ordered=False``): a blocking copy
    of ``buffer.cpu[:n]`` into ``buffer.gpu[:n]``, so on return the device slice
    is complete and ``buffer.cpu`` may be rewritten. Returns the device slice."""
    src = buffer.cpu if n is None else buffer.cpu[:n]
    dst = buffer.gpu if n is None else buffer.gpu[:n]
    dst.copy_(src, non_blocking=False)
    return dst
