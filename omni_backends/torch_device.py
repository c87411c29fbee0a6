"""Device operations on PyTorch's device-generic API, shared by accelerator drivers.

``torch.accelerator`` (current device, synchronize, memory) plus
``torch.Stream`` / ``torch.Event`` work for every in-tree accelerator
(CUDA, XPU) and for PrivateUse1 backends that register with it (torch_npu).
Drivers whose device follows that API inherit :class:`TorchAcceleratorOps`
and provide only what torch has no generic form for (the graph class).
Nothing here rebinds an attribute of ``torch``.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator


class TorchAcceleratorOps:
    """Mixin implementing the Backend device-operation group via ``torch.accelerator``.

    Requires the class attribute ``device_type`` (``"cuda"``, ``"xpu"``, ``"npu"``)
    and ``capabilities()`` (for the D2H ordering rule in :meth:`to_host`).
    """

    device_type: str

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

        free, total = torch.accelerator.get_memory_info()
        return int(free), int(total)

    def empty_cache(self) -> None:
        import torch

        torch.accelerator.empty_cache()

    def generator(self, seed: int):
        import torch

        return torch.Generator(device=self.device()).manual_seed(int(seed))

    def to_host(self, tensor):
        """D2H copy that is complete on return: pinned non-blocking copy + event
        sync where D2H is stream-ordered, a blocking copy otherwise."""
        import torch

        if tensor.device.type == "cpu":
            return tensor
        if not self.capabilities().d2h_stream_ordered:  # type: ignore[attr-defined]
            return tensor.to("cpu", non_blocking=False)
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        ev = torch.Event(device=tensor.device)
        ev.record()
        ev.synchronize()
        return out
