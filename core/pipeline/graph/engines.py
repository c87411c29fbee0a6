"""Starting and releasing the stage graph's engines: the environment vLLM reads (:func:`prepare_environment`),
each stage's memory and the check that the stages fit the device together (:func:`stage_memory`), the
concurrent start of the declared stages' ``AsyncLLM`` engines (:func:`start_engines`, what
:meth:`~core.pipeline.graph.StageGraph.start` runs), what vLLM resolved for each (:func:`engine_config`), and
releasing them (:func:`release_all`). Importing this module imports neither vLLM nor torch."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any, Callable

from core.pipeline.config import GraphConfig, device_defaults, engine_kw
from core.pipeline.faults import failure_cause
from omni_backends.backend import Backend
from omni_backends.errors import BadInputError, StageFailedError

log = logging.getLogger(__name__)


def prepare_environment(cfg: GraphConfig, backend: Backend, spec: Any = None) -> GraphConfig:
    """``cfg`` with the device's defaults (:func:`device_defaults`), its engine choices checked
    (:func:`core.stage.check_engine_choices`) and vLLM's variables set for the engines to come:
    ``VLLM_USE_V2_MODEL_RUNNER`` (``--runner``), ``VLLM_ENABLE_V1_MULTIPROCESSING`` (``--multiprocess``: with
    ``AsyncLLM`` every stage's engine core runs in its own process whatever it says; the variable decides
    whether that engine core runs its worker in another process, vLLM's ``mp`` executor, e.g. on the cpu
    driver, or in itself, the ``uni`` executor).

    ``spec``: the pipeline (a ``PipelineSpec``). One with a stage whose model has no KV cache
    (``StageSpec.kv_cache`` False) on a driver offering V2 and a vLLM whose V2 runner cannot run such a model
    (:func:`core.runner.v2.v2_runs_models_without_kv_cache`, vLLM before 0.32): the runner left to vLLM
    (``auto``) becomes V1 for every stage (``cfg.runner`` says so; one engine process reads the variable, so the
    stages share it), and ``--runner v2`` is refused. Raises :class:`BadInputError`; imports vLLM only for that
    check."""
    from core.stage import check_engine_choices

    given = cfg.multiprocess is not None
    cfg = device_defaults(cfg, backend)
    runner = check_engine_choices(cfg, backend)
    kv_free = [s.name for s in getattr(spec, "stages", ()) if not s.kv_cache]
    if kv_free and runner in ("auto", "v2") and backend.capabilities().v2_runner:
        from core.runner.v2 import v2_runs_models_without_kv_cache

        if not v2_runs_models_without_kv_cache():
            why = (f"the {', '.join(kv_free)} stage's model has no KV cache (no attention layer), which this vLLM's V2 "
                   f"model runner cannot run (vLLM 0.32+ can)")
            if runner == "v2":
                raise BadInputError(f"V2 model runner ({_runner_source(cfg)}): {why}; use --runner v1 (or leave "
                                    f"--runner to vLLM: the {spec.name} pipeline then runs on V1) or a newer vLLM")
            runner = "v1"
            cfg = dataclasses.replace(cfg, runner="v1")
            log.info("model runner: V1 for every stage: %s", why)
    if runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    if given:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.multiprocess else "0"
    else:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if cfg.multiprocess else "0")
    return cfg


def _runner_source(cfg: GraphConfig) -> str:
    """What asked for the runner: ``--runner v2`` or the variable."""
    return f"--runner {cfg.runner}" if cfg.runner != "auto" else \
        f"VLLM_USE_V2_MODEL_RUNNER={os.environ.get('VLLM_USE_V2_MODEL_RUNNER')}"


def stage_memory(backend: Backend, stage_args: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each stage's ``kv_cache_memory_bytes`` / ``gpu_memory_utilization`` (``engine_memory_kw`` for its model
    folder, ``max_model_len``, ``max_num_seqs`` and ``dtype``, from ``stage_args``: stage -> its declared engine
    arguments), and one check that the stages together fit the device's free memory.

    Why, for engines starting at once on one device (vLLM 0.32 ``vllm/v1/worker/gpu_worker.py``):
    ``init_device`` snapshots free memory and ``request_memory`` refuses a start with less free than
    ``gpu_memory_utilization * total`` -- a snapshot that sees whatever the other stages allocated so far.
    Checking the sum here, before any engine starts, makes every stage's check pass whatever the order of
    the others' allocations. ``determine_available_memory`` would profile (``memory_profiling``: free memory
    before and after a dummy forward, asserting no other process changed it) -- wrong with neighbours
    allocating concurrently; every stage passes ``kv_cache_memory_bytes``, which skips that profiling, so no
    stage's KV size depends on another's start."""
    import math

    from omni_backends.engine_memory import engine_memory_kw

    mem = {stage: engine_memory_kw(backend, a["model"], max_model_len=a["max_model_len"],
                                   max_num_seqs=a["max_num_seqs"], dtype=a["dtype"])
           for stage, a in stage_args.items()}
    for stage, kw in mem.items():  # the concurrent start is safe only without vLLM's profiling (see above)
        assert kw.get("kv_cache_memory_bytes"), f"stage {stage} has no fixed KV size: {kw}"
    free, total = backend.memory_info()
    need = sum(math.ceil(kw["gpu_memory_utilization"] * total) for kw in mem.values())
    if need > free:
        raise BadInputError(f"the {len(mem)} stages need about {need / 2**30:.2f} GiB of {backend.name} device "
                            f"memory together but only {free / 2**30:.2f} GiB of {total / 2**30:.2f} GiB is free; "
                            "free the device (other processes) or pick another device with --device")
    return mem


#: the key of a stage's overrides that is its default sampling, not an engine argument (vLLM-Omni's name)
SAMPLING_OVERRIDES = "default_sampling_params"


def stage_overrides_by_name(overrides: dict[str, dict[str, Any]] | None, spec: Any) -> dict[str, dict[str, Any]]:
    """``--stage-overrides`` keyed by stage name: a key is a stage id (``"0"``, vLLM-Omni's form, the stages in
    the declaration's order) or a stage name; :class:`BadInputError` naming a stage the pipeline does not have."""
    names = spec.stage_names
    out: dict[str, dict[str, Any]] = {}
    for key, value in (overrides or {}).items():
        name = names[int(key)] if key.isdigit() and int(key) < len(names) else key
        if name not in names:
            raise BadInputError(f"--stage-overrides names stage {key!r}; the {spec.name} pipeline's stages are "
                                + ", ".join(f"{i} ({n})" for i, n in enumerate(names)))
        out.setdefault(name, {}).update(value)
    return out


def engine_overrides(overrides: dict[str, dict[str, Any]], stage: str) -> dict[str, Any]:
    """The engine arguments among ``stage``'s overrides (all but :data:`SAMPLING_OVERRIDES`), each an
    ``AsyncEngineArgs`` field (:class:`BadInputError` naming one that is not, before any engine starts)."""
    import dataclasses as dc

    from vllm.engine.arg_utils import AsyncEngineArgs

    kw = {k: v for k, v in overrides.get(stage, {}).items() if k != SAMPLING_OVERRIDES}
    fields = {f.name for f in dc.fields(AsyncEngineArgs)}
    unknown = sorted(set(kw) - fields - {"model"})
    if unknown:
        raise BadInputError(f"--stage-overrides for {stage}: {', '.join(unknown)} is not an engine argument "
                            f"(vLLM's AsyncEngineArgs) nor {SAMPLING_OVERRIDES}")
    return kw


def engine_config(engine: Any) -> dict[str, Any]:
    """What vLLM resolved for a stage's engine (a ``vllm.LLM`` or an ``AsyncLLM``): runner, graphs,
    scheduling, process layout, memory."""
    from core.patches.model_config_fields import model_config_fields

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
        # vLLM-Omni's per-stage model-config fields its model reads (core.patches.model_config_fields)
        "model_config_fields": model_config_fields(cfg),
    }


async def start_engines(cfg: GraphConfig, backend: Backend | None = None, say: Callable[[str], None] | None = None
                        ) -> tuple[GraphConfig, Any, Any, dict[str, Any], dict[str, dict[str, Any]]]:
    """Check ``cfg``, resolve the pipeline declared for ``cfg.model`` (:func:`core.pipeline.declarations.resolve`;
    the demo when it is ``None``),
    read and check its models (``PipelineSpec.load``), then start its stages' engines concurrently (each
    ``core.stage.make_async_engine`` in a thread of its own: the constructors block until their engine core is
    up); returns ``(cfg, spec, model, engines, stage_info)``: ``cfg`` with the device's defaults and the model
    folder filled in, the declaration, what it read (:class:`~core.pipeline.spec.PipelineModel`), stage ->
    ``AsyncLLM``, stage -> start facts (see :meth:`~core.pipeline.graph.StageGraph.start`, which documents the
    errors)."""
    from core.pipeline.declarations import resolve
    from omni_backends.probing import blame_import_failures

    cfg.check()
    say = say or (lambda msg: None)
    spec = resolve(cfg.model)  # a folder no declaration serves fails here, before the device or vLLM
    stages = spec.stage_names
    if cfg.stat_loggers and set(cfg.stat_loggers) - set(stages):
        raise BadInputError(f"stat_loggers names stages {sorted(set(cfg.stat_loggers) - set(stages))} that the "
                            f"{spec.name} pipeline does not have ({', '.join(stages)})")
    cfg = dataclasses.replace(cfg, stage_overrides=stage_overrides_by_name(cfg.stage_overrides, spec))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if backend is None:
        from omni_backends.registry import select

        backend = select(cfg.device).backend
    cfg = prepare_environment(cfg, backend, spec)
    with blame_import_failures():
        model = spec.load(cfg, backend, say)
        if cfg.model is None:
            cfg = dataclasses.replace(cfg, model_dir=model.model_dir)
        backend.check_vllm_platform()
        args = {s.name: {**s.engine_args(model, cfg), **engine_overrides(cfg.stage_overrides, s.name)}
                for s in spec.stages}
        mem = stage_memory(backend, args)
    kinds = {s.name: s.kind for s in spec.stages}
    engines: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}

    def start_one(stage: str) -> None:
        from core.stage import make_async_engine  # looked up per call: a wrapper set on core.stage is used

        t0 = time.perf_counter()
        kw = {**engine_kw(cfg), **args[stage], **mem[stage]}
        if cfg.stat_loggers and cfg.stat_loggers.get(stage):
            kw["stat_loggers"] = list(cfg.stat_loggers[stage])
        engines[stage] = make_async_engine(kw.pop("model"), kind=kinds[stage], device=cfg.device, **kw)
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
    say(f"starting the {', '.join(stages)} engines at once")
    t_graph = time.perf_counter()
    heartbeat = asyncio.ensure_future(_say_while_starting(say, info, stages, t_graph, graphs=not cfg.enforce_eager))
    try:
        results = await asyncio.gather(*(asyncio.to_thread(start_one, s) for s in stages), return_exceptions=True)
    finally:
        heartbeat.cancel()
    failed = [(s, r) for s, r in zip(stages, results) if isinstance(r, BaseException)]
    if failed:
        await asyncio.to_thread(release_all, engines)
        stage, exc = failed[0]
        _reraise_start_failure(stage, exc)
    info["graph"] = {"start_seconds": round(time.perf_counter() - t_graph, 3),
                     "slowest_stage": max(stages, key=lambda s: info[s]["engine_start_seconds"]),
                     # concurrent: each stage started before every other stage was ready
                     "overlapped": all(info[a]["started_at"] < info[b]["ready_at"]
                                       for a in stages for b in stages)}
    return cfg, spec, model, engines, info


#: seconds between the progress lines while engines start (an engine start takes 25-70 s on a GPU)
START_HEARTBEAT_SECONDS = 15.0


async def _say_while_starting(say: Callable[[str], None], ready: dict[str, Any], stages: tuple[str, ...], t0: float,
                              graphs: bool, every: float = START_HEARTBEAT_SECONDS) -> None:
    """Every ``every`` s until cancelled: which stages are still starting (``ready``: stage -> facts, filled
    as each engine is up), so a long start is not a silent one."""
    work = "loads the model, profiles memory" + (", compiles and captures graphs" if graphs else "")
    while True:
        await asyncio.sleep(every)
        waiting = [s for s in stages if s not in ready]
        if waiting:
            say(f"still starting after {time.perf_counter() - t0:.0f} s: {', '.join(waiting)} (vLLM {work})")


def release_all(engines: dict[str, Any]) -> None:
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
