"""The omni outputs on their way from the model to the caller, and the host memory they live in.

- What a model returns and what the runner hands vLLM: :class:`OmniOutput` (vLLM-Omni's four fields),
  :class:`StepRows` (one step's host tensors with each request's row range, the msgspec part of an engine-core
  output), :class:`OmniModelRunnerOutput` (vLLM's ``ModelRunnerOutput`` plus ``omni_rows``).
- In the worker: :class:`StepOutputs` (a step's outputs, read once), copied into :class:`HostSlabs` (a few large
  host slabs, one open per trailing shape and dtype, instead of one tensor per step).
- In the front end: :class:`StepLog` (the steps since the requests' last reads, logged once per step) and each
  request's :class:`StepAccumulator` (its rows, concatenated on read); :func:`merge_step_outputs`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, Callable, Iterator, NamedTuple

import msgspec
import torch
from vllm.v1.outputs import ModelRunnerOutput

#: the fields of vLLM-Omni's ``OmniOutput`` (``vllm_omni/model_executor/models/output_templates.py``)
OMNI_OUTPUT_FIELDS = ("text_hidden_states", "multimodal_outputs", "intermediate_tensors", "next_token_id")


class OmniOutput(NamedTuple):
    """What an omni model's ``forward`` returns instead of a bare tensor: the
    same four fields, in the same order, as vLLM-Omni's ``OmniOutput``
    (:func:`as_omni_output` accepts either class).

    - ``text_hidden_states``: ``[num_tokens, hidden]`` -- what vLLM's
      ``compute_logits`` and sampler see; ``None`` for a model whose forward
      produces no text (vLLM-Omni's code2wav).
    - ``multimodal_outputs``: ``{name: value}`` or nested
      ``{category: {qualifier: value}}``; a tensor whose first dim is
      ``num_tokens`` is sliced per request by the runner, a list with one
      entry per request is handed out by request position.
    - ``intermediate_tensors``, ``next_token_id``: carried, not read.
    """

    text_hidden_states: torch.Tensor | None
    multimodal_outputs: dict[str, Any] | None = None
    intermediate_tensors: Any = None
    next_token_id: torch.Tensor | None = None


def as_omni_output(out: Any) -> Any:
    """``out`` as an :class:`OmniOutput` when it is one (ours or vLLM-Omni's
    NamedTuple, or the plain 4-tuple a graph wrapper's weak-ref step turns it
    into), else ``None``."""
    if isinstance(out, tuple):
        if getattr(type(out), "_fields", None) == OMNI_OUTPUT_FIELDS:
            return out
        if type(out) is tuple and len(out) == 4 and (out[1] is None or isinstance(out[1], dict)):
            return OmniOutput(*out)
    return None


class StepRows(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    """One step's multimodal outputs, step-major: what travels runner -> scheduler -> front end, once per
    step (not once per request).

    - ``tensors``: name -> host tensor ``[rows, ...]``; request ``req_ids[i]``'s rows this step are
      ``starts[i]:ends[i]`` (``ends[i] == starts[i]``: none this step, e.g. rows it emitted before).
    - ``item_req_ids`` / ``item_names`` / ``item_values``: per-request values (a model output that is a
      list with one entry per request), one entry each, in order.

    A msgspec struct (vLLM's msgpack encoder carries its tensors across the engine-core process boundary;
    it pickles for the multiprocess executor). Read per request with :func:`rows_per_request` or
    :meth:`StepLog.steps`.
    """

    req_ids: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    tensors: dict[str, torch.Tensor] = {}
    item_req_ids: list[str] = []
    item_names: list[str] = []
    item_values: list[torch.Tensor] = []

    def only(self, keep: Callable[[str], bool]) -> "StepRows":
        """These rows restricted to the requests for which ``keep(req_id)`` is true (the same tensors)."""
        sel = [i for i, r in enumerate(self.req_ids) if keep(r)]
        items = [i for i, r in enumerate(self.item_req_ids) if keep(r)]
        return StepRows([self.req_ids[i] for i in sel], [self.starts[i] for i in sel], [self.ends[i] for i in sel],
                        self.tensors, [self.item_req_ids[i] for i in items], [self.item_names[i] for i in items],
                        [self.item_values[i] for i in items])


def rows_per_request(blocks: list[StepRows]) -> dict[str, dict[str, torch.Tensor]]:
    """``req_id -> name -> tensor`` of one step's :class:`StepRows` (views of the step's host tensors; a name a
    request has twice is concatenated along dim 0, a 0-d value replaced). A request without rows gets no entry."""
    items: dict[str, dict[str, torch.Tensor]] = {}
    for b in blocks:
        for name, host in b.tensors.items():
            for r, s, e in zip(b.req_ids, b.starts, b.ends):
                if e > s:
                    _put(items, r, name, host[s:e])
        for r, name, v in zip(b.item_req_ids, b.item_names, b.item_values):
            _put(items, r, name, v)
    return items


@dataclasses.dataclass
class OmniModelRunnerOutput(ModelRunnerOutput):
    """vLLM's ``ModelRunnerOutput`` plus this step's multimodal outputs.

    ``omni_rows``: the step's outputs step-major (:class:`StepRows`: one host tensor per name and each
    request's row range), which the scheduler forwards as they are. ``multimodal_outputs``: the same as
    ``req_id -> name -> CPU tensor`` (per-token outputs have first dim = the request's new rows this step),
    built when read.
    """

    omni_rows: list[StepRows] = dataclasses.field(default_factory=list)

    @property
    def multimodal_outputs(self) -> dict[str, dict[str, torch.Tensor]]:
        return rows_per_request(self.omni_rows)


def merge_step_outputs(steps: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate one request's per-step outputs along dim 0 (``[sum_tokens, ...]``);
    a 0-d tensor (e.g. a sample rate) keeps its last value."""
    merged: dict[str, list[torch.Tensor]] = {}
    for step in steps:
        for key, value in step.items():
            merged.setdefault(key, []).append(value)
    return {k: (v[-1] if v[-1].dim() == 0 else torch.cat(v, dim=0)) if len(v) > 1 else v[0]
            for k, v in merged.items()}


class StepOutputs(Mapping):
    """One step's multimodal outputs as the runner collects them; handed over step-major (:meth:`rows`).

    The runner adds whole-step tensors (:meth:`add_rows`: one host tensor ``[num_tokens, ...]`` per name and
    each request's row count) and per-request values (:meth:`add_item`); a device-to-host copy still in
    flight is fenced by :meth:`add_fence` (waited for before the first read). :meth:`rows` gives the step as
    :class:`StepRows` (what the runner output carries); read as a ``Mapping`` it is ``req_id -> name -> CPU
    tensor`` (zero-copy views of the requests' rows; a name added twice for a request in one step is
    concatenated along dim 0, a 0-d value replaced), built when read.
    """

    __slots__ = ("_parts", "_fences", "_items", "_dropped", "_rows", "_built")

    def __init__(self) -> None:
        self._parts: list[StepRows] = []
        self._fences: list[Callable[[], Any]] = []
        self._items: tuple[list[str], list[str], list[torch.Tensor]] | None = None
        self._dropped: set[str] = set()
        self._rows: list[StepRows] | None = None
        self._built: dict[str, dict[str, torch.Tensor]] | None = None

    def add_rows(self, req_ids: list[str], lengths: list[int], tensors: dict[str, torch.Tensor],
                 skip: list[int] | None = None) -> None:
        """``tensors``: name -> host tensor whose first ``sum(lengths)`` rows are the requests' rows in
        order; request ``i`` gets rows ``skip[i]:`` of its ``lengths[i]`` (``skip``: rows it emitted
        before; ``None``: none). A request left with no rows gets no entry."""
        ends = list(accumulate(lengths))
        starts = [0, *ends[:-1]]
        if skip is not None:
            starts = [min(start + skipped, end) for start, skipped, end in zip(starts, skip, ends)]
        self.add_spans(req_ids, starts, ends, tensors)

    def add_spans(self, req_ids: list[str], starts: list[int], ends: list[int],
                  tensors: dict[str, torch.Tensor]) -> None:
        """``tensors``: name -> host tensor; request ``req_ids[i]`` gets its rows ``starts[i]:ends[i]``."""
        if tensors:
            self._parts.append(StepRows(req_ids, starts, ends, tensors))
            self._rows = self._built = None

    def add_item(self, req_id: str, name: str, value: torch.Tensor) -> None:
        """Request ``req_id``'s ``name`` this step (a per-request value, already on the host)."""
        if self._items is None:
            self._items = ([], [], [])
        for column, v in zip(self._items, (req_id, name, value)):
            column.append(v)
        self._rows = self._built = None

    def add_fence(self, wait: Callable[[], Any]) -> None:
        """``wait()`` runs before the first read (e.g. an event's ``synchronize``)."""
        self._fences.append(wait)

    def drop(self, req_ids: Any) -> None:
        """Forget the outputs of ``req_ids`` (finished or aborted before the step was handed over)."""
        if self._parts or self._items:
            self._dropped.update(req_ids)
            self._rows = self._built = None

    def empty(self) -> bool:
        """True when nothing was added (reads nothing, waits for nothing)."""
        return not (self._parts or self._items)

    def rows(self) -> list[StepRows]:
        """The step step-major, after the fences: one :class:`StepRows` per :meth:`add_rows` call (and one
        for the per-request values), dropped requests left out."""
        if self._rows is not None:
            return self._rows
        fences, self._fences = self._fences, []
        for wait in fences:
            wait()
        rows = list(self._parts)
        if self._items is not None:
            rows.append(StepRows(item_req_ids=self._items[0], item_names=self._items[1], item_values=self._items[2]))
        dropped = self._dropped
        if dropped:
            rows = [b.only(lambda r: r not in dropped) for b in rows]
        self._rows = rows
        return rows

    def as_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """The built ``req_id -> name -> tensor`` dict itself (live: do not change it)."""
        if self._built is None:
            self._built = rows_per_request(self.rows()) if not self.empty() else {}
        return self._built

    def __bool__(self) -> bool:
        return not self.empty() and bool(self.as_dict())

    def __getitem__(self, req_id: str) -> dict[str, torch.Tensor]:
        return self.as_dict()[req_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __repr__(self) -> str:
        return f"StepOutputs({self.as_dict()!r})"


def _put(items: dict[str, dict[str, torch.Tensor]], req_id: str, name: str, value: torch.Tensor) -> None:
    step = items.get(req_id)
    if step is None:
        items[req_id] = {name: value}
    elif name in step and value.dim() > 0:
        step[name] = torch.cat([step[name], value])
    else:
        step[name] = value


class StepAccumulator:
    """One request's multimodal outputs over its steps, concatenated along dim 0 in amortised O(new rows).

    :meth:`append` keeps a step (``name -> tensor``) as it is; :meth:`merged` folds the steps appended
    since into one growing buffer per name (capacity doubling, exact on the first fold) and returns
    ``name -> buffer[:rows]`` views, so reading after every step (``CUMULATIVE`` outputs) costs the new
    rows, not the whole request again. A view already handed out keeps its rows. Same result as
    :func:`merge_step_outputs` over all steps: a name seen once is that tensor itself, a 0-d value keeps
    its last one; steps whose trailing shapes or dtypes differ are concatenated with ``torch.cat`` (which
    raises as it does there).
    """

    __slots__ = ("_pending", "_bufs", "_rows", "_single")

    def __init__(self) -> None:
        self._pending: list[dict[str, torch.Tensor]] = []
        self._bufs: dict[str, torch.Tensor] = {}
        self._rows: dict[str, int] = {}
        self._single: dict[str, torch.Tensor] = {}  # seen once (or 0-d): kept as is

    def append(self, step: dict[str, torch.Tensor]) -> None:
        self._pending.append(step)

    def extend(self, steps: list[dict[str, torch.Tensor]]) -> None:
        self._pending.extend(steps)

    def __len__(self) -> int:
        return len(self._pending) + len(self._bufs) + len(self._single)

    def merged(self) -> dict[str, torch.Tensor]:
        pending, self._pending = self._pending, []
        new: dict[str, list[torch.Tensor]] = {}
        for step in pending:
            for key, value in step.items():
                new.setdefault(key, []).append(value)
        for key, values in new.items():
            if values[-1].dim() == 0:
                self._single[key] = values[-1]
                continue
            first = self._single.pop(key, None)
            if first is not None:
                values.insert(0, first)
            if key not in self._bufs and len(values) == 1:
                self._single[key] = values[0]
                continue
            self._extend(key, values)
        out = {k: v[: self._rows[k]] for k, v in self._bufs.items()}
        out.update(self._single)
        return out

    def _extend(self, key: str, values: list[torch.Tensor]) -> None:
        buf, rows = self._bufs.get(key), self._rows.get(key, 0)
        if buf is None:  # the first fold (FINAL_ONLY: the only one): one torch.cat, exact size
            cat = torch.cat(values)
            self._bufs[key], self._rows[key] = cat, int(cat.shape[0])
            return
        if any(v.shape[1:] != buf.shape[1:] or v.dtype != buf.dtype for v in values):
            cat = torch.cat([buf[:rows], *values])  # what merge_step_outputs does (and raises as it does)
            self._bufs[key], self._rows[key] = cat, int(cat.shape[0])
            return
        add = sum(int(v.shape[0]) for v in values)
        if rows + add > buf.shape[0]:  # capacity doubling: amortised O(new rows) per read
            grown = buf.new_empty((max(rows + add, 2 * rows), *buf.shape[1:]))
            grown[:rows].copy_(buf[:rows])
            buf = self._bufs[key] = grown
        if len(values) == 1:
            buf[rows : rows + add].copy_(values[0])
        else:
            torch.cat(values, out=buf[rows : rows + add])
        self._rows[key] = rows + add


class StepLog:
    """The front end's log of the engine's steps (:class:`StepRows`, in the order they arrived), read per
    request only when that request's output is made (:meth:`steps`).

    Positions count the :class:`StepRows` logged since the log began (usually one per step): :attr:`end` is
    where the next goes; a reader keeps the ``end`` of its last read and passes it as ``since``. :meth:`clear` forgets the steps logged so far
    (``end`` stays): the caller first folds what every live reader has not read yet (the output processor,
    every :data:`STEP_LOG_STEPS` steps), so the log holds a bounded number of steps.

    A step's tensors are held as rows of a slab: the runner's :class:`HostSlabs` slab itself for a tensor the
    runner's slabs made in this process (an in-process engine: no copy), else a copy into the log's own slabs
    (tensors decoded from vLLM's multiprocess transport, one per step). A request's rows over many steps are then
    one ``index_select`` per slab (``FINAL_ONLY``: once, at its finish), not a view per step.
    """

    __slots__ = ("_blocks", "_slabs", "start")

    def __init__(self) -> None:
        self._blocks: list[tuple] = []  # (req_id -> (start, end), name -> (slab, first row), per-request values)
        self._slabs = HostSlabs()
        #: position of the first step still held
        self.start = 0

    @property
    def end(self) -> int:
        """Position after the last step logged."""
        return self.start + len(self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def extend(self, blocks: list[StepRows]) -> None:
        """Log one engine step's :class:`StepRows` (their tensors as slab rows; the blocks are not kept). Per
        step: a ``req_id -> (start, end)`` dict (built in C), and a copy per name unless the tensor is already
        slab rows."""
        for b in blocks:
            where = {name: getattr(t, "_omni_slab", None) or self._slabs.place(t) for name, t in b.tensors.items()}
            rows = dict(zip(b.req_ids, zip(b.starts, b.ends)))
            items = (_positions(b.item_req_ids), b.item_names, b.item_values) if b.item_req_ids else None
            self._blocks.append((rows, where, items))

    def clear(self) -> None:
        """Forget the steps logged so far (their readers must have read them)."""
        self.start = self.end
        self._blocks = []

    def steps(self, req_id: str, since: int) -> list[dict[str, torch.Tensor]]:
        """``req_id``'s outputs in the steps logged at positions ``since`` and after, in order, as a list of
        ``name -> tensor`` dicts (concatenated along dim 0 they are the request's rows of those steps): the
        token-aligned rows of all those steps first (a view for one step's rows, else gathered), then the
        per-request values step by step. Raises ``ValueError`` if ``since`` is before :attr:`start` (those
        steps were cleared unread)."""
        if since < self.start:
            raise ValueError(f"request {req_id}: steps {since}..{self.start - 1} were cleared before it read them")
        runs: list[tuple[dict, int, int]] = []
        items: list[dict[str, torch.Tensor]] = []
        for rows, where, per_request in self._blocks[since - self.start :]:
            se = rows.get(req_id)
            if se is not None and se[1] > se[0]:
                runs.append((where, se[0], se[1]))
            if per_request is not None and req_id in per_request[0]:
                step: dict[str, torch.Tensor] = {}
                for p in per_request[0][req_id]:
                    name, value = per_request[1][p], per_request[2][p]
                    step[name] = torch.cat([step[name], value]) if name in step and value.dim() > 0 else value
                items.append(step)
        if not runs:
            return items
        names = runs[0][0]
        if items and any(name in names for step in items for name in step):
            return self._per_step(runs) + items  # a name both per token and per request: per-step order
        return [{name: _gather([(w[name], s, e) for w, s, e in runs]) for name in names}] + items

    @staticmethod
    def _per_step(parts: list[tuple[dict, int, int]]) -> list[dict[str, torch.Tensor]]:
        return [{name: slab[off + s : off + e] for name, (slab, off) in w.items()} for w, s, e in parts]


def _gather(runs: list[tuple[tuple[torch.Tensor, int], int, int]]) -> torch.Tensor:
    """Rows ``off + s : off + e`` of each run's slab, concatenated: a view for one run; otherwise one
    ``index_select`` per host slab, and for a device slab (:class:`DeviceSlabs`) its runs' views concatenated on
    the device (no index built on the host and copied over: that copy would wait for the device)."""
    if len(runs) == 1:
        (slab, off), s, e = runs[0]
        return slab[off + s : off + e]
    out: list[torch.Tensor] = []
    i = 0
    while i < len(runs):
        slab = runs[i][0][0]
        if not slab.is_cpu:
            while i < len(runs) and runs[i][0][0] is slab:
                (_, off), s, e = runs[i]
                out.append(slab[off + s : off + e])
                i += 1
            continue
        rows: list[int] = []
        while i < len(runs) and runs[i][0][0] is slab:
            (_, off), s, e = runs[i]
            if e - s == 1:
                rows.append(off + s)
            else:
                rows.extend(range(off + s, off + e))
            i += 1
        out.append(slab.index_select(0, torch.tensor(rows, dtype=torch.long)))
    return out[0] if len(out) == 1 else torch.cat(out)


def _positions(keys: list[str]) -> dict[str, list[int]]:
    pos: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        pos.setdefault(k, []).append(i)
    return pos


#: steps the front end's :class:`StepLog` holds before it folds them into the live requests' accumulators
STEP_LOG_STEPS = 64


class HostSlabs:
    """Host memory for the steps' outputs: rows are copied into a few large slabs (one open slab per trailing
    shape and dtype, append-only), each step's rows a view of one slab, instead of one new tensor per step.

    Why: a step's host copy lives until every request that has rows in it read them (``FINAL_ONLY``: at its
    finish, many steps later); one allocation per step kept that long made vLLM's own forward measurably
    slower on cpu (``bench/RESULTS.md``, decode overhead), and a page-locked
    allocation per step costs a driver call. A slab is never written twice: when its rows are used up a new
    one is opened (``max(rows, n)`` rows), the old one freed by the allocator once no view of it is left.
    ``pin``: page-locked slabs (for non-blocking device-to-host copies).
    """

    __slots__ = ("rows", "pin", "_open")
    #: one open slab per device too (:class:`DeviceSlabs`); host slabs: per trailing shape and dtype
    by_device = False

    def __init__(self, rows: int = 4096, pin: bool = False) -> None:
        self.rows, self.pin = int(rows), pin
        self._open: dict[tuple, list] = {}  # (trailing shape, dtype) -> [slab, next free row]

    def copy(self, t: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """A host view ``[n, ...]`` holding ``t``'s rows (``t``: ``[n, ...]``, any device); ``non_blocking``:
        the copy may still be in flight (the caller fences it)."""
        slab, at, view = self._place(t, non_blocking)
        view._omni_slab = (slab, at)  # type: ignore[attr-defined]  # read by StepLog.extend (same process only)
        return view

    def place(self, t: torch.Tensor, non_blocking: bool = False) -> tuple[torch.Tensor, int]:
        """:meth:`copy` as ``(slab, first row)``. (A view :meth:`copy` returns carries that pair as its
        ``_omni_slab`` attribute, a Python attribute that does not survive serialisation.)"""
        return self._place(t, non_blocking)[:2]

    def _place(self, t: torch.Tensor, non_blocking: bool) -> tuple[torch.Tensor, int, torch.Tensor]:
        """``(slab, first row, the view of the rows)``, ``t`` copied in (one slice of the slab: a tensor
        index is a few microseconds of host time, once per step and output)."""
        n = t.shape[0]
        key = (t.shape[1:], t.dtype, t.device) if self.by_device else (t.shape[1:], t.dtype)
        entry = self._open.get(key)
        if entry is None or entry[1] + n > entry[0].shape[0]:
            entry = self._open[key] = [self._new_slab(t, max(self.rows, n)), 0]
        slab, at = entry
        view = slab[at : at + n]
        view.copy_(t, non_blocking=non_blocking)
        entry[1] = at + n
        return slab, at, view

    def _new_slab(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.empty((rows, *t.shape[1:]), dtype=t.dtype, pin_memory=self.pin)


class DeviceSlabs(HostSlabs):
    """:class:`HostSlabs` on the device of the tensors copied in (one open slab per trailing shape, dtype and
    device): a step's rows kept where the forward made them, for a caller in the same process
    (:class:`~core.hooks.step_rows.StepRowsCollector`'s ``outputs_on_device``). The copy is a device-to-device
    copy on the current stream: a later read on that stream needs no fence."""

    __slots__ = ()
    by_device = True

    def _new_slab(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        return t.new_empty((rows, *t.shape[1:]))
