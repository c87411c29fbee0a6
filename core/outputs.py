"""Omni output types: what a model returns and what the runner hands vLLM."""

from __future__ import annotations

import dataclasses
import torch
from vllm.v1.outputs import ModelRunnerOutput


@dataclasses.dataclass
class OmniOutput:
    """What an omni model's ``forward`` returns instead of a bare tensor.

    - ``text_hidden_states``: ``[num_tokens, hidden]`` -- what vLLM's
      ``compute_logits`` and sampler see (the usual forward result).
    - ``multimodal_outputs``: name -> tensor whose first dim is ``num_tokens``
      (per-token outputs, e.g. hidden states), sliced per request by the runner.
    """

    text_hidden_states: torch.Tensor
    multimodal_outputs: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class OmniModelRunnerOutput(ModelRunnerOutput):
    """vLLM's ``ModelRunnerOutput`` plus this step's multimodal outputs.

    ``multimodal_outputs``: req_id -> name -> CPU tensor for *this step*
    (per-token outputs have first dim = tokens scheduled for the request in
    this step). The scheduler carries them to the engine's output.
    """

    multimodal_outputs: dict[str, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)


def merge_step_outputs(steps: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate one request's per-step outputs along dim 0 (``[sum_tokens, ...]``)."""
    merged: dict[str, list[torch.Tensor]] = {}
    for step in steps:
        for key, value in step.items():
            merged.setdefault(key, []).append(value)
    return {k: torch.cat(v, dim=0) if len(v) > 1 else v[0] for k, v in merged.items()}
