"""Bindings to upstream vLLM shared by the drivers that run on vLLM's own
components (cpu, cuda, xpu): forward context, graph wrapper, sampler (with the
one-token rule, the patch :mod:`omni_backends.patches`), ``CpuGpuBuffer``,
``CommonAttentionMetadata``.

Each symbol is declared once as a :class:`~omni_backends.binding.VendorSymbol`
and resolved lazily; importing this module imports no vLLM.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Unpack

from omni_backends.backend import (
    FORWARD_CONTEXT_DEFAULTS,
    FORWARD_CONTEXT_EXTRAS,
    Backend,
    ForwardContextArgs,
)
from omni_backends.binding import VendorSymbol
from omni_backends.patches import SAMPLER, install_one_token_greedy
from omni_backends.torch_device import GenericKitOps, copy_host_to_device_blocking

#: the spec's keywords vLLM's ``set_forward_context`` takes, with the spec's defaults
_VLLM_FORWARD_CONTEXT_DEFAULTS = {k: v for k, v in FORWARD_CONTEXT_DEFAULTS.items() if k not in FORWARD_CONTEXT_EXTRAS}
#: the keywords not given are left to vLLM, whose defaults must be the spec's (check-drift proves it:
#: ``defaults``); ``cudagraph_runtime_mode`` is always passed (the spec's ``None`` is ``CUDAGraphMode.NONE``)
SET_FORWARD_CONTEXT = VendorSymbol(
    "vllm.forward_context", "set_forward_context", params=("attn_metadata", "vllm_config", *_VLLM_FORWARD_CONTEXT_DEFAULTS),
    required=("attn_metadata", "vllm_config"),
    defaults=tuple((k, repr(v)) for k, v in _VLLM_FORWARD_CONTEXT_DEFAULTS.items() if k != "cudagraph_runtime_mode"),
)
CUDAGRAPH_MODE = VendorSymbol("vllm.config", "CUDAGraphMode", kind="class")
CUDA_GRAPH_WRAPPER = VendorSymbol(
    "vllm.compilation.cuda_graph",
    "CUDAGraphWrapper",
    params=("runnable", "vllm_config", "runtime_mode"),
    required=("runnable", "vllm_config", "runtime_mode"),
    kind="class",
)
#: the graphs a ``CUDAGraphWrapper`` holds (one entry per ``BatchDescriptor``; read, never written)
CUDA_GRAPH_ENTRIES = VendorSymbol("vllm.compilation.cuda_graph", "CUDAGraphWrapper.concrete_cudagraph_entries",
                                  kind="attribute")
GRAPH_CAPTURE = VendorSymbol("vllm.distributed.parallel_state", "graph_capture", params=("device",), required=("device",))
CPU_GPU_BUFFER = VendorSymbol(
    "vllm.v1.utils",
    "CpuGpuBuffer",
    params=("dtype", "device", "pin_memory", "with_numpy"),
    required=("dtype", "device"),
    kind="class",
)
COMMON_ATTN_METADATA = VendorSymbol("vllm.v1.attention.backend", "CommonAttentionMetadata", kind="class")
#: whether vLLM's resolved platform runs static graphs at all: where it says no, ``VllmConfig`` forces
#: ``cudagraph_mode`` to NONE whatever the driver declares (read on ``vllm.platforms.current_platform``)
PLATFORM_STATIC_GRAPHS = VendorSymbol("vllm.platforms.interface", "Platform.support_static_graph_mode", required=None)


def engine_static_graph_modes(backend: Backend) -> tuple[str, ...]:
    """The static graph modes a vLLM engine on ``backend`` can run: the driver's declared
    ``capabilities().static_graph_modes`` where vLLM's resolved platform supports static graphs
    (``current_platform.support_static_graph_mode()``, :data:`PLATFORM_STATIC_GRAPHS`), ``()`` where it does not
    (vLLM then forces ``cudagraph_mode=NONE``: e.g. a driver declaring graphs over vLLM's cpu platform). A
    driver declaring none returns ``()`` without importing vLLM; otherwise call it after the driver was
    selected (its ``vllm_platform_env`` exported), as vLLM's platform is resolved once per process."""
    declared = tuple(backend.capabilities().static_graph_modes)
    if not declared:
        return ()
    from vllm.platforms import current_platform

    supported = getattr(type(current_platform), PLATFORM_STATIC_GRAPHS.attr_name.rpartition(".")[2])
    return declared if supported() else ()


#: ``device_type`` s whose graphs vLLM's ``CUDAGraphWrapper`` and ``graph_capture`` drive: CUDA, and XPU, where
#: vLLM's XPU model runner points ``torch.cuda.graph`` / ``CUDAGraph`` at ``torch.xpu``'s.
CUDA_GRAPH_DEVICE_TYPES = ("cuda", "xpu")


def require_cuda_graph_device(backend: Backend, method: str) -> None:
    """Raise :class:`~omni_backends.errors.OmniBackendError` when ``backend`` (declaring static graphs) runs
    on a ``device_type`` outside :data:`CUDA_GRAPH_DEVICE_TYPES`, where the shared ``method`` would hand vLLM's
    CUDA graph machinery tensors it cannot capture (a raw error from inside vLLM, or worse, none)."""
    if backend.device_type in CUDA_GRAPH_DEVICE_TYPES:
        return
    from omni_backends.errors import OmniBackendError

    raise OmniBackendError(
        f"driver {backend.name!r} declares static graphs {tuple(backend.capabilities().static_graph_modes)} on "
        f"device type {backend.device_type!r}, but inherits VllmUpstreamBackend.{method}, which builds vLLM's CUDA "
        f"graph machinery ({CUDA_GRAPH_WRAPPER.qualname} / {GRAPH_CAPTURE.qualname}: torch.cuda graphs and "
        f"streams, for device types {', '.join(CUDA_GRAPH_DEVICE_TYPES)}). Write wrap_graph and "
        "graph_capture_context for your device over its graph primitive (the example driver's SimGraphWrapper, "
        "tests/example_driver/omni_simdev/driver.py, is the pattern; docs/vendor-guide.md 'Graphs on a device "
        "that is not CUDA'), or declare static_graph_modes=()"
    )


class VllmUpstreamBackend(GenericKitOps, Backend):
    """A :class:`~omni_backends.backend.Backend` whose forward context, graph
    wrapper, sampler, ``CpuGpuBuffer`` and ``CommonAttentionMetadata`` are
    upstream vLLM's (the cpu, cuda and xpu drivers; an out-of-tree driver on
    vLLM's own components).

    Writes ``forward_context`` and ``wrap_graph`` (required), the defaults
    ``graph_capture_context`` and ``prepare_sampler``, and the kit's
    (:class:`~omni_backends.testing.kit_ops.KitOps`) ``make_sampler``,
    ``make_buffer``, ``copy_to_device``, ``common_attn_metadata_cls``; each reads the driver's ``capabilities()``
    (and ``device()`` for buffers). Combine it with
    :class:`~omni_backends.torch_device.TorchAcceleratorBackend` for the device
    operations: ``class MyBackend(TorchAcceleratorBackend, VllmUpstreamBackend)``.
    """

    def forward_context(self, attn_metadata: Any, vllm_config: Any,
                        **kwargs: Unpack[ForwardContextArgs]) -> ContextManager[None]:
        """``vllm.forward_context.set_forward_context`` with vLLM's own arguments as given (vLLM's defaults,
        the spec's, for the others; ``cudagraph_runtime_mode=None`` is ``CUDAGraphMode.NONE``); the vendor
        extras (``FORWARD_CONTEXT_EXTRAS``) are dropped. ``TypeError`` (vLLM's) for a keyword the spec lacks."""
        if not FORWARD_CONTEXT_EXTRAS.isdisjoint(kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k not in FORWARD_CONTEXT_EXTRAS}
        if kwargs.get("cudagraph_runtime_mode") is None:
            kwargs["cudagraph_runtime_mode"] = CUDAGRAPH_MODE.resolve().NONE
        return SET_FORWARD_CONTEXT.resolve()(attn_metadata, vllm_config, **kwargs)

    def wrap_graph(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any) -> Callable[..., Any]:
        """``CUDAGraphWrapper(runnable, vllm_config, runtime_mode)`` when the
        driver has static graphs; ``runnable`` unchanged otherwise. vLLM's wrapper
        captures ``torch.cuda`` graphs (``torch.xpu`` ones under vLLM's XPU runner):
        on any other ``device_type`` (:data:`CUDA_GRAPH_DEVICE_TYPES`) a driver with
        static graphs gets :class:`~omni_backends.errors.OmniBackendError` saying what
        to write instead (:func:`require_cuda_graph_device`)."""
        if not self.capabilities().static_graphs:
            return runnable
        require_cuda_graph_device(self, "wrap_graph")
        return CUDA_GRAPH_WRAPPER.resolve()(runnable, vllm_config, runtime_mode=runtime_mode)

    def captured_graphs(self, wrapped: Any) -> int | None:
        """The entries of a ``CUDAGraphWrapper`` (``concrete_cudagraph_entries``) that hold a captured
        graph; ``None`` for anything else (no static graphs: ``wrap_graph`` returned the runnable)."""
        entries = getattr(wrapped, CUDA_GRAPH_ENTRIES.attr_name, None)
        if not isinstance(entries, dict):
            return None
        return sum(1 for e in entries.values() if getattr(e, "cudagraph", None) is not None)

    def graph_capture_context(self, device: Any) -> ContextManager[Any]:
        """``vllm.distributed.parallel_state.graph_capture(device)`` (a ``torch.cuda`` stream context: cuda/xpu
        only, as :meth:`wrap_graph`); a null context without graphs."""
        if not self.capabilities().static_graphs:
            return contextlib.nullcontext()
        require_cuda_graph_device(self, "graph_capture_context")
        return GRAPH_CAPTURE.resolve()(device=device)

    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        """``vllm.v1.sample.sampler.Sampler(logprobs_mode=...)`` with the one-token
        rule installed (:func:`install_one_token_greedy`)."""
        return install_one_token_greedy(SAMPLER.resolve()(logprobs_mode=logprobs_mode))

    def prepare_sampler(self, sampler: Any) -> Any:
        """The sampler vLLM's V1 runner built (``GPUModelRunner.sampler``, a
        ``vllm.v1.sample.sampler.Sampler``) with the one-token rule installed
        in place (:func:`install_one_token_greedy`); returns ``sampler``."""
        return install_one_token_greedy(sampler)

    def make_buffer(self, *size: int, dtype: Any, numpy: bool = True) -> Any:
        """``vllm.v1.utils.CpuGpuBuffer(*size, dtype=, device=, pin_memory=, with_numpy=)``,
        pinned iff ``capabilities().pinned_memory``."""
        return CPU_GPU_BUFFER.resolve()(
            *size,
            dtype=dtype,
            device=self.device(),
            pin_memory=self.capabilities().pinned_memory,
            with_numpy=numpy,
        )

    def copy_to_device(self, buffer: Any, n: int | None = None) -> Any:
        """``buffer.copy_to_gpu(n)`` (non-blocking) where H2D is stream-ordered;
        a blocking copy otherwise, so the pinned source may be reused at once."""
        if self.capabilities().h2d_stream_ordered:
            return buffer.copy_to_gpu(n)
        return copy_host_to_device_blocking(buffer, n)

    def common_attn_metadata_cls(self) -> type:
        """``vllm.v1.attention.backend.CommonAttentionMetadata``."""
        return COMMON_ATTN_METADATA.resolve()
