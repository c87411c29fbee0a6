"""M-RoPE positions for omni models (text, image/video grids, audio runs).

vLLM's runner computes M-RoPE positions by calling the model's
``get_mrope_input_positions(input_tokens, mm_features)`` (the
``vllm.model_executor.models.interfaces.SupportsMRoPE`` protocol) and then
``position + delta`` for decode tokens. :class:`OmniMRoPEMixin` gives omni
models that protocol from one declaration: how to turn a feature into a span.

Layout (as Qwen2-VL defines it): text tokens advance all three channels
(t, h, w) together; a ``grid_t x grid_h x grid_w`` span takes 3-D indices
offset by the running start; text after a span continues from the largest
position used + 1. ``delta = max_position + 1 - num_tokens`` shifts decode
positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class MRoPESpan:
    """A multimodal placeholder run: ``offset`` in the prompt and its grid.

    Audio (1-D) is ``grid_t = length, grid_h = grid_w = 1``. ``t_factor``
    scales the temporal index (e.g. seconds per video frame x tokens/s).
    """

    offset: int
    grid_t: int
    grid_h: int = 1
    grid_w: int = 1
    t_factor: float = 1.0

    @property
    def length(self) -> int:
        return self.grid_t * self.grid_h * self.grid_w


def mrope_positions(num_tokens: int, spans: Iterable[MRoPESpan]) -> tuple[torch.Tensor, int]:
    """Positions int64 ``[3, num_tokens]`` and the decode delta.

    Raises ``ValueError`` if spans overlap, are unsorted or run past ``num_tokens``.
    """
    parts: list[np.ndarray] = []
    st = 0

    def next_start() -> int:
        return int(parts[-1].max()) + 1 if parts else 0

    for span in spans:
        if span.offset < st:
            raise ValueError(f"M-RoPE spans must be sorted and non-overlapping: span at {span.offset} starts before {st}")
        if span.offset + span.length > num_tokens:
            raise ValueError(f"M-RoPE span at {span.offset} of {span.length} tokens runs past the prompt ({num_tokens})")
        text_len = span.offset - st
        base = next_start()
        parts.append(np.broadcast_to(np.arange(text_len), (3, text_len)) + base)
        grid = np.indices((span.grid_t, span.grid_h, span.grid_w)).reshape(3, -1)
        if span.t_factor != 1.0:
            grid[0] = (grid[0] * span.t_factor).astype(np.int64)
        parts.append(grid + text_len + base)
        st = span.offset + span.length
    if st < num_tokens:
        base = next_start()
        parts.append(np.broadcast_to(np.arange(num_tokens - st), (3, num_tokens - st)) + base)
    pos = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)
    delta = int(pos.max()) + 1 - num_tokens if num_tokens else 0
    return torch.from_numpy(np.ascontiguousarray(pos, dtype=np.int64)), delta


def mrope_decode_positions(delta: int, context_len: int, num_new: int) -> torch.Tensor:
    """Positions int64 ``[3, num_new]`` of tokens ``context_len ..`` after the prompt."""
    return torch.arange(context_len + delta, context_len + delta + num_new, dtype=torch.int64).expand(3, -1).clone()


class OmniMRoPEMixin:
    """Implements vLLM's ``SupportsMRoPE.get_mrope_input_positions``.

    A model declares ``omni_mrope_span(feature) -> MRoPESpan | None`` (a
    ``MultiModalFeatureSpec`` -> its span; ``None`` = treat as text).
    """

    supports_mrope = True

    def omni_mrope_span(self, feature: Any) -> MRoPESpan | None:  # pragma: no cover - model specific
        raise NotImplementedError("an M-RoPE omni model must define omni_mrope_span(feature)")

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        spans = [s for s in (self.omni_mrope_span(f) for f in mm_features) if s is not None]
        return mrope_positions(len(input_tokens), sorted(spans, key=lambda s: s.offset))
