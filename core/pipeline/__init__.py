"""The main job: a declared pipeline on real vLLM engines -- the demo's thinker -> talker (+MTP) -> code2wav,
or a checkpoint's (Qwen3-TTS: talker -> code2wav).

A pipeline is a declaration (:mod:`~core.pipeline.spec`: ``PipelineSpec`` / ``StageSpec``; the declarations in
:mod:`~core.pipeline.declarations`); the stage graph (:class:`~core.pipeline.graph.StageGraph`) runs any of
them: one resident vLLM ``AsyncLLM`` engine per stage over the core runner on the selected driver, started
concurrently; a request is pipelined through them (the frames streamed to the audio stage in chunks).
``omni-backends run`` is its in-process client, ``omni-backends serve`` (``core.serving``) its server.

:func:`run_pipeline` validates every input first (so bad input fails before
any engine starts), starts the graph, synthesises one request, shuts the
graph down, and writes its outputs into a temporary folder that is renamed
into place only when everything succeeded:

- ``out.wav``       mono 16-bit PCM at the pipeline's sample rate (the demo's 16 kHz, Qwen3-TTS's 24 kHz)
- ``thinker.txt``   the demo thinker's text (the declaration's ``text_stage``)
- ``codes.json``    the codec frames, ``[T][K]`` (codebook 0 sampled, 1..K-1 from the MTP head)
- ``summary.json``  driver and why, per-stage token counts, engine start and
  generation times, the run's wall time against the concurrent-start bound

The modules, one job each, in the order they call one another (each imports
only those below it):

- :mod:`~core.pipeline.run`      ``run_pipeline``: device, checks, the graph, outputs;
- :mod:`~core.pipeline.graph`    the stage graph (``StageGraph``, ``AudioChunk``, ``SpeechResult``), the shared
  interface of ``run`` and the server; a package: ``requests``, ``engines``, ``flow``;
- :mod:`~core.pipeline.declarations`  the declared pipelines and which one a model runs (``resolve``); each owns
  its stages, its speech request and its ``run`` options;
- :mod:`~core.pipeline.spec`     ``PipelineSpec``, ``StageSpec``, ``ChunkWindow``, ``PipelineModel``, ``SpeechApi``,
  ``RequestOption``;
- :mod:`~core.pipeline.audio`    the audio bytes (``pcm16``, ``wav_bytes``) of ``out.wav`` and the server;
- :mod:`~core.pipeline.inputs`   the demo's inputs on disk (``validate_models``), the output folder's check;
- :mod:`~core.pipeline.config`   ``RunConfig``, ``GraphConfig``, the shared engine settings, the device defaults;
- :mod:`~core.pipeline.fields`   the request field checks the declarations, the graph and serving share
  (``FieldError``, ``SpeechOptions``);
- :mod:`~core.pipeline.faults`   reading a stage's failure, the dead-engine watchdog;
- :mod:`~core.pipeline.release`  releasing an engine (shutdown, then its processes gone).

Engines are built by the async engine factory, :func:`core.stage.make_async_engine`
(with :func:`core.stage.make_engine`'s checks), which also owns the
engine-choice checks (:func:`core.stage.check_engine_choices`, re-exported
here). Importing this package imports neither vLLM nor torch.
"""

from core.pipeline.config import MAX_CHUNK_FRAMES, GraphConfig, RunConfig, device_defaults, engine_kw
from core.pipeline.faults import DEVICE_MEMORY_SIGNS, ENGINE_DEAD_ERROR
from core.pipeline.fields import MAX_SEED
from core.pipeline.graph import engine_config
from core.pipeline.release import (
    ENGINE_CORE_PROCESSES,
    ENGINE_CORE_SHUTDOWN,
    ENGINE_RELEASE_TIMEOUT,
    engine_processes,
    release_engine,
    shutdown_engine,
    wait_engine_released,
)
from core.pipeline.run import run_pipeline
from core.stage import GRAPH_MODES, RUNNERS, check_engine_choices

__all__ = [
    "DEVICE_MEMORY_SIGNS", "ENGINE_CORE_PROCESSES", "ENGINE_CORE_SHUTDOWN", "ENGINE_DEAD_ERROR",
    "ENGINE_RELEASE_TIMEOUT", "GRAPH_MODES", "MAX_CHUNK_FRAMES", "MAX_SEED", "RUNNERS",
    "GraphConfig", "RunConfig", "check_engine_choices",
    "device_defaults", "engine_config", "engine_kw", "engine_processes", "release_engine", "run_pipeline",
    "shutdown_engine", "wait_engine_released",
]
