"""The declared pipelines (:class:`core.pipeline.spec.PipelineSpec`) and which one a model folder runs.

- ``demo`` (:mod:`~core.pipeline.declarations.demo`): thinker -> talker -> code2wav over the demo models
  (``--model-dir``: a folder with ``thinker/``, ``talker/``, ``code2wav/``; the default);
- ``qwen3_tts`` (:mod:`~core.pipeline.declarations.qwen3_tts`): talker -> code2wav over a Qwen3-TTS checkpoint
  in the released layout (root ``config.json`` with ``model_type: qwen3_tts``).

Without a checkpoint (``--model``) the demo runs; a checkpoint's root ``config.json`` ``model_type`` picks its
declaration (as vLLM-Omni's ``OMNI_PIPELINES`` is
keyed by ``model_type``). Adding a pipeline is a module here holding its ``PipelineSpec`` -- its stages, its
speech request (``PipelineSpec.speech``) and its ``run`` options (``PipelineSpec.options``) -- plus a row of
:data:`PIPELINES` (and its architectures in :mod:`core.models`); serving, the stage graph and the CLI read the
declaration and need no change. Importing this package imports neither vLLM nor torch, nor any declaration
(:func:`request_options` imports each).
"""

from __future__ import annotations

import importlib
import json
import os

from core.pipeline.spec import PipelineSpec, RequestOption
from omni_backends.errors import BadInputError

#: declaration name (a checkpoint's ``model_type``) -> ``module:attribute`` of its ``PipelineSpec``
PIPELINES = {
    "demo": "core.pipeline.declarations.demo:DEMO",
    "qwen3_tts": "core.pipeline.declarations.qwen3_tts:QWEN3_TTS",
}


#: the pipeline run without a checkpoint (no ``--model``)
DEFAULT = "demo"


def declaration(name: str) -> PipelineSpec:
    """The :class:`PipelineSpec` named ``name`` (a key of :data:`PIPELINES`); :class:`BadInputError` otherwise."""
    if name not in PIPELINES:
        raise BadInputError(f"no pipeline is declared for {name!r}; declared: {', '.join(PIPELINES)}")
    module, attr = PIPELINES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def pipeline_name(model: str | None) -> str:
    """Which declaration runs the checkpoint folder ``model`` (``--model``): ``demo`` for ``None`` (the demo
    models, ``--model-dir``), else the ``model_type`` of its root ``config.json``. :class:`BadInputError` (before
    anything else is read) for a folder that is missing, has no readable ``config.json`` or a ``model_type`` no
    declaration serves -- naming the file or the value and what is supported."""
    if model is None:
        return DEFAULT
    if not os.path.isdir(model):
        raise BadInputError(f"model directory {model} does not exist; pass a local checkpoint folder (e.g. a "
                            "downloaded Qwen3-TTS checkpoint) with --model")
    path = os.path.join(model, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise BadInputError(f"{path} is missing: --model needs a checkpoint folder with its config.json") from None
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{path} is not readable JSON ({exc})") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    served = [name for name in PIPELINES if name != DEFAULT]
    if model_type not in served:
        raise BadInputError(f"{path}: model_type {model_type!r} is not supported; supported: {', '.join(served)}")
    return model_type


def resolve(model: str | None) -> PipelineSpec:
    """The declaration that runs the checkpoint folder ``model`` (``None``: the demo; :func:`pipeline_name`)."""
    return declaration(pipeline_name(model))


def request_options() -> dict[str, list[tuple[str, RequestOption]]]:
    """Every declared request option (``PipelineSpec.options``, what ``run`` takes as ``--<name>``): option
    name -> ``[(pipeline, option)]`` of the declarations that declare it, in :data:`PIPELINES` order."""
    out: dict[str, list[tuple[str, RequestOption]]] = {}
    for name in PIPELINES:
        for option in declaration(name).options:
            out.setdefault(option.name, []).append((name, option))
    return out
