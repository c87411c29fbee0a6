"""One captured device graph over persistent inputs, on a driver's torch-level graph primitive: a benchmark
helper (``bench/bench_cuda.py``, ``bench/bench_talker_mtp.py``; tested by ``tests/test_static_graph.py``), not
used by the core or the kit. Moved here from ``omni_backends.torch_device``."""

from __future__ import annotations

from typing import Any


class StaleGraphInputError(ValueError):
    """A replay was given a tensor that is not the persistent input captured in the graph."""


class StaticGraph:
    """One captured device graph over persistent (static) input tensors.

    Built on a driver's torch-level graph primitive (``KitOps.new_graph``,
    ``KitOps.graph_capture``, ``KitOps.graph_pool_handle``), the way
    ``CUDAGraphWrapper`` is built on ``torch.cuda.CUDAGraph``.

    ``fn(*static_inputs)`` is run ``warmup`` times on a side stream, then
    captured once. A replay re-runs the captured kernels on the *same memory*:
    new input values must be written in place into ``static_inputs`` (e.g.
    ``x.copy_(new)`` or ``KitOps.copy_to_device`` into a persistent buffer);
    outputs are the same tensors (:attr:`outputs`) every replay, overwritten.

    Graphs sharing a ``pool`` must be replayed in the order they were
    captured (torch's rule: a later capture may reuse an earlier capture's
    freed intermediates, so replaying the earlier graph afterwards can
    overwrite the later graph's outputs).

    With ``debug=True`` (or ``check=True`` on one call), :meth:`replay` takes
    the inputs the caller believes it is feeding and raises
    :class:`StaleGraphInputError` if any is not the captured tensor (a freshly
    allocated tensor would be silently ignored by the graph). vLLM's
    ``CUDAGraphWrapper`` makes the same address check under
    ``VLLM_LOGGING_LEVEL=DEBUG``.
    """

    def __init__(
        self,
        backend: Any,
        fn: Any,
        static_inputs: tuple[Any, ...] | list[Any],
        *,
        pool: Any = None,
        warmup: int = 2,
        debug: bool = False,
    ) -> None:
        if not backend.capabilities().static_graphs:
            raise NotImplementedError(f"driver {backend.name!r} has no static graphs (capabilities().static_graph_modes is empty)")
        self.static_inputs = tuple(static_inputs)
        self.debug = debug
        self._addresses = tuple(t.data_ptr() for t in self.static_inputs)
        main = backend.current_stream()
        side = backend.new_stream()
        side.wait_stream(main)
        with backend.stream_context(side):
            for _ in range(warmup):
                fn(*self.static_inputs)
        main.wait_stream(side)
        self.graph = backend.new_graph()
        with backend.graph_capture(self.graph, pool=pool):
            self.outputs = fn(*self.static_inputs)

    def check_inputs(self, *inputs: Any) -> None:
        """Raise :class:`StaleGraphInputError` unless ``inputs`` are the captured tensors (same storage address)."""
        if len(inputs) != len(self._addresses):
            raise StaleGraphInputError(f"graph was captured with {len(self._addresses)} inputs, replay got {len(inputs)}")
        for i, (t, addr) in enumerate(zip(inputs, self._addresses)):
            if t.data_ptr() != addr:
                raise StaleGraphInputError(
                    f"input {i} is not the persistent tensor captured in the graph (address {t.data_ptr():#x} != "
                    f"{addr:#x}): a fresh tensor is ignored by replay. Write new values in place into "
                    f"static_inputs[{i}] (tensor.copy_(new)) instead of passing a new tensor."
                )

    def replay(self, *inputs: Any, check: bool = False) -> Any:
        """Replay the graph on the current stream and return :attr:`outputs` (not synchronized).

        ``inputs`` are only checked (debug mode or ``check=True``); values come
        from the persistent ``static_inputs``.
        """
        if (check or self.debug) and inputs:
            self.check_inputs(*inputs)
        self.graph.replay()
        return self.outputs
