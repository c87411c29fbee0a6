"""A step's multimodal outputs, from the forward's output to the step's rows, in one call per step.

:class:`StepRowsCollector` is the one place where a real step's outputs become
:class:`~core.outputs.StepRows`: :meth:`StepRowsCollector.collect` reads the batch's offsets, skips the rows
a request emitted before (recomputed after preemption), places each token-aligned tensor's rows for the whole
step (one copy per name, into a few large slabs) and fences the copies still in flight, with no further call
into the project per tensor; :meth:`StepRowsCollector.runner_output` hands the step to vLLM's
``ModelRunnerOutput``. :class:`~core.hooks.OmniHooks` owns one per runner.

Where the rows go: into host slabs, non-blocking into page-locked ones where the driver's copies are
stream-ordered (``Capabilities.d2h_stream_ordered`` and ``pinned_memory``) and fenced by an event
(``Backend.new_event``; ``Backend.synchronize`` where the driver declares no events); or, with
:attr:`StepRowsCollector.outputs_on_device` (asked for by the caller of an in-process engine,
``core.stage.make_engine(..., outputs_on_device=True)``, through the worker's ``omni_outputs_on_device``), into
slabs on the forward's own device (:class:`~core.slabs.DeviceSlabs`): a device-to-device copy on the current
stream, no host copy and no fence per step. The rows then stay on the device until the caller reads them
(``RequestOutput.multimodal_outputs`` holds device tensors) -- device memory outside vLLM's budget, held as
host rows are: until every request with rows in a slab has read them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import numpy as np
import torch

from core.outputs import OmniModelRunnerOutput, StepOutputs, StepRows
from core.slabs import DeviceSlabs, HostSlabs
from omni_backends.backend import Backend

#: events a :class:`StepRowsCollector` records its steps' device-to-host copies with, in turn (:meth:`record_fence`)
FENCE_EVENTS = 4


class StepRowsCollector:
    """One runner's step outputs on their way to :class:`~core.outputs.StepRows` (see the module docstring).

    - :meth:`collect`: one step's outputs (``name -> value``, nested ``{category: {qualifier: value}}`` named
      ``category.qualifier``): a tensor with at least ``num_tokens`` rows is token-aligned (each request's rows
      this step, past those it emitted before), a list / tuple with one entry per request is per request.
    - :meth:`take` / :meth:`runner_output`: the step handed over once.
    - :attr:`emitted`: ``req_id -> positions whose outputs were emitted`` (forgotten by :meth:`drop`).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        #: req_id -> number of token positions whose outputs were already emitted
        self.emitted: dict[str, int] = {}
        self.step = StepOutputs()
        #: rows stay on the forward's device (the caller reads them in this process); set by the front end
        self.outputs_on_device = False
        self._slabs = HostSlabs()
        self._pinned: HostSlabs | None = None
        self._device_slabs: DeviceSlabs | None = None
        #: device outputs go non-blocking into page-locked slabs (the driver's capabilities, read once)
        self._d2h_pinned: bool | None = None
        #: the fences, reused in turn (:meth:`record_fence`): ``None`` until the first, ``[]`` without events
        self._fences: list[Any] | None = None
        self._fence_next = 0

    # ------------------------------------------------------------------ the step
    def collect(self, mm: dict[str, Any], req_ids: list[str], query_start_loc: Any, num_computed: Any) -> None:
        """This step's outputs ``mm`` for the batch ``req_ids`` (``query_start_loc`` int ``[n + 1]`` token
        offsets, ``num_computed`` int ``[n]`` positions computed before the step; numpy arrays or int lists)
        into the step's rows: one placement per token-aligned tensor for the whole step (a host slab, or a
        device slab with :attr:`outputs_on_device`), fenced where a copy is in flight; per-request values
        copied to the host as they are (``Backend.to_host``). Nothing is cut per request: the front end
        slices a request's rows when it reads them."""
        n = len(req_ids)
        # the batch's offsets as int lists (a numpy array: one tolist each, as the runners hand them over)
        qsl = query_start_loc[: n + 1].tolist() if type(query_start_loc) is np.ndarray else _ints(query_start_loc, n + 1)
        first = num_computed[:n].tolist() if type(num_computed) is np.ndarray else _ints(num_computed, n)
        num_tokens = qsl[-1] if n else 0
        starts, ends = qsl[:-1], qsl[1:]
        emitted = self.emitted
        for i, rid in enumerate(req_ids):
            done, upto = emitted.get(rid, 0), first[i] + ends[i] - starts[i]
            if done > first[i]:  # positions emitted before (recomputed after preemption): skip them
                starts[i] = min(starts[i] + done - first[i], ends[i])
                upto = max(done, upto)
            emitted[rid] = upto
        tensors: dict[str, torch.Tensor] = {}
        fenced = False
        for key, value in mm.items():
            if type(value) is torch.Tensor and value.is_cpu and value.dim() and value.shape[0] >= num_tokens:
                # the common case on the host (an eager engine's own tensor, a cpu engine's buffer): one slab copy
                t = value[:num_tokens] if value.shape[0] != num_tokens else value
                tensors[key] = self._slabs.copy(t)
            elif isinstance(value, dict):  # {category: {qualifier: value}}: vLLM-Omni's "category.qualifier" names
                for qual, v in value.items():
                    fenced |= self._one(f"{key}.{qual}", v, num_tokens, req_ids, tensors)
            else:
                fenced |= self._one(key, value, num_tokens, req_ids, tensors)
        step = self.step
        if fenced:
            step.add_fence(self.record_fence())
        step.add_spans(req_ids, starts, ends, tensors)

    def _one(self, key: str, value: Any, num_tokens: int, req_ids: list[str], tensors: dict) -> bool:
        """``value`` of one name into ``tensors`` (token-aligned) or the step's items (per request); whether a
        copy of it is still in flight."""
        if isinstance(value, torch.Tensor) and value.dim() > 0 and (rows := value.shape[0]) >= num_tokens:
            t = value[:num_tokens] if rows != num_tokens else value
            if t.is_cpu:
                tensors[key] = self._slabs.copy(t)
                return False
            if self.outputs_on_device:
                slabs = self._device_slabs
                if slabs is None:
                    slabs = self._device_slabs = DeviceSlabs()
                tensors[key] = slabs.copy(t)  # stream-ordered on the forward's device: nothing to fence
                return False
            pinned_ok = self._d2h_pinned
            if pinned_ok is None:  # static per driver: read once, not per step
                caps = self.backend.capabilities()
                pinned_ok = self._d2h_pinned = bool(caps.d2h_stream_ordered and caps.pinned_memory)
            if pinned_ok:
                pinned = self._pinned
                if pinned is None:
                    pinned = self._pinned = HostSlabs(pin=True)
                tensors[key] = pinned.copy(t, non_blocking=True)
                return True
            tensors[key] = _owned(self.backend.to_host(t), t)
            return False
        if isinstance(value, (list, tuple)) and len(value) == len(req_ids):
            for req_id, item in zip(req_ids, value):
                if item is None:
                    continue
                t = item if isinstance(item, torch.Tensor) else torch.as_tensor(item)
                self.step.add_item(req_id, key, _owned(self.backend.to_host(t), t))
        return False

    def add_item(self, req_id: str, key: str, value: torch.Tensor) -> None:
        """Request ``req_id``'s ``key`` this step (a host tensor; a second one in the step is concatenated)."""
        self.step.add_item(req_id, key, value)

    def record_fence(self) -> Callable[[], Any]:
        """What to wait on before reading this step's in-flight copies: an event recorded now on the
        current stream (``Backend.new_event``), or a device synchronize where the driver declares no events
        (``Capabilities.events``).

        The events are made once, :data:`FENCE_EVENTS` of them, and recorded in turn (an event per step cost a
        device lookup and a driver call every step). A step's fence is waited for within the next step or two
        (async scheduling); should an event be recorded again before its earlier fence is waited for, that
        wait covers the later record too: it waits longer, never too little (one stream, in order)."""
        events = self._fences
        if events is None:
            backend = self.backend
            events = [backend.new_event() for _ in range(FENCE_EVENTS)] if backend.capabilities().events else []
            self._fences = events
        if not events:
            return self.backend.synchronize
        i = self._fence_next
        self._fence_next = (i + 1) % len(events)
        event = events[i]
        event.record()
        return event.synchronize

    def drop(self, req_ids: list[str]) -> None:
        """Forget finished or aborted requests: their rows not yet handed over, their watermarks."""
        self.step.drop(req_ids)
        emitted = self.emitted
        for r in req_ids:
            emitted.pop(r, None)

    # ------------------------------------------------------------------ handing over
    def take(self) -> StepOutputs:
        """This step's outputs (a read-only mapping req_id -> name -> tensor, built when first read:
        :class:`~core.outputs.StepOutputs`), handed over once."""
        step, self.step = self.step, StepOutputs()
        return step

    def runner_output(self, base: Any, step: Any = None) -> Any:
        """vLLM's ``ModelRunnerOutput`` ``base`` as an :class:`OmniModelRunnerOutput` carrying the step's rows
        (``omni_rows``: :class:`~core.outputs.StepRows`; waits for the step's copies) for the requests in it;
        ``base`` itself when there are none. ``step``: outputs taken earlier with :meth:`take` (or a
        ``req_id -> name -> tensor`` mapping); by default this step's, taken now."""
        if step is None:
            step = self.take()
        if not hasattr(base, "req_ids"):
            return base
        if isinstance(step, StepOutputs):
            if step.empty():
                return base
            rows = step.rows()
        else:
            if not step:
                return base
            rows = [_rows_of(step)]
        req_ids, index = base.req_ids, base.req_id_to_index
        for b in rows:  # a loop, not a generator: once per step, most steps one part
            if (b.req_ids != req_ids and not index.keys() >= set(b.req_ids)) \
                    or (b.item_req_ids and not index.keys() >= set(b.item_req_ids)):
                rows = [b.only(index.__contains__) for b in rows]  # requests not in vLLM's output: left out
                break
        if type(base) is OmniModelRunnerOutput.__base__ and hasattr(base, "__dict__"):
            # vLLM's own ModelRunnerOutput (a plain dataclass): its fields as they are, plus ours
            out = OmniModelRunnerOutput.__new__(OmniModelRunnerOutput)
            out.__dict__.update(base.__dict__)
            out.omni_rows = rows
            return out
        fields = {name: getattr(base, name) for name in _field_names(type(base))}
        return OmniModelRunnerOutput(**fields, omni_rows=rows)


def _rows_of(items: Any) -> StepRows:
    """A ``req_id -> name -> tensor`` mapping as one :class:`~core.outputs.StepRows` of per-request values."""
    reqs, names, values = [], [], []
    for r, step in items.items():
        for name, v in step.items():
            reqs.append(r)
            names.append(name)
            values.append(v)
    return StepRows(item_req_ids=reqs, item_names=names, item_values=values)


def _ints(values: Any, n: int) -> list[int]:
    """The first ``n`` of ``values`` (a numpy array or a list, as a ``BatchView`` holds them, or a sequence) as
    ints (a list of exactly ``n`` is returned as it is: read, not changed)."""
    if type(values) is list:
        return values if len(values) == n else values[:n]
    if isinstance(values, np.ndarray):
        return values[:n].tolist()
    out = list(values)
    return out if len(out) == n else out[:n]


def _owned(host: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``host``, cloned if it still shares memory with ``source`` (a CPU
    device's ``to_host`` returns its input; the model's outputs live in
    persistent buffers the next forward overwrites, ``core.model_io``)."""
    if host.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
        return host.clone()
    return host


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


__all__ = ["FENCE_EVENTS", "StepRowsCollector"]
