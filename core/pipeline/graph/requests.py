"""What a caller of the stage graph gets back: :class:`AudioChunk` (streamed) and :class:`SpeechResult` (last).
The request is the declaration's (what its ``PipelineSpec.check`` takes). Imports neither vLLM nor torch."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class AudioChunk:
    """Audio streamed as soon as the audio stage made it: ``samples`` float32 ``[n]``, mono, in [-1, 1], at
    :attr:`StageGraph.sample_rate`; ``codes`` int64 ``[k, K]``, the frames these samples synthesise
    (``n = k * StageGraph.hop_length``); ``ready_at``: ``time.perf_counter()`` when it was ready."""

    index: int
    samples: Any
    codes: Any
    ready_at: float


@dataclasses.dataclass(frozen=True)
class SpeechResult:
    """The last item of :meth:`StageGraph.synthesize`: ``text`` the first stage's text (the demo thinker's; ""
    where it makes none), ``prompt_tokens`` / ``generated_tokens`` the first stage's, ``codes`` int64 ``[T, K]``
    (every frame the audio stage decoded), ``samples`` the number of samples streamed, ``timings`` in seconds:
    one per stage (its requests, submit to finish; the audio stage summed over its chunks), ``first_chunk``
    (submit to the first chunk ready), ``<producer>_finished`` (submit to the frame stage's last frame, e.g.
    ``talker_finished``), ``total``."""

    request_id: str
    text: str
    prompt_tokens: int
    generated_tokens: int
    codes: Any
    samples: int
    timings: dict[str, float]
