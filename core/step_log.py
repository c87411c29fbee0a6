"""The front end's log of the steps' multimodal outputs: :class:`StepLog` (the steps since the requests' last
reads, logged once per step, their tensors as slab rows) and each request's :class:`StepAccumulator` (its rows,
concatenated on read), what ``core.engine.OmniOutputProcessor`` keeps. Front-end process only; what crosses from
the engine core is :class:`core.outputs.StepRows`.
"""

from __future__ import annotations

import torch

from core.outputs import StepRows, merge_step_outputs
from core.slabs import HostSlabs


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
