"""The stage graph: a declared pipeline's stages (:class:`core.pipeline.spec.PipelineSpec`) as resident vLLM
``AsyncLLM`` engines, started concurrently and held for the process's life; one pipeline implementation for
``omni-backends run`` (in-process client) and the server (``core.serving``). It holds no model-specific branch:
what each stage runs, how its prompt is made and its output read, and how frames stream into the audio stage
come from the declaration (:mod:`core.pipeline.declarations`: the demo, Qwen3-TTS).

A request (the declaration's: what its ``check`` takes) runs through the stages in order: each stage but the last two
hands its whole output to the next; the one before the last streams its codec frames
(``RequestOutputKind.DELTA``), cut into chunks by the declaration's :class:`~core.pipeline.spec.ChunkWindow`
(first chunk, then every ``chunk_frames``); each chunk is one request of the audio stage carrying up to
``left_context_frames`` earlier frames, of whose waveform the chunk's own frames' samples are kept -- so the
first :class:`AudioChunk` comes before the frame stage finished. Requests from many callers share the engines;
vLLM's schedulers batch them.

Lifecycle: closing :meth:`StageGraph.synthesize`'s iterator early (``aclose()``, the task cancelled) aborts the
request in every stage; a stage engine that dies (vLLM's ``EngineDeadError``, ``AsyncLLM.errored``) fails
every in-flight request with :class:`~omni_backends.errors.StageFailedError` naming the stage and marks the
graph dead (:attr:`StageGraph.dead_stage`); :meth:`StageGraph.shutdown` releases every engine and its
processes. Importing this package imports neither vLLM nor torch.

The modules (``flow`` imports the other two, which import neither each other nor it):

- :mod:`~core.pipeline.graph.requests`  :class:`AudioChunk`, :class:`SpeechResult`;
- :mod:`~core.pipeline.graph.engines`   starting the engines (:func:`prepare_environment`, the stages' memory,
  :func:`start_engines`, :func:`engine_config`) and releasing them;
- :mod:`~core.pipeline.graph.flow`      :class:`StageGraph`: the per-request flow, abort, the watchdog.
"""

from core.pipeline.config import GraphConfig
from core.pipeline.graph.engines import engine_config, prepare_environment, release_all, stage_memory, start_engines
from core.pipeline.graph.flow import WATCH_INTERVAL, StageGraph
from core.pipeline.graph.requests import AudioChunk, SpeechResult

__all__ = [
    "WATCH_INTERVAL", "AudioChunk", "GraphConfig", "SpeechResult", "StageGraph", "engine_config",
    "prepare_environment", "release_all", "stage_memory", "start_engines",
]
