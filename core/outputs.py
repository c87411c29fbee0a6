"""Omni output types: what a model returns and what the runner hands vLLM."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Iterator, NamedTuple

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


def flatten_multimodal(mm: dict[str, Any] | None) -> dict[str, Any]:
    """``{category: {qualifier: v}}`` -> ``{"category.qualifier": v}`` (vLLM-Omni's
    key naming, e.g. ``"codes.audio"``); a non-dict top-level value keeps its key."""
    flat: dict[str, Any] = {}
    for key, value in (mm or {}).items():
        if isinstance(value, dict):
            for qual, v in value.items():
                flat[f"{key}.{qual}"] = v
        else:
            flat[key] = value
    return flat


@dataclasses.dataclass
class OmniModelRunnerOutput(ModelRunnerOutput):
    """vLLM's ``ModelRunnerOutput`` plus this step's multimodal outputs.

    ``multimodal_outputs``: req_id -> name -> CPU tensor for *this step*
    (per-token outputs have first dim = tokens scheduled for the request in
    this step). The scheduler carries them to the engine's output.
    """

    multimodal_outputs: dict[str, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)


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
    """One step's multimodal outputs, ``req_id -> name -> CPU tensor``, built on first read.

    The runner adds whole-step tensors (:meth:`add_rows`: one host tensor ``[num_tokens, ...]`` per name
    and each request's row count, so a request's output is a zero-copy view of its rows) and per-request
    values (:meth:`add_item`); a device-to-host copy still in flight is fenced by :meth:`add_fence`
    (called before the first read). A name added twice for a request in one step is concatenated along
    dim 0 (a 0-d value replaced). Read-only as a ``Mapping``; reading waits for the fences.
    """

    __slots__ = ("_parts", "_fences", "_items")

    def __init__(self) -> None:
        self._parts: list[tuple] = []
        self._fences: list[Callable[[], Any]] = []
        self._items: dict[str, dict[str, torch.Tensor]] | None = None

    def add_rows(self, req_ids: list[str], lengths: list[int], tensors: dict[str, torch.Tensor],
                 skip: list[int] | None = None) -> None:
        """``tensors``: name -> host tensor whose first ``sum(lengths)`` rows are the requests' rows in
        order; request ``i`` gets rows ``skip[i]:`` of its ``lengths[i]`` (``skip``: rows it emitted
        before; ``None``: none). A request left with no rows gets no entry."""
        if tensors:
            self._parts.append((req_ids, lengths, tensors, skip))

    def add_item(self, req_id: str, name: str, value: torch.Tensor) -> None:
        """Request ``req_id``'s ``name`` this step (a per-request value, already on the host)."""
        self._parts.append((req_id, name, value))

    def add_fence(self, wait: Callable[[], Any]) -> None:
        """``wait()`` runs before the first read (e.g. an event's ``synchronize``)."""
        self._fences.append(wait)

    def drop(self, req_ids: Any) -> None:
        """Forget the outputs of ``req_ids`` (finished or aborted before the step was handed over)."""
        if self._parts or self._items:
            items = self._build()
            for r in req_ids:
                items.pop(r, None)

    def _build(self) -> dict[str, dict[str, torch.Tensor]]:
        """Fold the parts added since the last read into the per-request dicts (after the fences)."""
        items = self._items
        if items is None:
            items = self._items = {}
        if not self._parts:
            return items
        fences, self._fences = self._fences, []
        for wait in fences:
            wait()
        parts, self._parts = self._parts, []
        for part in parts:
            if len(part) == 3:
                _put(items, *part)
                continue
            req_ids, lengths, tensors, skip = part
            total = sum(lengths)
            for name, host in tensors.items():
                views = host[:total].split(lengths)
                if skip is None and not items:  # the step's first part: one dict per request, at once
                    items.update((r, {name: v}) for r, n, v in zip(req_ids, lengths, views) if n)
                elif skip is None:
                    for r, n, v in zip(req_ids, lengths, views):
                        if n:
                            _put(items, r, name, v)
                else:
                    for r, n, k, v in zip(req_ids, lengths, skip, views):
                        if n > k:
                            _put(items, r, name, v[k:] if k else v)
        return items

    def as_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """The built ``req_id -> name -> tensor`` dict itself (live: do not change it)."""
        return self._build()

    def __bool__(self) -> bool:
        return bool(self._parts or self._items) and bool(self._build())

    def __getitem__(self, req_id: str) -> dict[str, torch.Tensor]:
        return self._build()[req_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build()) if self._parts or self._items else 0

    def __repr__(self) -> str:
        return f"StepOutputs({self._build()!r})"


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
