"""What a caller of the stage graph hands in and gets back: :class:`SpeechRequest` and its check
(:func:`check_request`, the one :meth:`~core.pipeline.graph.StageGraph.check` runs), :class:`AudioChunk`,
:class:`SpeechResult`, and the frame schedule every caller shares (:func:`talker_frames`,
:func:`chunk_bounds`). Imports neither vLLM nor torch."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection

from core.pipeline.config import MAX_SEED, TALKER_MAX_MODEL_LEN, THINKER_MAX_MODEL_LEN
from core.pipeline.inputs import check_prompt_fits
from omni_backends.errors import BadInputError


@dataclasses.dataclass(frozen=True)
class SpeechRequest:
    """One synthesis, checked by :func:`check_request` before any engine work.

    ``text``: the thinker prompt, non-empty, fitting ``THINKER_MAX_MODEL_LEN`` tokens with ``max_tokens``;
    ``voice``: talker voice id, ``0..num_voices-1``; ``seed``: the thinker's sampling seed, ``0..2**32-1``
    (temperature 0.8, top_p 0.95); ``max_tokens``: thinker tokens, ``1..THINKER_MAX_MODEL_LEN-1`` (the talker
    makes ``2 * max_tokens`` frames, bounded by its context); ``request_id``: ``None`` for a fresh id."""

    text: str
    voice: int = 0
    seed: int = 0
    max_tokens: int = 32
    request_id: str | None = None


@dataclasses.dataclass(frozen=True)
class AudioChunk:
    """Audio streamed as soon as code2wav made it: ``samples`` float32 ``[n]``, mono, in [-1, 1], at
    :attr:`StageGraph.sample_rate`; ``codes`` int64 ``[k, K]``, the talker frames these samples synthesise
    (``n = k * hop_length``); ``ready_at``: ``time.perf_counter()`` when it was ready."""

    index: int
    samples: Any
    codes: Any
    ready_at: float


@dataclasses.dataclass(frozen=True)
class SpeechResult:
    """The last item of :meth:`StageGraph.synthesize`: ``codes`` int64 ``[T, K]`` (every frame), ``samples``
    the number of samples streamed, ``timings`` in seconds: ``thinker``, ``talker``, ``code2wav`` (each
    stage's requests, submit to finish; code2wav summed over its chunks), ``first_chunk`` (submit to the
    first chunk ready), ``talker_finished`` (submit to the talker's last frame), ``total``."""

    request_id: str
    thinker_text: str
    prompt_tokens: int
    thinker_tokens: int
    codes: Any
    samples: int
    timings: dict[str, float]


def check_request(req: SpeechRequest, *, num_voices: int, count_tokens: Callable[[str], int],
                  in_flight: Collection[str] = ()) -> None:
    """Check ``req`` without engine work: its type, ``text`` non-empty, ``voice`` in ``0..num_voices-1``,
    ``seed`` in ``0..MAX_SEED``, ``max_tokens`` in ``1..THINKER_MAX_MODEL_LEN-1`` (integers, not bools),
    ``request_id`` non-empty text or ``None`` and not in ``in_flight``, then the prompt (``count_tokens(text)``
    thinker tokens) plus ``max_tokens`` fitting the thinker's context (:func:`check_prompt_fits`). Raises
    :class:`BadInputError` (a ``ValueError``) naming the field."""
    if not isinstance(req, SpeechRequest):
        raise BadInputError(f"expected a SpeechRequest, got {type(req).__name__}")
    if not isinstance(req.text, str) or not req.text.strip():
        raise BadInputError(f"text must be non-empty text, got {req.text!r}"[:200])
    for name, lo, hi in (("voice", 0, num_voices - 1), ("seed", 0, MAX_SEED),
                         ("max_tokens", 1, THINKER_MAX_MODEL_LEN - 1)):
        value = getattr(req, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadInputError(f"{name} must be an integer, got {value!r}")
        if not lo <= value <= hi:
            raise BadInputError(f"{name} must be in {lo}..{hi}, got {value}")
    if req.request_id is not None:
        if not isinstance(req.request_id, str) or not req.request_id.strip():
            raise BadInputError(f"request_id must be non-empty text or None, got {req.request_id!r}")
        if req.request_id in in_flight:
            raise BadInputError(f"request_id {req.request_id!r} is already in flight; use another id")
    check_prompt_fits(count_tokens(req.text), req.max_tokens, field="max_tokens")


def talker_frames(prompt_embeds: int, max_tokens: int) -> int:
    """Frames the talker makes for ``prompt_embeds`` thinker rows and ``max_tokens`` thinker tokens: twice
    ``max_tokens``, bounded by the talker's context, at least one."""
    return max(1, min(max_tokens * 2, TALKER_MAX_MODEL_LEN - prompt_embeds - 1))


def chunk_bounds(frames: int, chunk_frames: int) -> list[tuple[int, int]]:
    """The chunk schedule, ``[(start, end), ...]`` frame ranges of ``chunk_frames`` (the last shorter): the
    same for ``run`` and the server, streamed or not."""
    return [(s, min(s + chunk_frames, frames)) for s in range(0, frames, chunk_frames)]
