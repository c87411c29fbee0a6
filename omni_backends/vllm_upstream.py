"""Bindings to upstream vLLM shared by the drivers that run on vLLM's own
components (cpu, cuda, xpu): forward context, graph wrapper, sampler,
``CpuGpuBuffer``, ``CommonAttentionMetadata``.

Each symbol is declared once as a :class:`~omni_backends.binding.VendorSymbol`
and resolved lazily; importing this module imports no vLLM.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

from omni_backends.binding import VendorSymbol

SET_FORWARD_CONTEXT = VendorSymbol(
    "vllm.forward_context",
    "set_forward_context",
    params=(
        "attn_metadata",
        "vllm_config",
        "num_tokens",
        "num_tokens_across_dp",
        "cudagraph_runtime_mode",
        "batch_descriptor",
        "ubatch_slices",
        "slot_mapping",
        "skip_compiled",
        "is_padding",
    ),
    required=("attn_metadata", "vllm_config"),
)
CUDAGRAPH_MODE = VendorSymbol("vllm.config", "CUDAGraphMode", kind="class")
CUDA_GRAPH_WRAPPER = VendorSymbol(
    "vllm.compilation.cuda_graph",
    "CUDAGraphWrapper",
    params=("runnable", "vllm_config", "runtime_mode"),
    required=("runnable", "vllm_config", "runtime_mode"),
    kind="class",
)
CUDA_GRAPH_WRAPPER_CLEAR = VendorSymbol("vllm.compilation.cuda_graph", "CUDAGraphWrapper.clear_all_graphs", required=())
GRAPH_CAPTURE = VendorSymbol("vllm.distributed.parallel_state", "graph_capture", params=("device",), required=("device",))
SAMPLER = VendorSymbol("vllm.v1.sample.sampler", "Sampler", params=("logprobs_mode",), required=(), kind="class")
CPU_GPU_BUFFER = VendorSymbol(
    "vllm.v1.utils",
    "CpuGpuBuffer",
    params=("dtype", "device", "pin_memory", "with_numpy"),
    required=("dtype", "device"),
    kind="class",
)
COMMON_ATTN_METADATA = VendorSymbol("vllm.v1.attention.backend", "CommonAttentionMetadata", kind="class")


class VllmUpstreamBindings:
    """Mixin: the Backend groups that delegate straight to upstream vLLM.

    Needs ``capabilities()`` and ``device()`` from the driver.
    """

    def forward_context(
        self,
        attn_metadata: Any,
        vllm_config: Any,
        *,
        num_tokens: int | None = None,
        num_tokens_across_dp: Any = None,
        cudagraph_runtime_mode: Any = None,
        batch_descriptor: Any = None,
        ubatch_slices: Any = None,
        slot_mapping: Any = None,
        skip_compiled: bool = False,
        is_padding: Any = None,
        num_actual_tokens: int | None = None,
        model: Any = None,
        is_profile: bool = False,
    ) -> ContextManager[None]:
        """``vllm.forward_context.set_forward_context`` with vLLM's own arguments;
        ``num_actual_tokens``/``model``/``is_profile`` are vendor extras vLLM
        does not take and are dropped."""
        mode = cudagraph_runtime_mode if cudagraph_runtime_mode is not None else CUDAGRAPH_MODE.resolve().NONE
        return SET_FORWARD_CONTEXT.resolve()(
            attn_metadata,
            vllm_config,
            num_tokens=num_tokens,
            num_tokens_across_dp=num_tokens_across_dp,
            cudagraph_runtime_mode=mode,
            batch_descriptor=batch_descriptor,
            ubatch_slices=ubatch_slices,
            slot_mapping=slot_mapping,
            skip_compiled=skip_compiled,
            is_padding=is_padding,
        )

    def wrap_graph(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any) -> Callable[..., Any]:
        """``CUDAGraphWrapper(runnable, vllm_config, runtime_mode)`` when the
        driver has static graphs; ``runnable`` unchanged otherwise."""
        if not self.capabilities().static_graphs:  # type: ignore[attr-defined]
            return runnable
        return CUDA_GRAPH_WRAPPER.resolve()(runnable, vllm_config, runtime_mode=runtime_mode)

    def graph_capture_context(self, device: Any) -> ContextManager[Any]:
        """``vllm.distributed.parallel_state.graph_capture(device)``; a null context without graphs."""
        if not self.capabilities().static_graphs:  # type: ignore[attr-defined]
            return contextlib.nullcontext()
        return GRAPH_CAPTURE.resolve()(device=device)

    def clear_graphs(self) -> None:
        """``CUDAGraphWrapper.clear_all_graphs()``; nothing without graphs."""
        if self.capabilities().static_graphs:  # type: ignore[attr-defined]
            CUDA_GRAPH_WRAPPER_CLEAR.resolve()()

    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        """``vllm.v1.sample.sampler.Sampler(logprobs_mode=...)``."""
        return SAMPLER.resolve()(logprobs_mode=logprobs_mode)

    def make_buffer(self, *size: int, dtype: Any, numpy: bool = True) -> Any:
        """``vllm.v1.utils.CpuGpuBuffer(*size, dtype=, device=, pin_memory=, with_numpy=)``,
        pinned iff ``capabilities().pinned_memory``."""
        return CPU_GPU_BUFFER.resolve()(
            *size,
            dtype=dtype,
            device=self.device(),  # type: ignore[attr-defined]
            pin_memory=self.capabilities().pinned_memory,  # type: ignore[attr-defined]
            with_numpy=numpy,
        )

    def copy_to_device(self, buffer: Any, n: int | None = None) -> Any:
        """``buffer.copy_to_gpu(n)`` (non-blocking) where H2D is stream-ordered;
        a blocking copy otherwise, so the pinned source may be reused at once."""
        if self.capabilities().h2d_stream_ordered:  # type: ignore[attr-defined]
            return buffer.copy_to_gpu(n)
        src = buffer.cpu if n is None else buffer.cpu[:n]
        dst = buffer.gpu if n is None else buffer.gpu[:n]
        dst.copy_(src, non_blocking=False)
        return dst

    def common_attn_metadata_cls(self) -> type:
        """``vllm.v1.attention.backend.CommonAttentionMetadata``."""
        return COMMON_ATTN_METADATA.resolve()
