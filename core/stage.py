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
    resolves another platform.
    """
    sel = select(device)
    sel.backend.check_vllm_platform()
    return sel


def make_engine(model: str, *, kind: str = AR, device: str | None = None, **engine_kwargs: Any) -> Any:
    """A ``vllm.LLM`` for ``model`` whose workers run the omni runner of ``kind``.

    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. ``dtype``, ``max_model_len``,
    ``enforce_eager``, ``tensor_parallel_size``). Request outputs carry
    ``multimodal_outputs`` (name -> tensor, per request).
    Raises ``ValueError`` for an unknown ``kind``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    sel = prepare_device(device)
    check_engine_fits(sel, engine_kwargs, os.environ)  # "needs K devices, only M visible" before any worker starts
    from vllm import LLM

    from core.engine import attach_omni_frontend

    llm = LLM(model, worker_cls=WORKER_CLS[kind], scheduler_cls=SCHEDULER_CLS, **engine_kwargs)
    return attach_omni_frontend(llm, kind)
