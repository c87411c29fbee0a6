"""The device operations the conformance kit needs beyond :class:`~omni_backends.backend.Backend`.

The core runner never calls these; the kit's device tier exercises them to show
the device behaves as vLLM's components assume (streams and events, seeded
generators, the torch graph primitive, the vendor sampler, CPU/device buffers,
attention metadata, the KV-cache write). A driver implements :class:`KitOps`
beside the Backend interface -- the shared bases
(:class:`~omni_backends.torch_device.TorchAcceleratorBackend`,
:class:`~omni_backends.vllm_upstream.VllmUpstreamBackend`,
:class:`~omni_backends.torch_device.GenericKitOps`) write most of it -- and
:func:`omni_backends.testing.kit.check_kit_ops` (called by the kit's
``check_interface``) fails a driver that lacks one with the contract ``kit-ops``.

What a driver supports is read from ``capabilities()``: the graph primitive
(``new_graph``, ``graph_capture``, ``graph_pool_handle``) is exercised only
where ``capabilities().static_graphs``; a driver without static graphs may
raise ``NotImplementedError`` from those three.

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ContextManager, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch


@runtime_checkable
class KitOps(Protocol):
    """What a driver implements for the conformance kit, in the order the kit's suite uses it."""

    # ---------------------------------------------------------- device, streams
    def set_device(self, index: int) -> None:
        """Make device ``index`` current for this thread (``torch.accelerator.set_device_index``).
        Raises ``RuntimeError`` for a bad index."""

    def new_stream(self) -> Any:
        """A new side stream on the current device (``torch.Stream``)."""

    def current_stream(self) -> Any:
        """The current stream (``torch.accelerator.current_stream``)."""

    def stream_context(self, stream: Any) -> ContextManager[Any]:
        """Make ``stream`` current inside the ``with`` block."""

    def queue_copy(self, dst: "torch.Tensor", src: "torch.Tensor") -> None:
        """Copy ``src`` into the device tensor ``dst`` without waiting: the device's non-blocking copy, queued
        on the current stream (``dst.copy_(src, non_blocking=True)`` on a torch accelerator). The kit uses it
        to leave a copy in flight where a check needs one (``to_host``, streams and events), on a simulated
        device as on a real one, and proves the copy is still in flight (its destination, read off the stream,
        does not hold it yet) before relying on it: a copy that has already landed fails ``kit-ops``. Where
        ``Capabilities.synchronous_copies`` (a device with no queue) the copy has landed on return instead, and
        the checks that need one in flight are skipped with that reason."""

    def empty_cache(self) -> None:
        """Release cached, unused allocator blocks (``torch.accelerator.empty_cache``)."""

    def generator(self, seed: int) -> "torch.Generator":
        """A ``torch.Generator`` on this device seeded with ``seed``; the same seed yields the same stream."""

    def is_device_tensor(self, tensor: "torch.Tensor") -> bool:
        """True if ``tensor`` lives on this driver's device type (what ``t.is_cuda`` asks on CUDA)."""

    # ---------------------------------------------------------- torch graph primitive (what graph wrappers build on)
    def new_graph(self) -> Any:
        """A new, empty device graph (``torch.cuda.CUDAGraph`` / ``torch.npu.NPUGraph`` / ``torch.xpu.XPUGraph``)."""

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]:
        """Capture the work issued inside the block into ``graph`` (``torch.cuda.graph(graph, pool=, stream=)``
        and its vendor twins). Replay with ``graph.replay()``: inputs live in persistent buffers updated in place."""

    def graph_pool_handle(self) -> Any:
        """A memory-pool handle shared by several captures (``torch.cuda.graph_pool_handle``)."""

    # ---------------------------------------------------------- sampler
    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        """The vendor's V1 sampler (``vllm.v1.sample.sampler.Sampler`` /
        ``vllm_ascend.sample.sampler.AscendSampler``) with the driver's sampling rules
        (``Backend.prepare_sampler``): called as ``sampler(logits=[num_reqs, vocab] float,
        sampling_metadata=SamplingMetadata)``, returning ``SamplerOutput(sampled_token_ids=[num_reqs, 1] int32, ...)``."""

    # ---------------------------------------------------------- buffers
    def make_buffer(self, *size: int, dtype: "torch.dtype", numpy: bool = True) -> Any:
        """A CPU/device buffer pair with ``vllm.v1.utils.CpuGpuBuffer`` semantics (``.cpu``, ``.gpu``, ``.np``;
        ``numpy`` must be False for bfloat16), pinned when the device supports it."""

    def copy_to_device(self, buffer: Any, n: int | None = None) -> "torch.Tensor":
        """Copy ``buffer.cpu[:n]`` into ``buffer.gpu[:n]`` and return the device slice, safe to consume by the
        next kernel and safe against the caller rewriting ``buffer.cpu`` right after. Where H2D is not
        stream-ordered (``Capabilities.h2d_stream_ordered``) the driver copies blocking or makes the current
        stream wait on an event."""

    # ---------------------------------------------------------- attention metadata, KV cache
    def common_attn_metadata_cls(self) -> type:
        """The common attention-metadata class the vendor builders take
        (``vllm.v1.attention.backend.CommonAttentionMetadata`` /
        ``vllm_ascend.attention.utils.AscendCommonAttentionMetadata``)."""

    def write_kv_cache(self, key: "torch.Tensor", value: "torch.Tensor", key_cache: "torch.Tensor",
                       value_cache: "torch.Tensor", slot_mapping: "torch.Tensor") -> None:
        """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into the paged caches
        ``[num_blocks, block_size, num_kv_heads, head_size]`` at ``slot_mapping`` (int64, slot = block *
        block_size + offset); a slot < 0 is padding and is never written. Raises ``ValueError`` for a slot
        past the end of the cache."""


#: the operations of :class:`KitOps`, in definition order
KIT_OPS: tuple[str, ...] = tuple(n for n in vars(KitOps) if not n.startswith("_") and callable(vars(KitOps)[n]))


def missing_kit_ops(cls: type) -> list[str]:
    """The :data:`KIT_OPS` that driver class ``cls`` does not define (in :data:`KIT_OPS` order)."""
    return [n for n in KIT_OPS if not callable(getattr(cls, n, None))]


__all__ = ["KIT_OPS", "KitOps", "missing_kit_ops"]
