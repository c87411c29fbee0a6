"""Bindings to upstream vLLM shared by the drivers that run on vLLM's own
components (cpu, cuda, xpu): forward context, graph wrapper, sampler,
``CpuGpuBuffer``, ``CommonAttentionMetadata``.

Each symbol is declared once as a :class:`~omni_backends.binding.VendorSymbol`
and resolved lazily; importing this module imports no vLLM.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from omni_backends.backend import Backend
from omni_backends.binding import VendorSymbol
from omni_backends.torch_device import GenericKitOps, copy_host_to_device_blocking

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

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
#: the graphs a ``CUDAGraphWrapper`` holds (one entry per ``BatchDescriptor``; read, never written)
CUDA_GRAPH_ENTRIES = VendorSymbol("vllm.compilation.cuda_graph", "CUDAGraphWrapper.concrete_cudagraph_entries",
                                  kind="attribute")
GRAPH_CAPTURE = VendorSymbol("vllm.distributed.parallel_state", "graph_capture", params=("device",), required=("device",))
SAMPLER = VendorSymbol("vllm.v1.sample.sampler", "Sampler", params=("logprobs_mode",), required=(), kind="class")
# The seam of the one-token rule (:func:`install_one_token_greedy`): vLLM's V1 ``Sampler.sample`` applies the
# temperature and then calls its ``topk_topp_sampler`` module as ``(logits, generators, k, p)``; the driver wraps
# that module. Declared so check-drift proves the attribute, the call and its parameters per vLLM version
# (``required=None``: an unbound method's ``self`` reads as required when installed, not in a source tree).
SAMPLER_SAMPLE = VendorSymbol(
    "vllm.v1.sample.sampler", "Sampler.sample", params=("logits", "sampling_metadata"), required=None,
    mentions=("apply_temperature", "self.topk_topp_sampler("),
)
SAMPLER_TOPK_TOPP = VendorSymbol("vllm.v1.sample.sampler", "Sampler.topk_topp_sampler", kind="attribute")
TOPK_TOPP_FORWARD = VendorSymbol(
    "vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler.forward_native",
    params=("logits", "generators", "k", "p"), required=None,
)
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

    def forward_context(
        self,
        attn_metadata: Any,
        vllm_config: Any,
        *,
        num_tokens: int | None = None,
        num_tokens_across_dp: "torch.Tensor | None" = None,
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


# ------------------------------------------------------------------ the one-token sampling rule
def one_token_rows(logits: Any, k: Any, p: Any) -> Any:
    """Rows whose top-k / top-p keep exactly one token by the reference sampler's
    rules (:mod:`omni_backends.testing.reference_sampler`): ``k == 1``, or the top token's
    probability after top-k (renormalised over the first ``k`` ranks) is ``>= p``.

    ``logits``: float ``[num_rows, vocab]`` as ``TopKTopPSampler`` receives them
    (after temperature); ``k``: int ``[num_rows]`` (``vocab`` = off) or ``None``;
    ``p``: float ``[num_rows]`` (``1.0`` = off) or ``None``. Returns bool
    ``[num_rows]`` on ``logits.device``, or ``None`` when ``k`` and ``p`` are both
    ``None``. Vectorised, no host sync; a full-row sort only when both ``k`` and
    ``p`` are given (as vLLM's own PyTorch top-p path does). Rows with NaN or
    all ``-inf`` logits are never one-token rows by ``p``.
    """
    import torch

    if k is None and p is None:
        return None
    n, vocab = logits.shape
    one = torch.zeros(n, dtype=torch.bool, device=logits.device)
    if k is not None:
        one |= k.view(-1) == 1
    if p is not None:
        x = logits.float()
        top = x.amax(dim=-1, keepdim=True)
        if k is None:
            mass = torch.exp(x - top).sum(dim=-1)  # softmax mass relative to the top token's
        else:
            ranks = torch.sort(x, dim=-1, descending=True).values
            kk = k.view(-1).long().clamp(1, vocab)
            mass = torch.exp(ranks - top).cumsum(dim=-1).gather(-1, (kk - 1).unsqueeze(-1)).squeeze(-1)
        one |= p.view(-1).float() * mass <= 1.0  # the top token's probability 1/mass >= p
    return one


@functools.lru_cache(maxsize=None)
def _one_token_greedy_cls() -> type:
    import torch

    class OneTokenGreedy(torch.nn.Module):
        """vLLM's ``TopKTopPSampler`` (``self.inner``) where rows whose top-k / top-p
        keep one token (:func:`one_token_rows`) return the greedy token of the
        logits it receives, the lowest token id among tied maxima; every other row
        is ``inner``'s. ``forward(logits [num_rows, vocab] float32, generators,
        k, p) -> (sampled [num_rows] int, processed logits/logprobs or None)``.
        Other attributes are ``inner``'s (vendor subclasses' methods included)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, logits: Any, generators: Any, k: Any, p: Any) -> Any:
            one = one_token_rows(logits, k, p)
            if one is None:
                return self.inner(logits, generators, k, p)
            greedy = logits.argmax(dim=-1)  # taken first: inner may update logits in place
            sampled, processed = self.inner(logits, generators, k, p)
            sampled = sampled.view(-1)
            return torch.where(one, greedy.to(sampled.dtype), sampled), processed

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                inner = self.__dict__.get("_modules", {}).get("inner", self.__dict__.get("inner"))
                if inner is None:
                    raise
                return getattr(inner, name)

    return OneTokenGreedy


def install_one_token_greedy(sampler: Any, attr: str | None = None) -> Any:
    """Make ``sampler`` (a ``vllm.v1.sample.sampler.Sampler`` or subclass, e.g.
    ``vllm_ascend.sample.sampler.AscendSampler``) return the greedy token, ties
    towards the lowest token id, for every random row whose ``top_k`` / ``top_p``
    keep one token. vLLM's own ``TopKTopPSampler`` keeps every token tied at the
    boundary and draws among them, so ``top_k=1`` on tied maxima is random there.

    Wraps ``sampler.topk_topp_sampler`` in place (idempotent) and returns
    ``sampler``; everything else stays vLLM's. ``attr``: the attribute's name
    where a vendor declares its own (default vLLM's ``topk_topp_sampler``).
    Raises ``TypeError`` for an object without it.
    """
    attr = attr or SAMPLER_TOPK_TOPP.attr_name
    inner = getattr(sampler, attr, None)
    if inner is None:
        raise TypeError(f"{type(sampler).__qualname__} has no {attr!r}: not a {SAMPLER.qualname} (the one-token "
                        f"sampling rule wraps {SAMPLER_TOPK_TOPP.qualname}, which {SAMPLER_SAMPLE.qualname} calls "
                        f"like {TOPK_TOPP_FORWARD.qualname}{TOPK_TOPP_FORWARD.params})")
    cls = _one_token_greedy_cls()
    if not isinstance(inner, cls):
        setattr(sampler, attr, cls(inner))
    return sampler
