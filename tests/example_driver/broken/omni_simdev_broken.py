"""Deliberately broken copies of the simdev driver, one broken contract each.

Not part of the simdev distribution: ``tests/test_kit.py`` registers each
class under its own driver name (a generated ``.dist-info`` with an
``omni_backends.drivers`` entry point) and checks that the conformance kit
fails it with a message naming the broken contract. Every variant differs
from :class:`omni_simdev.driver.SimDevBackend` in exactly one place, but one:
:class:`QueueCopyDoesNotQueue`, a vendor's report (issue 48) of two faults
where the first hid the second from the kit's ordering checks.
"""

from __future__ import annotations

import contextlib
from typing import Any

from omni_simdev.device import SimGraph
from omni_simdev.driver import SimDevBackend, SimGraphWrapper


def _without(cls: type, method: str | tuple[str, ...], name: str) -> type:
    """``cls`` rebuilt on the same bases without ``method`` (one name or several): what a vendor gets
    by forgetting to write it (an abstract method is abstract again; otherwise a base's method shows)."""
    drop = (method,) if isinstance(method, str) else method
    namespace = {k: v for k, v in vars(cls).items() if k not in (*drop, "__dict__", "__weakref__")}
    namespace["name"] = name
    return type(name.replace("-", "_"), cls.__bases__, namespace)


#: missing method: ``to_host`` (the ordering-safe device-to-host copy) was never written.
MissingMethod = _without(SimDevBackend, "to_host", "simdev-broken-missing")


class _StaleGraph(SimGraph):
    """Replays the captured work once, then keeps returning that output."""

    def replay(self) -> None:
        if not getattr(self, "_replayed", False):
            self._replayed = True
            super().replay()


class StaleGraphReplay(SimDevBackend):
    """graph replay returns stale output: only the first replay recomputes."""

    name = "simdev-broken-graph"

    def new_graph(self) -> Any:
        return _StaleGraph()


class InFlightCopySource(SimDevBackend):
    """copy path reuses an in-flight source: H2D is queued non-blocking although
    this device does not order it, so the copy reads ``buffer.cpu`` after the
    caller has rewritten it."""

    name = "simdev-broken-copy"

    def copy_to_device(self, buffer: Any, n: int | None = None):
        src = buffer.cpu if n is None else buffer.cpu[:n]
        dst = buffer.gpu if n is None else buffer.gpu[:n]
        return self._device.copy(dst, src, blocking=False)


class TieBreakingSampler(SimDevBackend):
    """sampler breaks ties differently: greedy picks the *last* of tied maxima."""

    name = "simdev-broken-sampler"

    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        import torch
        from vllm.v1.sample.sampler import Sampler

        class LastTieSampler(Sampler):
            @staticmethod
            def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
                vocab = logits.shape[-1]
                return (vocab - 1 - logits.flip(-1).argmax(dim=-1)).view(-1)

        return LastTieSampler(logprobs_mode=logprobs_mode)


class TopKTiesSampler(SimDevBackend):
    """sampler leaves ``top_k=1`` random on tied maxima: vLLM's own ``Sampler`` without the
    one-token rule (greedy ties are right, so only the one-token checks fail)."""

    name = "simdev-broken-ties"

    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        from vllm.v1.sample.sampler import Sampler

        return Sampler(logprobs_mode=logprobs_mode)

    def prepare_sampler(self, sampler: Any) -> Any:
        return sampler


class OldInterface(SimDevBackend):
    """speaks only an interface version this omni-backends does not (the registry refuses it)."""

    name = "simdev-broken-version"
    interface_versions = (99,)


#: kit ops: ``set_device`` was never written (no shared base writes it for this driver).
MissingKitOp = _without(SimDevBackend, "set_device", "simdev-broken-kitops")


class ProbeRaises(SimDevBackend):
    """probe breaks its never-raise promise."""

    name = "simdev-broken-probe"

    @classmethod
    def probe(cls):
        raise OSError("libsimdev.so: cannot open shared object file")


class SwappedMemoryInfo(SimDevBackend):
    """device ops: ``memory_info`` returns (total, free) instead of (free, total)."""

    name = "simdev-broken-memory"

    def memory_info(self) -> tuple[int, int]:
        free, total = super().memory_info()
        return total, free // 2


class _EventThatDoesNotWait:
    """An event whose wait/synchronize return at once: nothing queued before it is flushed."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def record(self, stream: Any = None) -> None:
        self._inner.record(stream)

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return self._inner.elapsed_time(end._inner)


class EventsDoNotWait(SimDevBackend):
    """streams/events: waiting on an event does not wait for the work recorded before it."""

    name = "simdev-broken-events"

    def new_event(self, enable_timing: bool = False) -> Any:
        return _EventThatDoesNotWait(super().new_event(enable_timing))


class StreamNeverRestored(SimDevBackend):
    """stream context makes the stream current and never restores the previous one."""

    name = "simdev-broken-stream-restore"

    def stream_context(self, stream: Any):
        self._device._local.stream = stream
        return contextlib.nullcontext(stream)


class StreamContextDoesNothing(SimDevBackend):
    """stream context does nothing at all."""

    name = "simdev-broken-stream-noop"

    def stream_context(self, stream: Any):
        return contextlib.nullcontext(stream)


class SeedIgnored(SimDevBackend):
    """generator ignores the seed."""

    name = "simdev-broken-generator"

    def generator(self, seed: int) -> Any:
        import torch

        return torch.Generator(device=self.device())  # torch's default seed, whatever ``seed`` is


class _StaleWrapper(SimGraphWrapper):
    """Captures on the first call in its mode and then returns that output without replaying."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available() or get_forward_context().cudagraph_runtime_mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        key = get_forward_context().batch_descriptor
        if key not in self._graphs:
            graph = self._backend.new_graph()
            with self._backend.graph_capture(graph):
                out = self.runnable(*args, **kwargs)
            self._graphs[key] = (graph, out)
        return self._graphs[key][1]  # never replayed


class StaleGraphWrapper(SimDevBackend):
    """graph wrapping: the wrapper captures once and returns the capture-time output without replaying."""

    name = "simdev-broken-wrap-graph"

    def wrap_graph(self, runnable: Any, vllm_config: Any, runtime_mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        if runtime_mode == CUDAGraphMode.NONE:
            return runnable
        return _StaleWrapper(self, runnable, runtime_mode)


#: graph wrapping: inherits the CUDA graph bases (VllmUpstreamBackend.wrap_graph / graph_capture_context,
#: vLLM's CUDAGraphWrapper) on a device that is not CUDA.
InheritsCudaGraphBases = _without(SimDevBackend, ("wrap_graph", "graph_capture_context"), "simdev-broken-cuda-graphs")


class ToHostTooEarly(SimDevBackend):
    """to_host returns before the copies queued into the tensor have landed."""

    name = "simdev-broken-to-host"

    def to_host(self, tensor: Any) -> Any:
        return tensor.detach().clone()


class QueueCopyDoesNotQueue(_without(SimDevBackend, "queue_copy", "simdev-broken-queue-copy")):
    """kit ops: ``queue_copy`` was never written, so the shared base's ``dst.copy_(src, non_blocking=True)`` copies
    at once on this device that queues its copies (nothing is ever in flight for the ordering checks), and
    ``to_host`` returns without flushing the copies queued into the tensor (which those checks would catch)."""

    name = "simdev-broken-queue-copy"
    to_host = ToHostTooEarly.to_host


class UnpinnedBuffer(SimDevBackend):
    """buffer: ``.np`` is a copy, not a view of ``.cpu``."""

    name = "simdev-broken-buffer"

    def make_buffer(self, *size: int, dtype: Any, numpy: bool = True) -> Any:
        buf = super().make_buffer(*size, dtype=dtype, numpy=numpy)
        if numpy:
            buf.np = buf.np.copy()
        return buf


class SlotMappingDropped(SimDevBackend):
    """forward context drops ``slot_mapping``."""

    name = "simdev-broken-fc-slots"

    def forward_context(self, attn_metadata: Any, vllm_config: Any, **kw: Any) -> Any:
        kw.pop("slot_mapping", None)
        return super().forward_context(attn_metadata, vllm_config, **kw)


class NumTokensIgnored(SimDevBackend):
    """forward context ignores ``num_tokens``."""

    name = "simdev-broken-fc-tokens"

    def forward_context(self, attn_metadata: Any, vllm_config: Any, **kw: Any) -> Any:
        kw["num_tokens"] = None
        return super().forward_context(attn_metadata, vllm_config, **kw)


class OwnCaptureSizes(SimDevBackend):
    """capture sizes: the driver defines its own ladder."""

    name = "simdev-broken-capture-sizes"

    @staticmethod
    def capture_sizes(max_batch: int) -> list[int]:
        return [1, max_batch]


class AttnMetadataWithoutSlots(SimDevBackend):
    """attention metadata: the class lacks ``slot_mapping``."""

    name = "simdev-broken-attn-metadata"

    def common_attn_metadata_cls(self) -> type:
        import dataclasses

        @dataclasses.dataclass
        class NoSlots:
            query_start_loc: Any
            query_start_loc_cpu: Any
            seq_lens: Any
            num_reqs: int
            num_actual_tokens: int

        return NoSlots


class PaddingWritten(SimDevBackend):
    """KV padding slots: a slot of -1 is used as an index (``cache[-1]`` is the last slot)."""

    name = "simdev-broken-kv-padding"

    def write_kv_cache(self, key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any) -> None:
        import torch

        slots = slot_mapping[: key.shape[0]].to(torch.int64)
        capacity = key_cache.shape[0] * key_cache.shape[1]
        for src, cache in ((key, key_cache), (value, value_cache)):
            cache.view(capacity, *cache.shape[2:])[slots] = src.to(cache.dtype)


#: driver name -> (class path, the contract the kit must name, a test that must fail); one variant per contract
#: the device tier checks (``engine`` is the engine tier's: tests/test_kit.py says where it is exercised)
VARIANTS = {
    "simdev-broken-missing": ("omni_simdev_broken:MissingMethod", "interface-completeness",
                              "test_interface.py::test_every_abstract_method_is_implemented"),
    "simdev-broken-version": ("omni_simdev_broken:OldInterface", "interface-version",
                              "test_interface.py::test_every_abstract_method_is_implemented"),
    "simdev-broken-kitops": ("omni_simdev_broken:MissingKitOp", "kit-ops",
                             "test_interface.py::test_every_abstract_method_is_implemented"),
    "simdev-broken-queue-copy": ("omni_simdev_broken:QueueCopyDoesNotQueue", "kit-ops",
                                 "test_device_ops.py::test_to_host_waits_for_queued_copies"),
    "simdev-broken-probe": ("omni_simdev_broken:ProbeRaises", "probe", "test_interface.py::test_probe_returns_result"),
    "simdev-broken-memory": ("omni_simdev_broken:SwappedMemoryInfo", "device-ops",
                             "test_device_ops.py::test_memory_info_and_empty_cache"),
    "simdev-broken-events": ("omni_simdev_broken:EventsDoNotWait", "streams-events",
                             "test_device_ops.py::test_stream_event_ordering"),
    "simdev-broken-stream-restore": ("omni_simdev_broken:StreamNeverRestored", "stream-context",
                                     "test_device_ops.py::test_stream_context_sets_and_restores_the_current_stream"),
    "simdev-broken-stream-noop": ("omni_simdev_broken:StreamContextDoesNothing", "stream-context",
                                  "test_device_ops.py::test_stream_context_sets_and_restores_the_current_stream"),
    "simdev-broken-generator": ("omni_simdev_broken:SeedIgnored", "generator",
                                "test_device_ops.py::test_generator_reproducible"),
    "simdev-broken-graph": ("omni_simdev_broken:StaleGraphReplay", "graph-replay",
                            "test_graphs.py::test_replay_recomputes_from_persistent_inputs"),
    "simdev-broken-wrap-graph": ("omni_simdev_broken:StaleGraphWrapper", "graph-wrapping",
                                 "test_graphs.py::test_wrap_graph_captures_then_replays_in_each_declared_mode"),
    "simdev-broken-cuda-graphs": ("omni_simdev_broken:InheritsCudaGraphBases", "graph-wrapping",
                                  "test_graphs.py::test_wrap_graph_captures_then_replays_in_each_declared_mode"),
    "simdev-broken-copy": ("omni_simdev_broken:InFlightCopySource", "copy-ordering",
                           "test_buffers.py::test_source_may_be_rewritten_right_after_copy"),
    "simdev-broken-to-host": ("omni_simdev_broken:ToHostTooEarly", "to-host",
                              "test_device_ops.py::test_to_host_waits_for_queued_copies"),
    "simdev-broken-buffer": ("omni_simdev_broken:UnpinnedBuffer", "buffer", "test_buffers.py::test_make_buffer_pair"),
    "simdev-broken-fc-slots": ("omni_simdev_broken:SlotMappingDropped", "forward-context",
                               "test_forward_context.py::test_round_trip"),
    "simdev-broken-fc-tokens": ("omni_simdev_broken:NumTokensIgnored", "forward-context",
                                "test_forward_context.py::test_what_vllm_derives_from_the_arguments"),
    "simdev-broken-capture-sizes": ("omni_simdev_broken:OwnCaptureSizes", "capture-sizes",
                                    "test_capture_sizes.py::test_driver_uses_the_shared_policy"),
    "simdev-broken-attn-metadata": ("omni_simdev_broken:AttnMetadataWithoutSlots", "attn-metadata",
                                    "test_attn_metadata.py::test_common_attn_metadata_class"),
    "simdev-broken-kv-padding": ("omni_simdev_broken:PaddingWritten", "kv-padding-slots",
                                 "test_attn_metadata.py::test_padding_slots_never_written"),
    "simdev-broken-sampler": ("omni_simdev_broken:TieBreakingSampler", "sampler-equivalence",
                              "test_sampler.py::test_greedy_ties"),
    "simdev-broken-ties": ("omni_simdev_broken:TopKTiesSampler", "sampler-equivalence",
                           "test_sampler.py::test_one_token_edges_on_ties_are_greedy"),
}
