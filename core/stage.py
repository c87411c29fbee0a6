"""Build a vLLM engine that runs one omni stage through the core runner.

:func:`make_engine` selects the driver first (so a bad ``--device`` fails
before vLLM is imported or started), makes vLLM resolve the matching
platform, then builds ``vllm.LLM`` with the omni worker and scheduler and
attaches the omni front end.
"""

from __future__ import annotations

import os
from typing import Any

from core.kinds import AR, GENERATION, KINDS
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
    process the engine starts (``VLLM_PLUGINS``, :func:`core.models.vllm_omni.keep_plugin_out`).
    """
    from core.models.vllm_omni import keep_plugin_out

    sel = select(device)
    keep_plugin_out()
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


def make_engine(model: str, *, kind: str = AR, device: str | None = None, **engine_kwargs: Any) -> Any:
    """A ``vllm.LLM`` for ``model`` whose workers run the omni runner of ``kind``.

    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. ``dtype``, ``max_model_len``,
    ``enforce_eager``, ``tensor_parallel_size``). Request outputs carry
    ``multimodal_outputs`` (name -> tensor, per request).
    Raises, before vLLM is imported, ``ValueError`` for an unknown ``kind``, an
    empty ``model`` or a numeric argument out of range (:func:`check_engine_args`),
    and the registry's errors for the device. A package that raises while being
    imported (e.g. ``torch_npu`` without CANN) is
    :class:`~omni_backends.errors.VendorImportError` naming it. A model runner
    (``VLLM_USE_V2_MODEL_RUNNER``) or a ``compilation_config`` ``cudagraph_mode``
    the driver cannot run is :class:`~omni_backends.errors.BadInputError` before
    vLLM starts (``core.pipeline.check_engine_choices``).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"make_engine: model must be a model path or name, got {model!r}")
    check_engine_args(engine_kwargs)
    from omni_backends.probing import blame_import_failures

    with blame_import_failures():
        sel = prepare_device(device)
        check_engine_fits(sel, engine_kwargs, os.environ)  # "needs K devices, only M visible" before any worker starts
        from core.pipeline import RunConfig, check_engine_choices

        cc = engine_kwargs.get("compilation_config")
        mode = cc.get("cudagraph_mode") if isinstance(cc, dict) else getattr(cc, "cudagraph_mode", None)
        check_engine_choices(RunConfig(graph_mode=None if mode is None else str(getattr(mode, "name", mode)),
                                       enforce_eager=bool(engine_kwargs.get("enforce_eager"))), sel.backend,
                             graph_source="compilation_config cudagraph_mode")
        from vllm import LLM

        from core.engine import attach_omni_frontend

        llm = LLM(model, worker_cls=WORKER_CLS[kind], scheduler_cls=SCHEDULER_CLS, **engine_kwargs)
        try:
            return attach_omni_frontend(llm, kind)
        except BaseException:  # never leave a started engine (and its process) behind
            llm.llm_engine.engine_core.shutdown()
            raise
