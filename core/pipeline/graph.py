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
processes. Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import time
import uuid
from typing import Any, AsyncIterator, Callable

from core.kinds import AR, GENERATION
from core.pipeline.config import (
    ENGINE_KW,
    MAX_SEED,
    STAGES,
    TALKER_MAX_MODEL_LEN,
    THINKER_MAX_MODEL_LEN,
    GraphConfig,
    device_defaults,
    engine_kw,
)
from core.pipeline.faults import failure_cause
from core.pipeline.inputs import check_prompt_fits
from omni_backends.errors import BadInputError, StageFailedError

#: the thinker's sampling (as ``omni-backends run`` always had it); the seed is the request's
THINKER_TEMPERATURE, THINKER_TOP_P = 0.8, 0.95
#: seconds between the watchdog's looks at each engine (``AsyncLLM.errored``)
WATCH_INTERVAL = 0.2


@dataclasses.dataclass(frozen=True)
class SpeechRequest:
    """One synthesis, checked by :meth:`StageGraph.check` before any engine work.

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


def talker_frames(prompt_embeds: int, max_tokens: int) -> int:
    """Frames the talker makes for ``prompt_embeds`` thinker rows and ``max_tokens`` thinker tokens: twice
    ``max_tokens``, bounded by the talker's context, at least one."""
    return max(1, min(max_tokens * 2, TALKER_MAX_MODEL_LEN - prompt_embeds - 1))


def chunk_bounds(frames: int, chunk_frames: int) -> list[tuple[int, int]]:
    """The chunk schedule, ``[(start, end), ...]`` frame ranges of ``chunk_frames`` (the last shorter): the
    same for ``run`` and the server, streamed or not."""
    return [(s, min(s + chunk_frames, frames)) for s in range(0, frames, chunk_frames)]


def prepare_environment(cfg: GraphConfig, backend: Any) -> GraphConfig:
    """``cfg`` with the device's defaults (:func:`device_defaults`), its engine choices checked
    (:func:`core.stage.check_engine_choices`) and vLLM's variables set for the engines to come:
    ``VLLM_USE_V2_MODEL_RUNNER`` (``--runner``), ``VLLM_ENABLE_V1_MULTIPROCESSING`` (``--multiprocess``: with
    ``AsyncLLM`` every stage's engine core runs in its own process whatever it says; the variable decides
    whether that engine core runs its worker in another process, vLLM's ``mp`` executor, e.g. on the cpu
    driver, or in itself, the ``uni`` executor). Raises :class:`BadInputError`; imports no vLLM."""
    from core.stage import check_engine_choices

    given = cfg.multiprocess is not None
    cfg = device_defaults(cfg, backend)
    runner = check_engine_choices(cfg, backend)
    if runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    if given:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.multiprocess else "0"
    else:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if cfg.multiprocess else "0")
    return cfg


def _stage_memory(backend: Any, model_dirs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each stage's ``kv_cache_memory_bytes`` / ``gpu_memory_utilization`` (``engine_memory_kw``), and one
    check that the three together fit the device's free memory.

    Why, for three engines starting at once on one device (vLLM 0.32 ``vllm/v1/worker/gpu_worker.py``):
    ``init_device`` snapshots free memory and ``request_memory`` refuses a start with less free than
    ``gpu_memory_utilization * total`` -- a snapshot that sees whatever the other stages allocated so far.
    Checking the sum here, before any engine starts, makes every stage's check pass whatever the order of
    the others' allocations. ``determine_available_memory`` would profile (``memory_profiling``: free memory
    before and after a dummy forward, asserting no other process changed it) -- wrong with neighbours
    allocating concurrently; every stage passes ``kv_cache_memory_bytes``, which skips that profiling, so no
    stage's KV size depends on another's start."""
    import math

    from omni_backends.engine_memory import engine_memory_kw

    mem = {stage: engine_memory_kw(backend, model_dirs[stage], max_model_len=_MAX_LEN[stage],
                                   max_num_seqs=ENGINE_KW["max_num_seqs"], dtype=ENGINE_KW["dtype"])
           for stage in STAGES}
    for stage, kw in mem.items():  # the concurrent start is safe only without vLLM's profiling (see above)
        assert kw.get("kv_cache_memory_bytes"), f"stage {stage} has no fixed KV size: {kw}"
    free, total = backend.memory_info()
    need = sum(math.ceil(kw["gpu_memory_utilization"] * total) for kw in mem.values())
    if need > free:
        raise BadInputError(f"the three stages need about {need / 2**30:.2f} GiB of {backend.name} device memory "
                            f"together but only {free / 2**30:.2f} GiB of {total / 2**30:.2f} GiB is free; free "
                            "the device (other processes) or pick another device with --device")
    return mem


_MAX_LEN = {"thinker": THINKER_MAX_MODEL_LEN, "talker": TALKER_MAX_MODEL_LEN, "code2wav": TALKER_MAX_MODEL_LEN}
_KIND = {"thinker": AR, "talker": AR, "code2wav": GENERATION}


def engine_config(engine: Any) -> dict[str, Any]:
    """What vLLM resolved for a stage's engine (a ``vllm.LLM`` or an ``AsyncLLM``): runner, graphs,
    scheduling, process layout, memory."""
    cfg = getattr(getattr(engine, "llm_engine", engine), "vllm_config")
    cc = cfg.compilation_config
    return {
        "model_runner": "v2" if getattr(cfg, "use_v2_model_runner", False) else "v1",
        "enforce_eager": bool(cfg.model_config.enforce_eager),
        "compilation_mode": getattr(cc.mode, "name", str(cc.mode)),
        "cudagraph_mode": getattr(cc.cudagraph_mode, "name", str(cc.cudagraph_mode)),
        "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
        # the worker in a process of its own (vLLM's mp executor); an AsyncLLM's engine core always is one
        "multiprocess": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0",
        "engine_core_process": not hasattr(engine, "llm_engine") or os.environ.get(
            "VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0",
        "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
        # as vLLM applied them (vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE override the KV size)
        "kv_cache_memory_bytes": cfg.cache_config.kv_cache_memory_bytes,
        "gpu_memory_utilization": cfg.cache_config.gpu_memory_utilization,
    }


class StageGraph:
    """Three resident ``AsyncLLM`` engines (thinker AR, talker AR, code2wav GENERATION) over the core runner
    on the selected driver. Make it with :meth:`start`; see the module doc."""

    sample_rate: int
    num_voices: int
    hop_length: int
    stage_info: dict[str, dict[str, Any]]
    dead_stage: str | None

    def __init__(self, cfg: GraphConfig, engines: dict[str, Any], configs: dict[str, dict[str, Any]],
                 tokenizer: Any, stage_info: dict[str, dict[str, Any]]) -> None:
        self.cfg = cfg
        self.engines = engines
        self.configs = configs
        self.tokenizer = tokenizer
        self.stage_info = stage_info
        self.sample_rate = int(configs["code2wav"].get("sample_rate", 16000))
        self.num_voices = int(configs["talker"].get("num_voices", 1))
        self.hop_length = int(configs["code2wav"].get("hop_length", 160))
        self.dead_stage = None
        self._dead = asyncio.Event()
        self._dead_waiter: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._in_flight: set[str] = set()
        self._owner: dict[str, str] = {}  # a stage request id -> the graph request id
        self._ids = itertools.count()
        self._closed = False

    # ------------------------------------------------------------------ start, stop
    @classmethod
    async def start(cls, cfg: GraphConfig, backend: Any = None, say: Callable[[str], None] | None = None
                    ) -> "StageGraph":
        """Start the three engines concurrently (each ``core.stage.make_async_engine`` in a thread of its own:
        the constructors block until their engine core is up) and return the graph.

        ``backend``: the selected driver (``None``: ``registry.select(cfg.device)``). Before any engine starts:
        :class:`BadInputError` for a bad ``cfg``, engine choices the driver cannot run, missing / corrupt
        models, the stages not fitting the device together; the registry's errors for the device. An engine
        that fails to start: :class:`StageFailedError` naming its stage, after every engine that did start was
        released. ``stage_info[stage]``: ``engine_start_seconds``, the memory given, ``engine``
        (:func:`engine_config`); ``stage_info["graph"]["start_seconds"]``: the whole start's wall time."""
        from omni_backends.probing import blame_import_failures

        cfg.check()
        say = say or (lambda msg: None)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if backend is None:
            from omni_backends.registry import select

            backend = select(cfg.device).backend
        cfg = prepare_environment(cfg, backend)
        with blame_import_failures():
            if cfg.model_dir is None:
                from core.pipeline.config import default_model_dir

                cfg = dataclasses.replace(cfg, model_dir=default_model_dir())
                if not os.path.isdir(cfg.model_dir):
                    from core.models.create import create_demo_models

                    say(f"creating demo models in {cfg.model_dir} (first run)")
                    create_demo_models(cfg.model_dir)
            from core.pipeline.inputs import _thinker_tokenizer, validate_models

            configs = validate_models(cfg.model_dir, backend)
            tokenizer = _thinker_tokenizer(cfg.model_dir)
            backend.check_vllm_platform()
            dirs = {stage: os.path.join(cfg.model_dir, stage) for stage in STAGES}
            mem = _stage_memory(backend, dirs)
        engines: dict[str, Any] = {}
        info: dict[str, dict[str, Any]] = {}

        def start_one(stage: str) -> None:
            from core.stage import make_async_engine  # looked up per call: a wrapper set on core.stage is used

            t0 = time.perf_counter()
            # talker and code2wav prompts are placeholder ids ([0] * n) standing for per-request embeddings / codes:
            # vLLM's prefix cache would reuse another request's (or an earlier chunk's) KV for them (seen: short
            # code2wav chunks past 128 frames); only the thinker's prompt is real text
            extra = {} if stage == "thinker" else {"skip_tokenizer_init": True, "enable_prefix_caching": False}
            if cfg.stat_loggers and cfg.stat_loggers.get(stage):
                extra["stat_loggers"] = list(cfg.stat_loggers[stage])
            engines[stage] = make_async_engine(dirs[stage], kind=_KIND[stage], device=cfg.device,
                                               max_model_len=_MAX_LEN[stage], **engine_kw(cfg), **mem[stage],
                                               **extra)
            t1 = time.perf_counter()
            info[stage] = {"engine_start_seconds": round(t1 - t0, 3), "started_at": t0 - t_graph,
                           "ready_at": t1 - t_graph,
                           **mem[stage], "engine": engine_config(engines[stage])}
            say(f"{stage}: engine ready in {t1 - t0:.1f} s")

        # vLLM's load_general_plugins sets its "loaded" flag before it runs the plugins: engines built in threads
        # at once would see the flag while our plugin is still registering the omni architectures ("Model
        # architectures [...] are not supported", seen in 2 of 3 concurrent starts). Load them here, once.
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        say("starting the thinker, talker and code2wav engines at once")
        t_graph = time.perf_counter()
        results = await asyncio.gather(*(asyncio.to_thread(start_one, s) for s in STAGES), return_exceptions=True)
        failed = [(s, r) for s, r in zip(STAGES, results) if isinstance(r, BaseException)]
        if failed:
            await asyncio.to_thread(_release_all, engines)
            stage, exc = failed[0]
            _reraise_start_failure(stage, exc)
        info["graph"] = {"start_seconds": round(time.perf_counter() - t_graph, 3),
                         "slowest_stage": max(STAGES, key=lambda s: info[s]["engine_start_seconds"]),
                         # concurrent: each stage started before every other stage was ready
                         "overlapped": all(info[a]["started_at"] < info[b]["ready_at"]
                                           for a in STAGES for b in STAGES)}
        graph = cls(cfg, engines, configs, tokenizer, info)
        graph._watchdog = asyncio.create_task(graph._watch(), name="omni-stage-graph-watchdog")
        graph._dead_waiter = asyncio.create_task(graph._dead.wait(), name="omni-stage-graph-dead")
        return graph

    async def shutdown(self) -> None:
        """Release every engine and its processes (``release_engine``: ``AsyncLLM.shutdown()``, then the
        engine-core processes waited for); in-flight requests then fail. Never raises; idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in (self._watchdog, self._dead_waiter):
            if task is not None:
                task.cancel()
        for engine in self.engines.values():  # on this loop, before the engine cores go: else each output
            handler = getattr(engine, "output_handler", None)  # handler logs EngineDeadError as they close
            if handler is not None:
                handler.cancel()
        await asyncio.sleep(0)  # let the cancelled output tasks finish on this loop
        await asyncio.to_thread(_release_all, self.engines)
        await asyncio.sleep(0)

    async def _watch(self) -> None:
        """Mark the graph dead when a stage's engine died (``AsyncLLM.errored``: vLLM's engine-core monitor
        saw its process exit, or its output handler failed)."""
        while self.dead_stage is None and not self._closed:
            for stage, engine in self.engines.items():
                if engine.errored:
                    self._mark_dead(stage)
                    return
            await asyncio.sleep(WATCH_INTERVAL)

    def _mark_dead(self, stage: str) -> None:
        if self.dead_stage is None and not self._closed:
            self.dead_stage = stage
            self._dead.set()

    def _dead_error(self, exc: BaseException | None = None) -> StageFailedError:
        stage = self.dead_stage or "?"
        cause = failure_cause(exc if exc is not None else RuntimeError("EngineCore died"), self.engines.get(stage))
        return StageFailedError(f"stage {stage} failed while running: {cause} (the stage graph is dead; start a "
                                "new one)", stage=stage)

    # ------------------------------------------------------------------ requests
    def check(self, req: SpeechRequest) -> None:
        """Check ``req`` without engine work; raises :class:`BadInputError` (a ``ValueError``) naming the field."""
        if not isinstance(req, SpeechRequest):
            raise BadInputError(f"expected a SpeechRequest, got {type(req).__name__}")
        if not isinstance(req.text, str) or not req.text.strip():
            raise BadInputError(f"text must be non-empty text, got {req.text!r}"[:200])
        for name, lo, hi in (("voice", 0, self.num_voices - 1), ("seed", 0, MAX_SEED),
                             ("max_tokens", 1, THINKER_MAX_MODEL_LEN - 1)):
            value = getattr(req, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadInputError(f"{name} must be an integer, got {value!r}")
            if not lo <= value <= hi:
                raise BadInputError(f"{name} must be in {lo}..{hi}, got {value}")
        if req.request_id is not None:
            if not isinstance(req.request_id, str) or not req.request_id.strip():
                raise BadInputError(f"request_id must be non-empty text or None, got {req.request_id!r}")
            if req.request_id in self._in_flight:
                raise BadInputError(f"request_id {req.request_id!r} is already in flight; use another id")
        check_prompt_fits(len(self.tokenizer(req.text)["input_ids"]), req.max_tokens, field="max_tokens")

    def running(self) -> dict[str, set[str]]:
        """Stage -> the graph request ids whose requests that stage's engine still holds (its output
        processor's ``external_req_ids``: what vLLM's front end has not finished or aborted)."""
        return {stage: {self._owner.get(r, r) for r in list(engine.output_processor.external_req_ids)}
                for stage, engine in self.engines.items()}

    async def synthesize(self, req: SpeechRequest) -> AsyncIterator[AudioChunk | SpeechResult]:
        """Run ``req`` through the three stages: :class:`AudioChunk` s as code2wav makes them, then one
        :class:`SpeechResult`. Raises :class:`BadInputError` (:meth:`check`) before any engine work,
        :class:`StageFailedError` naming the stage that failed (the graph dead, if its engine died).
        Closing the iterator early aborts the request in every stage."""
        import torch

        self.check(req)
        if self.dead_stage is not None:
            raise self._dead_error()
        if self._closed:
            raise StageFailedError("the stage graph is shut down", stage=None)
        rid = req.request_id or f"speech-{uuid.uuid4().hex[:12]}"
        self._in_flight.add(rid)
        ids = {stage: [] for stage in STAGES}
        talker_task: asyncio.Task | None = None
        t_submit = time.perf_counter()
        try:
            text, hidden, n_prompt, n_tokens, t_thinker = await self._until_dead(
                self._thinker(rid, req, ids), "thinker")
            frames = talker_frames(hidden.shape[0], req.max_tokens)
            queue: asyncio.Queue = asyncio.Queue()
            talker_task = asyncio.create_task(self._talker(rid, req, hidden, frames, queue, ids))
            got: list[Any] = []
            have, talker_done = 0, False
            t_c2w, first_chunk, samples = 0.0, None, 0
            for index, (start, end) in enumerate(chunk_bounds(frames, self.cfg.chunk_frames)):
                while have < end and not talker_done:
                    item = await self._until_dead(queue.get(), "talker")
                    if isinstance(item, BaseException):
                        raise self._stage_error(item, "talker")
                    if item is None:
                        talker_done = True
                    else:
                        got.append(item)
                        have += item.shape[0]
                end = min(end, have)
                if end <= start:
                    break
                codes = torch.cat(got) if len(got) > 1 else got[0]
                got = [codes]
                t0 = time.perf_counter()
                wav = await self._until_dead(self._code2wav(rid, index, codes[:end], ids), "code2wav")
                t_c2w += time.perf_counter() - t0
                chunk = wav.reshape(end, -1)[start:end].reshape(-1).contiguous()
                ready = time.perf_counter()
                first_chunk = ready - t_submit if first_chunk is None else first_chunk
                samples += int(chunk.numel())
                yield AudioChunk(index=index, samples=chunk, codes=codes[start:end].clone(), ready_at=ready)
            t_talker, talker_end = await self._until_dead(talker_task, "talker")
            codes = got[0] if got else torch.zeros((0, 0), dtype=torch.int64)
            yield SpeechResult(
                request_id=rid, thinker_text=text, prompt_tokens=n_prompt, thinker_tokens=n_tokens, codes=codes,
                samples=samples, timings={"thinker": round(t_thinker, 4), "talker": round(t_talker, 4),
                                          "code2wav": round(t_c2w, 4), "first_chunk": round(first_chunk or 0.0, 4),
                                          "talker_finished": round(talker_end - t_submit, 4),
                                          "total": round(time.perf_counter() - t_submit, 4)})
        finally:
            if talker_task is not None:
                if not talker_task.done():
                    talker_task.cancel()
                with contextlib.suppress(BaseException):
                    await talker_task  # its failure was reported through the queue: retrieved here
            await self._abort(ids)
            self._in_flight.discard(rid)

    async def _until_dead(self, aw: Any, stage: str) -> Any:
        """Await ``aw`` unless the graph dies first; a failure becomes :class:`StageFailedError` naming
        ``stage`` (vLLM's ``EngineDeadError`` also marks the graph dead)."""
        task = aw if isinstance(aw, asyncio.Future) else asyncio.ensure_future(aw)
        try:
            waiter = self._dead_waiter
            done, _ = await asyncio.wait({task} if waiter is None else {task, waiter},
                                         return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        if task not in done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise self._dead_error()
        try:
            return task.result()
        except (StageFailedError, BadInputError):
            raise
        except Exception as exc:
            raise self._stage_error(exc, stage) from exc

    def _stage_error(self, exc: BaseException, stage: str) -> StageFailedError:
        """``exc`` from ``stage`` (or the stage it names, ``exc.omni_stage``) as :class:`StageFailedError`;
        vLLM's ``EngineDeadError`` (or the stage's engine errored) also marks the graph dead."""
        if isinstance(exc, StageFailedError):
            return exc
        failed = getattr(exc, "omni_stage", stage)
        engine = self.engines.get(failed)
        if type(exc).__name__ == "EngineDeadError" or (engine is not None and engine.errored):
            self._mark_dead(failed)
            if self.dead_stage is not None:
                return self._dead_error(exc if self.dead_stage == failed else None)
        return StageFailedError(f"stage {failed} failed while running: {failure_cause(exc, engine)}", stage=failed)

    def _stage_id(self, rid: str, stage: str, ids: dict[str, list[str]], suffix: str = "") -> str:
        sid = f"{rid}:{stage}{suffix}"
        ids[stage].append(sid)
        self._owner[sid] = rid
        return sid

    async def _abort(self, ids: dict[str, list[str]]) -> None:
        """Abort the request's stage requests vLLM still holds (``AsyncLLM.abort``), forget their ids."""
        for stage, sids in ids.items():
            engine = self.engines.get(stage)
            held = [s for s in sids if engine is not None and s in engine.output_processor.external_req_ids]
            if held and not engine.errored:
                with contextlib.suppress(Exception):
                    await engine.abort(held)
            for s in sids:
                self._owner.pop(s, None)

    async def _thinker(self, rid: str, req: SpeechRequest, ids: dict[str, list[str]]) -> tuple:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        params = SamplingParams(max_tokens=req.max_tokens, temperature=THINKER_TEMPERATURE, top_p=THINKER_TOP_P,
                                seed=req.seed, output_kind=RequestOutputKind.FINAL_ONLY)
        t0 = time.perf_counter()
        out = None
        async with contextlib.aclosing(self.engines["thinker"].generate(
                req.text, params, request_id=self._stage_id(rid, "thinker", ids))) as gen:
            async for out in gen:
                pass
        return (out.outputs[0].text, out.multimodal_outputs["hidden"], len(out.prompt_token_ids),
                len(out.outputs[0].token_ids), time.perf_counter() - t0)

    async def _talker(self, rid: str, req: SpeechRequest, hidden: Any, frames: int, queue: asyncio.Queue,
                      ids: dict[str, list[str]]) -> tuple[float, float]:
        """Stream the talker's frames into ``queue`` (int64 ``[k, K]`` tensors, then ``None``; an exception
        instead if it fails); returns its seconds and when it finished (``time.perf_counter()``)."""
        import torch
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        from core.payloads import EXTRA_ARGS_KEY, pack

        # one token more than frames: a frame is a token plus its MTP residuals, made at the next decode step
        params = SamplingParams(max_tokens=frames + 1, temperature=0.0, ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.DELTA,
                                extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": hidden, "voice": req.voice})})
        t0 = time.perf_counter()
        try:
            async with contextlib.aclosing(self.engines["talker"].generate(
                    {"prompt_token_ids": [0] * hidden.shape[0]}, params,
                    request_id=self._stage_id(rid, "talker", ids))) as gen:
                async for out in gen:
                    codes = out.multimodal_outputs.get("codes.audio")
                    if codes is not None and codes.numel():
                        codes = codes.to(torch.int64)
                        codes = codes[codes[:, 0] >= 0]  # prompt rows carry -1
                        if codes.shape[0]:
                            queue.put_nowait(codes)
        except Exception as exc:
            exc.omni_stage = "talker"  # type: ignore[attr-defined]
            queue.put_nowait(exc)
            raise
        queue.put_nowait(None)
        end = time.perf_counter()
        return end - t0, end

    async def _code2wav(self, rid: str, index: int, codes: Any, ids: dict[str, list[str]]) -> Any:
        """The waveform of frames ``codes`` (int64 ``[T, K]``): float32 ``[T * hop_length]``, one forward."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        from core.payloads import EXTRA_ARGS_KEY, pack

        params = SamplingParams(max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
                                extra_args={EXTRA_ARGS_KEY: pack({"codes": codes})})
        out = None
        async with contextlib.aclosing(self.engines["code2wav"].generate(
                {"prompt_token_ids": [0] * codes.shape[0]}, params,
                request_id=self._stage_id(rid, "code2wav", ids, f"-{index}"))) as gen:
            async for out in gen:
                pass
        return out.multimodal_outputs["waveform"].reshape(-1)

    async def worker_stats(self) -> dict[str, dict[str, Any]]:
        """Per stage, rank 0's ``omni_state`` (``AsyncLLM.collective_rpc``): peak device memory of the stage's
        worker, talker MTP mode and graph use."""
        out = {}
        for stage, engine in self.engines.items():
            state = (await engine.collective_rpc("omni_state"))[0]
            out[stage] = {"peak_device_memory_bytes": state.get("peak_memory_bytes"),
                          "talker_mtp": state.get("mtp_mode"), "mtp_graph": state.get("mtp_graph")}
        return out


def _release_all(engines: dict[str, Any]) -> None:
    """Release every engine (``release_engine``: shut down, its processes waited for), all at once."""
    import threading

    from core.pipeline.release import release_engine

    threads = [threading.Thread(target=release_engine, args=(e, s), name=f"omni-release-{s}")
               for s, e in list(engines.items())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engines.clear()


def _reraise_start_failure(stage: str, exc: BaseException) -> None:
    from omni_backends.errors import OmniBackendError
    from omni_backends.probing import vendor_import_error

    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc
    if isinstance(exc, OmniBackendError) and not isinstance(exc, StageFailedError):
        raise exc  # already says what is wrong (bad input, device, driver, vendor import)
    blamed = vendor_import_error(exc)
    if blamed is not None:
        raise blamed from exc
    raise StageFailedError(f"stage {stage} failed while starting its engine: {failure_cause(exc, None)}. No output "
                           f"was written.", stage=stage) from exc
