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
        driver has static graphs; ``runnable`` unchanged otherwise."""
        if not self.capabilities().static_graphs:
            return runnable
        return CUDA_GRAPH_WRAPPER.resolve()(runnable, vllm_config, runtime_mode=runtime_mode)

    def captured_graphs(self, wrapped: Any) -> int | None:
        """The entries of a ``CUDAGraphWrapper`` (``concrete_cudagraph_entries``) that hold a captured
        graph; ``None`` for anything else (no static graphs: ``wrap_graph`` returned the runnable)."""
        entries = getattr(wrapped, CUDA_GRAPH_ENTRIES.attr_name, None)
        if not isinstance(entries, dict):
            return None
        return sum(1 for e in entries.values() if getattr(e, "cudagraph", None) is not None)

    def graph_capture_context(self, device: Any) -> ContextManager[Any]:
        """``vllm.distributed.parallel_state.graph_capture(device)``; a null context without graphs."""
        if not self.capabilities().static_graphs:
            return contextlib.nullcontext()
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
