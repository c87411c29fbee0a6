"""The omni outputs on their way from the model to the caller: what crosses between the model, the worker, the
engine core and the front end (as vLLM's ``v1/outputs.py`` holds its cross-process types).

- What a model returns and what the runner hands vLLM: :class:`OmniOutput` (vLLM-Omni's four fields),
  :class:`StepRows` (one step's host tensors with each request's row range, the msgspec part of an engine-core
  output), :class:`OmniModelRunnerOutput` (vLLM's ``ModelRunnerOutput`` plus ``omni_rows``).
- A step's outputs as the worker hands them over: :class:`StepOutputs` (read once); a request's rows of steps:
  :func:`rows_per_request`, :func:`merge_step_outputs`.

The memory the rows live in is :mod:`core.slabs`; the front end's log of them :mod:`core.step_log`.
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
