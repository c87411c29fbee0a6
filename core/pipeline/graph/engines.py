"""Starting and releasing the stage graph's engines: the environment vLLM reads (:func:`prepare_environment`),
each stage's memory and the check that the three fit the device together (:func:`_stage_memory`), the
concurrent start of the three ``AsyncLLM`` engines (:func:`start_engines`, what
:meth:`~core.pipeline.graph.StageGraph.start` runs), what vLLM resolved for each (:func:`engine_config`), and
releasing them (:func:`_release_all`). Importing this module imports neither vLLM nor torch."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any, Callable

from core.kinds import AR, GENERATION
from core.pipeline.config import (
    ENGINE_KW,
    STAGES,
    TALKER_MAX_MODEL_LEN,
    THINKER_MAX_MODEL_LEN,
    GraphConfig,
    device_defaults,
    engine_kw,
)
from core.pipeline.faults import failure_cause
from omni_backends.errors import BadInputError, StageFailedError


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


async def start_engines(cfg: GraphConfig, backend: Any = None, say: Callable[[str], None] | None = None
                        ) -> tuple[GraphConfig, dict[str, Any], dict[str, dict[str, Any]], Any,
                                   dict[str, dict[str, Any]]]:
    """Check ``cfg`` and the models, then start the three engines concurrently (each
    ``core.stage.make_async_engine`` in a thread of its own: the constructors block until their engine core is
    up); returns ``(cfg, engines, configs, tokenizer, stage_info)``: ``cfg`` with the device's defaults and
    the model folder filled in, stage -> ``AsyncLLM``, stage -> ``config.json``, the thinker's tokenizer,
    stage -> start facts (see :meth:`~core.pipeline.graph.StageGraph.start`, which documents the errors)."""
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
    # architectures [...] are not supported", seen in 2 of 3 concurrent starts). Load them here, once, with
    # vLLM-Omni's plugin kept out first (its patches must not reach this process or the engines).
    from core.models.vllm_omni import load_vllm_plugins

    load_vllm_plugins()
    say("starting the thinker, talker and code2wav engines at once")
    t_graph = time.perf_counter()
    heartbeat = asyncio.ensure_future(_say_while_starting(say, info, t_graph, graphs=not cfg.enforce_eager))
    try:
        results = await asyncio.gather(*(asyncio.to_thread(start_one, s) for s in STAGES), return_exceptions=True)
    finally:
        heartbeat.cancel()
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
    return cfg, engines, configs, tokenizer, info


#: seconds between the progress lines while engines start (an engine start takes 25-70 s on a GPU)
START_HEARTBEAT_SECONDS = 15.0


async def _say_while_starting(say: Callable[[str], None], ready: dict[str, Any], t0: float, graphs: bool,
                              every: float = START_HEARTBEAT_SECONDS) -> None:
    """Every ``every`` s until cancelled: which stages are still starting (``ready``: stage -> facts, filled
    as each engine is up), so a long start is not a silent one."""
    work = "loads the model, profiles memory" + (", compiles and captures graphs" if graphs else "")
    while True:
        await asyncio.sleep(every)
        waiting = [s for s in STAGES if s not in ready]
        if waiting:
            say(f"still starting after {time.perf_counter() - t0:.0f} s: {', '.join(waiting)} (vLLM {work})")


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
