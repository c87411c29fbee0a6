"""Build a vLLM engine that runs one omni stage through the core runner.

:func:`make_engine` selects the driver first (so a bad ``--device`` fails
before vLLM is imported or started), refuses engine arguments and engine
choices (model runner, graph mode) the driver cannot run, makes vLLM resolve
the matching platform, then builds ``vllm.LLM`` with the omni worker and
scheduler and attaches the omni front end. The checks live here, with the
factory; the demo app's options (``omni-backends run``) are checked with them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator, Mapping

from core.kinds import AR, GENERATION, KINDS
from omni_backends.backend import Backend
from omni_backends.errors import BadInputError
from omni_backends.placement import check_engine_fits
from omni_backends.registry import Selection, select

WORKER_CLS = {AR: "core.worker.OmniARWorker", GENERATION: "core.worker.OmniGenerationWorker"}
SCHEDULER_CLS = "core.engine.OmniScheduler"


def prepare_device(device: str | None = None) -> Selection:
    """Select the driver (``--device`` > ``OMNI_BACKENDS_DEVICE`` > auto), export it
    for vLLM's worker processes, and check vLLM resolves the matching platform.

    Raises the registry's errors (unknown / not usable device) before vLLM is
    imported, and :class:`~omni_backends.errors.PlatformMismatchError` if vLLM
    resolves another platform. Keeps vLLM-Omni's vLLM plugin out of every
    process the engine starts (``VLLM_PLUGINS``, :func:`core.models.vllm_omni.keep_plugin_out`), and makes this
    process the engine owner: every process the engines start ends when this one does, however it dies
    (:func:`omni_backends.engine_lifetime.own_engines`). Raises
    ``ValueError`` for a bad ``OMNI_BACKENDS_MODEL_INNER_COMPILE`` (:func:`core.models.vllm_omni.inner_compile_allowed`)
    here, not in a worker.
    """
    from core.models.vllm_omni import inner_compile_allowed, keep_plugin_out
    from omni_backends.engine_lifetime import own_engines

    inner_compile_allowed()
    sel = select(device)
    keep_plugin_out()
    own_engines()
    sel.backend.check_vllm_platform()
    return sel


#: numeric ``vllm.LLM`` arguments checked before vLLM is imported: name -> (type, lowest, highest, what)
#: (``seed`` reaches ``numpy.random.seed``, which takes 0..2**32-1; ``gpu_memory_utilization`` is a fraction)
NUMERIC_ENGINE_ARGS: dict[str, tuple[type, float, float | None, str]] = {
    "seed": (int, 0, 2**32 - 1, "the sampling seed"),
    "max_model_len": (int, 1, None, "tokens per sequence"),
    "max_num_seqs": (int, 1, None, "sequences per step"),
    "max_num_batched_tokens": (int, 1, None, "tokens per step"),
    "tensor_parallel_size": (int, 1, None, "ranks"),
    "pipeline_parallel_size": (int, 1, None, "ranks"),
    "data_parallel_size": (int, 1, None, "ranks"),
    "block_size": (int, 1, None, "tokens per KV block"),
    "kv_cache_memory_bytes": (int, 1, None, "bytes"),
    "swap_space": (float, 0, None, "GiB"),
    "cpu_offload_gb": (float, 0, None, "GiB"),
    "gpu_memory_utilization": (float, 0, 1, "a fraction of device memory, > 0"),
}


def check_engine_args(engine_kwargs: dict[str, Any]) -> None:
    """Refuse a numeric ``vllm.LLM`` argument of the wrong type or out of range
    (:data:`NUMERIC_ENGINE_ARGS`) with a ``ValueError`` naming it; imports nothing.
    ``None`` leaves vLLM's default."""
    for name, (kind, lo, hi, what) in NUMERIC_ENGINE_ARGS.items():
        value = engine_kwargs.get(name)
        if value is None:
            continue
        ok_type = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
        if not ok_type:
            raise ValueError(f"make_engine: {name} must be {'a number' if kind is float else 'an integer'} "
                             f"({what}), got {value!r}")
        low_ok = value > lo if name == "gpu_memory_utilization" else value >= lo
        if not low_ok or (hi is not None and value > hi):
            rng = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
            if name == "gpu_memory_utilization":
                rng = "in (0, 1]"
            raise ValueError(f"make_engine: {name} must be {rng} ({what}), got {value}")


def check_in_process(engine_kwargs: dict[str, Any], environ: Any) -> None:
    """Refuse, with a ``ValueError`` saying what to set, an engine whose worker would not run in the caller's
    process (what ``make_engine(..., outputs_on_device=True)`` needs): the engine core in its own process
    (``VLLM_ENABLE_V1_MULTIPROCESSING`` not ``0``, vLLM's default) or more than one worker. Imports nothing."""
    why = []
    if str(environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")).strip() != "0":
        why.append("set VLLM_ENABLE_V1_MULTIPROCESSING=0 (the engine core then runs in this process)")
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if (engine_kwargs.get(name) or 1) != 1:
            why.append(f"{name} must be 1 (one worker), got {engine_kwargs[name]}")
    if why:
        raise ValueError("make_engine: outputs_on_device=True keeps each step's outputs on the device for a caller "
                         "in the worker's own process: " + "; ".join(why))


#: graph modes an engine can be asked for (``compilation_config.cudagraph_mode``, ``--graph-mode``): vLLM's
#: ``CUDAGraphMode`` names
GRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
#: model runners an engine can be asked for: ``v1`` / ``v2`` (``VLLM_USE_V2_MODEL_RUNNER``), ``auto`` = vLLM's choice
RUNNERS = ("auto", "v1", "v2")


@dataclasses.dataclass(frozen=True)
class EngineChoices:
    """The engine choices :func:`check_engine_choices` checks against a driver.

    ``runner``: one of :data:`RUNNERS`; ``graph_mode``: one of :data:`GRAPH_MODES`
    (any case) or ``None`` (vLLM's default); ``enforce_eager``: vLLM's
    ``enforce_eager`` (``None`` counts as off). The demo app's ``RunConfig``
    carries the same three fields and is checked as it is.
    """

    runner: str = "auto"
    graph_mode: str | None = None
    enforce_eager: bool | None = False


def check_engine_choices(choices: EngineChoices, backend: Backend, env: Mapping[str, str] | None = None,
                         graph_source: str = "--graph-mode") -> str:
    """Refuse, before an engine starts, a model runner or graph mode the driver cannot run.

    ``choices``: an :class:`EngineChoices`, or any object with its three
    attributes (the demo app's ``RunConfig``); ``backend``: the selected
    driver (reads ``name`` and ``capabilities()``); ``env``: where
    ``VLLM_USE_V2_MODEL_RUNNER`` is read (default ``os.environ``);
    ``graph_source``: how the messages name the graph mode (the flag or the
    argument the caller was given).

    - runner: ``choices.runner`` (``v1``/``v2``), else ``VLLM_USE_V2_MODEL_RUNNER``
      when set, against ``capabilities().v1_runner`` / ``v2_runner``;
    - graph mode: ``choices.graph_mode`` against ``capabilities().static_graph_modes``
      (``NONE`` is always possible), and not together with ``enforce_eager``.

    Returns the runner the engines will be asked for (``v1``, ``v2`` or
    ``auto``). Imports nothing. Raises
    :class:`~omni_backends.errors.BadInputError` naming the fix.
    """
    env = os.environ if env is None else env
    caps = backend.capabilities()
    if choices.runner not in RUNNERS:
        raise BadInputError(f"--runner must be one of {', '.join(RUNNERS)}, got {choices.runner!r}")
    runner, source = choices.runner, "--runner"
    raw = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if runner == "auto" and raw is not None and raw.strip() != "":
        if raw.strip().lower() not in ("0", "1", "true", "false"):
            raise BadInputError(f"VLLM_USE_V2_MODEL_RUNNER={raw!r} is not 0 or 1; unset it or use --runner v1|v2")
        runner, source = ("v2" if raw.strip().lower() in ("1", "true") else "v1"), f"VLLM_USE_V2_MODEL_RUNNER={raw}"
    if runner == "v2" and not caps.v2_runner:
        raise BadInputError(
            f"{source} asks for vLLM's V2 model runner but the {backend.name} driver cannot run it "
            f"(capabilities().v2_runner is False); use --runner v1 or unset VLLM_USE_V2_MODEL_RUNNER"
        )
    if runner == "v1" and not caps.v1_runner:
        raise BadInputError(
            f"{source} asks for vLLM's V1 model runner but the {backend.name} driver cannot run it "
            f"(capabilities().v1_runner is False); use --runner v2 or unset VLLM_USE_V2_MODEL_RUNNER"
        )
    if choices.graph_mode is not None:
        mode = choices.graph_mode.strip().upper()
        if mode not in GRAPH_MODES:
            raise BadInputError(f"{graph_source} must be one of {', '.join(GRAPH_MODES)}, "
                                f"got {choices.graph_mode!r}")
        supported = tuple(caps.static_graph_modes)
        if mode != "NONE" and mode not in supported:
            raise BadInputError(
                f"{graph_source} {mode} is not supported by the {backend.name} driver (it captures "
                f"{', '.join(supported) if supported else 'no graphs'}); "
                + (f"use one of {', '.join(supported)} or NONE" if supported else f"drop {graph_source} or use NONE")
            )
        if mode != "NONE" and choices.enforce_eager:
            raise BadInputError(f"{graph_source} {mode} needs graphs but enforce_eager (--enforce-eager) turns them off; "
                                "drop one of them")
    return runner


def engine_defaults(backend: Backend, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments the driver's facts set where the caller's ``engine_kwargs`` leave them to vLLM.

    A driver whose generators have no offset (``capabilities().generator_offsets`` False, e.g. a CPU
    ``torch.Generator``) gets ``enable_chunked_prefill=False``: vLLM's V1 model runner rewinds a seeded request's
    generator by offset (``GPUModelRunner._bookkeeping_sync``: ``set_offset(get_offset() - 4)``) when it discards
    the token sampled for a prefill split over steps, which raises ``RuntimeError`` there and kills the engine
    core. Without chunked prefill vLLM's scheduler splits no prompt (a prompt waits for a step with room) and,
    unless ``max_num_batched_tokens`` is given, sets it to at least ``max_model_len``
    (``EngineArgs._set_default_args``); a smaller one given is vLLM's ``ValueError``. A caller's own
    ``enable_chunked_prefill`` is kept (True: seeded requests may then fail on such a driver).
    Returns the arguments to add; imports nothing."""
    if "enable_chunked_prefill" in engine_kwargs or backend.capabilities().generator_offsets:
        return {}
    return {"enable_chunked_prefill": False}


@contextlib.contextmanager
def _checked_build(model: str, kind: str, device: str | None, engine_kwargs: dict[str, Any]) -> Iterator[Selection]:
    """The checks every engine factory makes, in order, before any engine starts, and the driver's engine
    defaults (:func:`engine_defaults`, added to ``engine_kwargs``); yields the selection inside
    :func:`~omni_backends.probing.blame_import_failures` (the factory imports and builds vLLM's engine there)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"make_engine: model must be a model path or name, got {model!r}")
    check_engine_args(engine_kwargs)
    from omni_backends.probing import blame_import_failures

    with blame_import_failures():
        sel = prepare_device(device)
        engine_kwargs.update(engine_defaults(sel.backend, engine_kwargs))
        check_engine_fits(sel, engine_kwargs, os.environ)  # "needs K devices, only M visible" before any worker starts
        cc = engine_kwargs.get("compilation_config")
        mode = cc.get("cudagraph_mode") if isinstance(cc, dict) else getattr(cc, "cudagraph_mode", None)
        check_engine_choices(EngineChoices(graph_mode=None if mode is None else str(getattr(mode, "name", mode)),
                                           enforce_eager=bool(engine_kwargs.get("enforce_eager"))), sel.backend,
                             graph_source="compilation_config cudagraph_mode")
        yield sel


def make_engine(model: str, *, kind: str = AR, device: str | None = None, outputs_on_device: bool = False,
                **engine_kwargs: Any) -> Any:
    """A ``vllm.LLM`` for ``model`` whose workers run the omni runner of ``kind``.

    ``outputs_on_device``: each step's per-token multimodal outputs stay on the device the forward made them on
    (no host copy and no fence per step, :mod:`core.hooks.step_rows`), and ``RequestOutput.multimodal_outputs``
    holds device tensors, for a caller that reads them in this process on that device. It needs the engine core
    and its one worker in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``tensor_parallel_size`` and
    ``pipeline_parallel_size`` 1): otherwise ``ValueError`` before vLLM starts.

    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. ``dtype``, ``max_model_len``,
    ``enforce_eager``, ``tensor_parallel_size``), with the driver's defaults
    where they leave a choice to vLLM (:func:`engine_defaults`: chunked prefill
    off where the device's generators cannot rewind). Request outputs carry
    ``multimodal_outputs`` (name -> tensor, per request).
    Raises, before vLLM is imported, ``ValueError`` for an unknown ``kind``, an
    empty ``model`` or a numeric argument out of range (:func:`check_engine_args`),
    and the registry's errors for the device. A package that raises while being
    imported (e.g. ``torch_npu`` without CANN) is
    :class:`~omni_backends.errors.VendorImportError` naming it. A model runner
    (``VLLM_USE_V2_MODEL_RUNNER``) or a ``compilation_config`` ``cudagraph_mode``
    the driver cannot run is :class:`~omni_backends.errors.BadInputError` before
    vLLM starts (:func:`check_engine_choices`).
    """
    if outputs_on_device:
        check_in_process(engine_kwargs, os.environ)
    with _checked_build(model, kind, device, engine_kwargs):
        from vllm.entrypoints.llm import LLM

        from core.engine import attach_omni_frontend, keep_outputs_on_device

        llm = LLM(model, worker_cls=WORKER_CLS[kind], scheduler_cls=SCHEDULER_CLS, **engine_kwargs)
        try:
            attach_omni_frontend(llm, kind)
            if outputs_on_device:
                keep_outputs_on_device(llm)
            return llm
        except BaseException:  # never leave a started engine (and its process) behind
            llm.llm_engine.engine_core.shutdown()
            raise


def make_async_engine(model: str, *, kind: str = AR, device: str | None = None, **engine_kwargs: Any) -> Any:
    """A vLLM ``AsyncLLM`` (``vllm.v1.engine.async_llm``) for ``model`` whose workers run the omni runner of ``kind``.

    The same checks and driver defaults as :func:`make_engine`, in the same order, before vLLM is
    imported or started (same errors); then
    ``AsyncLLM.from_engine_args(AsyncEngineArgs(model, worker_cls=, scheduler_cls=, **engine_kwargs))``
    and :func:`core.engine.attach_omni_frontend`. ``engine_kwargs`` are
    ``AsyncEngineArgs`` fields (those ``vllm.LLM`` takes: ``dtype``,
    ``max_model_len``, ``enforce_eager``, ``compilation_config`` as a dict, ...);
    ``disable_log_stats`` defaults to ``True`` as ``vllm.LLM``'s does; ``stat_loggers`` (vLLM
    ``StatLoggerFactory`` list, ``AsyncLLM.from_engine_args``'s) turns the stats on for those loggers.

    Every ``RequestOutput`` that ``AsyncLLM.generate`` yields carries
    ``multimodal_outputs`` (name -> tensor, dim 0 = tokens): with
    ``RequestOutputKind.DELTA`` the steps since the previous output (outputs the
    caller was too slow to take are merged by vLLM's ``RequestOutputCollector``,
    their multimodal outputs concatenated with them), otherwise every step so far.

    ``AsyncLLM`` always runs its engine core in a separate process (vLLM 0.32's
    ``EngineCoreClient.make_async_mp_client``); ``VLLM_ENABLE_V1_MULTIPROCESSING``
    only decides whether that engine core runs its worker in-process (``uni``
    executor) or in worker processes. Call it outside a running event loop
    (e.g. ``asyncio.to_thread``) to start several engines concurrently: vLLM
    then starts its output tasks on the loop of the first request. Release it
    with ``AsyncLLM.shutdown()`` (:func:`core.pipeline.release.release_engine`).
    """
    with _checked_build(model, kind, device, engine_kwargs):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from core.engine import attach_omni_frontend

        stat_loggers = engine_kwargs.pop("stat_loggers", None)
        if stat_loggers:  # vLLM's stats on for the loggers given (the serve command's per-stage Prometheus loggers)
            engine_kwargs.setdefault("disable_log_stats", False)
        args = AsyncEngineArgs(model=model, worker_cls=WORKER_CLS[kind], scheduler_cls=SCHEDULER_CLS,
                               **{"disable_log_stats": True, **engine_kwargs})
        engine = AsyncLLM.from_engine_args(args, stat_loggers=stat_loggers)
        try:
            return attach_omni_frontend(engine, kind)
        except BaseException:  # never leave a started engine (and its process) behind
            engine.shutdown()
            raise
