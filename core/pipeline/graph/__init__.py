"""The stage graph: the main job's three stages as resident vLLM ``AsyncLLM`` engines, started concurrently and
held for the process's life; one pipeline implementation for ``omni-backends run`` (in-process client) and the
server (``core.serving``).

A request (:class:`SpeechRequest`) runs thinker -> talker -> code2wav: the thinker's text and per-token hidden
states (the talker's prompt embeddings need all of them, so the talker starts when the thinker finished); the
talker's frames streamed (``RequestOutputKind.DELTA``) and cut into chunks of ``chunk_frames``; each chunk a
code2wav request carrying every frame up to the chunk's end (the demo code2wav is a causal decoder), of whose
waveform the chunk's rows are kept -- so the chunks' samples concatenated are what one whole-sequence forward
gives, and the first :class:`AudioChunk` comes before the talker finished. Requests from many callers share the
engines; vLLM's schedulers batch them.

Lifecycle: closing :meth:`StageGraph.synthesize`'s iterator early (``aclose()``, the task cancelled) aborts the
request in every stage; a stage engine that dies (vLLM's ``EngineDeadError``, ``AsyncLLM.errored``) fails
every in-flight request with :class:`~omni_backends.errors.StageFailedError` naming the stage and marks the
graph dead (:attr:`StageGraph.dead_stage`); :meth:`StageGraph.shutdown` releases every engine and its
processes. Importing this package imports neither vLLM nor torch.

The modules (``flow`` imports the other two, which import neither each other nor it):

- :mod:`~core.pipeline.graph.requests`  :class:`SpeechRequest` and its check (:func:`check_request`),
  :class:`AudioChunk`, :class:`SpeechResult`, the frame schedule (:func:`talker_frames`, :func:`chunk_bounds`);
- :mod:`~core.pipeline.graph.engines`   starting the engines (:func:`prepare_environment`, the stages' memory,
  :func:`start_engines`, :func:`engine_config`) and releasing them;
- :mod:`~core.pipeline.graph.flow`      :class:`StageGraph`: the per-request flow, abort, the watchdog.
"""

from core.pipeline.config import GraphConfig
from core.pipeline.graph.engines import _release_all, _stage_memory, engine_config, prepare_environment, start_engines
from core.pipeline.graph.flow import THINKER_TEMPERATURE, THINKER_TOP_P, WATCH_INTERVAL, StageGraph
from core.pipeline.graph.requests import (AudioChunk, SpeechRequest, SpeechResult, check_request, chunk_bounds,
                                          talker_frames)

__all__ = [
    "THINKER_TEMPERATURE", "THINKER_TOP_P", "WATCH_INTERVAL", "AudioChunk", "GraphConfig", "SpeechRequest",
    "SpeechResult", "StageGraph", "check_request", "chunk_bounds", "engine_config", "prepare_environment",
    "start_engines", "talker_frames",
]
