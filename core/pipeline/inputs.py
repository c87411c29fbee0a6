"""The run's inputs on disk, checked before an engine starts: the demo models (one folder per stage, the
declaration names the stages), the output directory, the prompt's length in thinker tokens."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from omni_backends.backend import Backend
from omni_backends.errors import BadInputError


def _recreate(model_dir: str) -> str:
    return f"Recreate the demo models: omni-backends demo-model create {model_dir}"


def _load_config(stage_dir: str, stage: str, model_dir: str) -> dict[str, Any]:
    path = os.path.join(stage_dir, "config.json")
    if not os.path.isfile(path):
        raise BadInputError(f"{stage} model: {path} is missing. {_recreate(model_dir)}")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{stage} model: {path} is not valid JSON ({exc}). {_recreate(model_dir)}") from exc
    if not isinstance(cfg, dict):
        raise BadInputError(f"{stage} model: {path} must hold a JSON object. {_recreate(model_dir)}")
    return cfg


def _check_weights(stage_dir: str, stage: str, model_dir: str) -> None:
    path = os.path.join(stage_dir, "model.safetensors")
    if not os.path.isfile(path):
        raise BadInputError(f"{stage} model: weight file {path} is missing. {_recreate(model_dir)}")
    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            if not list(f.keys()):
                raise ValueError("no tensors")
    except Exception as exc:  # safetensors raises its own error types
        raise BadInputError(f"{stage} model: weight file {path} is unreadable ({exc}). {_recreate(model_dir)}") from exc


def _read_models(model_dir: str, stages: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Stage -> ``config.json`` of the demo models in ``model_dir``, each stage's weights found readable;
    :class:`BadInputError` saying how to recreate them."""
    if not os.path.isdir(model_dir):
        raise BadInputError(f"model directory {model_dir} does not exist; create it with: omni-backends demo-model create {model_dir}")
    configs = {}
    for stage in stages:
        d = os.path.join(model_dir, stage)
        configs[stage] = _load_config(d, stage, model_dir)
        _check_weights(d, stage, model_dir)
    return configs


def check_out_dir(out: str) -> str:
    """``out`` (``--out``) as an absolute path whose folder can be written; :class:`BadInputError` saying to choose
    another ``--out`` otherwise."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    probe_dir = out if os.path.isdir(out) else parent
    if os.path.exists(out) and not os.path.isdir(out):
        raise BadInputError(f"output path {out} exists and is not a directory; choose another --out")
    if not os.path.isdir(probe_dir):
        raise BadInputError(f"output directory's parent {probe_dir} does not exist; create it or choose another --out")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".omni-write-test-", dir=probe_dir)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise BadInputError(
            f"cannot write the output --out {out}: creating a file in {probe_dir} failed ({exc.strerror}); "
            f"choose another --out"
        ) from exc
    return out


def validate_models(model_dir: str, backend: Backend, stages: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Check the demo models of ``stages`` in ``model_dir`` (a folder per stage) before an engine starts; returns
    stage -> config.json.

    Missing / corrupt ``config.json`` or weights, then a head size the device cannot run
    (``Backend.check_model_config``): :class:`BadInputError` saying how to recreate them."""
    configs = _read_models(model_dir, stages)
    for stage in stages:
        backend.check_model_config(configs[stage])
    return configs


def check_prompt_fits(n_prompt: int, max_tokens: int, context: int, field: str = "--max-tokens") -> None:
    """:class:`BadInputError` unless a prompt of ``n_prompt`` thinker tokens plus ``max_tokens`` fits the
    thinker's context of ``context`` tokens."""
    if n_prompt + max_tokens > context:
        raise BadInputError(
            f"prompt is {n_prompt} tokens; with {field} {max_tokens} that exceeds the thinker's context of "
            f"{context} tokens. Shorten the prompt or lower {field}."
        )


def thinker_tokenizer(model_dir: str) -> Any:
    """The demo thinker's tokenizer (``transformers.AutoTokenizer`` of ``<model_dir>/thinker``);
    :class:`BadInputError` saying how to recreate it."""
    path = os.path.join(model_dir, "thinker")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises ValueError / OSError / JSONDecodeError for broken files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInputError(
            f"thinker model: the tokenizer in {path} is missing or unreadable ({first[:200]}). Recreate the demo "
            f"models: omni-backends demo-model create {model_dir}"
        ) from exc
