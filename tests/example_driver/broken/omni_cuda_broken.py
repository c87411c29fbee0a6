"""A deliberately broken CUDA driver for the H200 run of the kit (docs/ci.md).

Shows that the kit's copy-ordering check catches a real race on real
hardware, not only on the simulated device: the pair is an unfenced pinned
``CpuGpuBuffer``-like buffer and ``copy_to_device`` returns right after a
non-blocking H2D copy, so a host write that follows can land before the DMA
reads the source. Registered as ``cuda-broken-copy`` only by the H200 job.
"""

from __future__ import annotations

from typing import Any

from omni_backends.cuda.driver import CudaBackend
from omni_backends.torch_device import TorchCpuGpuBuffer


class UnfencedCopy(CudaBackend):
    name = "cuda-broken-copy"

    def make_buffer(self, *size: int, dtype: Any, numpy: bool = True) -> Any:
        return TorchCpuGpuBuffer(*size, dtype=dtype, device=self.device(), pin_memory=True, with_numpy=numpy)

    def copy_to_device(self, buffer: Any, n: int | None = None) -> Any:
        return buffer.copy_to_gpu(n)
