"""Omni output types: what a model returns and what the runner hands vLLM."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

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
