"""vLLM-Omni's Qwen3-TTS deploy defaults, read from the installed wheel (never copied).

Two files of the installed ``vllm-omni`` hold them:

- ``vllm_omni/deploy/qwen3_tts.yaml`` (its ``DeployConfig``): the runner (``model_runner``), ``async_chunk``, the
  shared-memory connector's chunking (``initial_codec_chunk_frames``, ``codec_chunk_frames``,
  ``codec_left_context_frames``) and per stage the engine arguments and sampling defaults
  (``default_sampling_params``, the talker's ``subtalker_sampling_params``);
- ``vllm_omni/model_executor/models/qwen3_tts/pipeline.py`` (its ``PipelineConfig``): each stage's
  ``model_arch`` and ``sampling_constraints`` (the talker's stop token 2150, ``detokenize``) and the
  code2wav stage's ``tts_args`` (``max_instructions_length``).

The YAML is parsed with PyYAML (what vLLM-Omni's ``load_deploy_config`` reads it into through OmegaConf). The
pipeline module is not imported: it imports ``vllm_omni.config.stage_config``, which needs ``omegaconf`` (not a
dependency of the core's stacks; loading it bare fails with ``ModuleNotFoundError: omegaconf`` there); its
``PipelineConfig(...)`` call is read from the module's source with :mod:`ast` (``ast.literal_eval`` of the literal
keyword arguments), nothing of it executed. Platform overlays (``platforms:``) are not applied: none exists for the
CPU, and on a GPU the core picks the runner itself (``--runner``). Imports neither torch nor vLLM.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import os
import sys
from typing import Any

from omni_backends.errors import BadInputError

DEPLOY_YAML = ("deploy", "qwen3_tts.yaml")
PIPELINE_PY = ("model_executor", "models", "qwen3_tts", "pipeline.py")
#: the stage names of the Qwen3-TTS pipeline, by ``stage_id``
STAGES = ("talker", "code2wav")
#: per-stage deploy keys that are vLLM engine arguments (the rest are vLLM-Omni's own: devices, connectors, ...)
ENGINE_KEYS = ("dtype", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "enable_prefix_caching",
               "enforce_eager", "gpu_memory_utilization", "trust_remote_code", "async_scheduling")


@dataclasses.dataclass(frozen=True)
class Qwen3TTSDeploy:
    """vLLM-Omni 0.30's Qwen3-TTS deployment (:func:`deploy_defaults`).

    - ``engine_args``: ``{"talker": {...}, "code2wav": {...}}``, the YAML's engine arguments per stage
      (:data:`ENGINE_KEYS` present there; e.g. code2wav ``dtype: bfloat16``, ``max_model_len: 65536``);
    - ``model_arch``: ``{"talker": "Qwen3TTSTalkerForConditionalGeneration", "code2wav": "Qwen3TTSCode2Wav"}``
      (the pipeline's, what vLLM-Omni passes as ``hf_overrides`` architectures per stage);
    - ``talker_sampling``: the talker's ``default_sampling_params`` (temperature, top_k, max_tokens, min_tokens,
      repetition_penalty) with the pipeline's ``sampling_constraints`` (``stop_token_ids`` [2150],
      ``detokenize`` False); ``code2wav_sampling``: likewise for code2wav;
    - ``subtalker_sampling``: the code predictor's sampling (do_sample, temperature, top_k, top_p);
    - ``initial_chunk_frames`` (1), ``chunk_frames`` (25), ``left_context_frames`` (72, "must match the decoder
      sliding attention window"): the streaming window of the talker -> code2wav connector;
    - ``model_runner`` (``"v2"``), ``async_chunk`` (True), ``max_instructions_length`` (500);
    - ``connector``: the talker -> code2wav connector as the YAML declares it (``{"name": "SharedMemoryConnector",
      "extra": {...}}``: the chunking above plus what code2wav's ``load_weights`` reads from it, e.g.
      ``decode_batch_max_size`` 4; the ``connectors:`` entry stage 1's ``input_connectors`` names);
    - ``source``: the two files read (absolute paths), ``version``: the installed vllm-omni's.
    """

    engine_args: dict
    model_arch: dict
    talker_sampling: dict
    code2wav_sampling: dict
    subtalker_sampling: dict
    initial_chunk_frames: int
    chunk_frames: int
    left_context_frames: int
    model_runner: str
    async_chunk: bool
    max_instructions_length: int
    connector: dict
    source: tuple[str, str]
    version: str


def _package_dirs() -> list[str]:
    """Where the installed ``vllm_omni`` package lives (the bare package ``core.models.vllm_omni`` may have put in
    ``sys.modules`` has no ``__spec__``, only its ``__path__``)."""
    mod = sys.modules.get("vllm_omni")
    if mod is not None and getattr(mod, "__path__", None):
        return list(mod.__path__)
    spec = importlib.util.find_spec("vllm_omni")
    return list(spec.submodule_search_locations or []) if spec is not None else []


def _wheel_file(parts: tuple[str, ...]) -> str:
    dirs = _package_dirs()
    if not dirs:
        raise BadInputError("vLLM-Omni is not installed; Qwen3-TTS needs its wheel: "
                            "pip install --no-deps vllm-omni==0.30.0 (scripts/setup.sh does)")
    path = os.path.join(dirs[0], *parts)
    if not os.path.isfile(path):
        raise BadInputError(f"the installed vLLM-Omni has no {'/'.join(parts)} ({path}); install vllm-omni==0.30.0")
    return path


def pipeline_stages(path: str) -> list[dict[str, Any]]:
    """The literal keyword arguments of each ``StagePipelineConfig(...)`` call in vLLM-Omni's ``pipeline.py`` at
    ``path``, in source order (values that are not literals, such as the execution-type enum, are left out).
    Raises ``ValueError`` when the file has none."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    stages = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "StagePipelineConfig":
            kw = {}
            for k in node.keywords:
                try:
                    kw[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    continue
            stages.append(kw)
    if not stages:
        raise ValueError(f"{path}: no StagePipelineConfig(...) found")
    return sorted(stages, key=lambda s: s.get("stage_id", 0))


@functools.lru_cache(maxsize=1)
def deploy_defaults() -> Qwen3TTSDeploy:
    """vLLM-Omni's Qwen3-TTS deploy defaults from the installed wheel (cached). Raises
    :class:`~omni_backends.errors.BadInputError` when vLLM-Omni or one of its two files is missing, and
    ``ValueError`` naming the file when a value the core needs is not there (a vLLM-Omni release that changed
    its layout)."""
    import yaml

    from core.models.vllm_omni import installed_version

    yaml_path, pipeline_path = _wheel_file(DEPLOY_YAML), _wheel_file(PIPELINE_PY)
    with open(yaml_path, encoding="utf-8") as f:
        deploy = yaml.safe_load(f)
    stages = {int(s["stage_id"]): s for s in deploy.get("stages", [])}
    pipeline = {int(s["stage_id"]): s for s in pipeline_stages(pipeline_path)}
    if sorted(stages) != [0, 1] or sorted(pipeline) != [0, 1]:
        raise ValueError(f"{yaml_path} / {pipeline_path}: expected stages 0 (talker) and 1 (code2wav)")
    connectors = deploy.get("connectors") or {}
    inputs = list((stages[1].get("input_connectors") or {}).values())
    connector = connectors.get(inputs[0]) if len(inputs) == 1 else None
    extra = (connector or {}).get("extra") or {}
    if "codec_chunk_frames" not in extra:
        raise ValueError(f"{yaml_path}: stage 1 (code2wav) names no input connector with codec_chunk_frames")
    engine_args, sampling, model_arch = {}, {}, {}
    for sid, name in enumerate(STAGES):
        stage, pipe = stages[sid], pipeline[sid]
        engine_args[name] = {k: stage[k] for k in ENGINE_KEYS if k in stage}
        sampling[name] = {**(stage.get("default_sampling_params") or {}), **(pipe.get("sampling_constraints") or {})}
        model_arch[name] = pipe.get("model_arch")
    if model_arch["talker"] is None:  # stage 0 inherits the pipeline-level model_arch
        with open(pipeline_path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), pipeline_path)
        model_arch["talker"] = next(
            ast.literal_eval(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "PipelineConfig" for k in node.keywords if k.arg == "model_arch")
    tts_args = (pipeline[1].get("extras") or {}).get("tts_args") or {}
    return Qwen3TTSDeploy(
        engine_args=engine_args, model_arch=model_arch, talker_sampling=sampling["talker"],
        code2wav_sampling=sampling["code2wav"], subtalker_sampling=dict(stages[0].get("subtalker_sampling_params") or {}),
        initial_chunk_frames=int(extra.get("initial_codec_chunk_frames", extra["codec_chunk_frames"])),
        chunk_frames=int(extra["codec_chunk_frames"]), left_context_frames=int(extra["codec_left_context_frames"]),
        model_runner=str(deploy.get("model_runner", "v1")), async_chunk=bool(deploy.get("async_chunk", False)),
        max_instructions_length=int(tts_args.get("max_instructions_length", 500)),
        connector={"name": str(connector.get("name", "")), "extra": dict(extra)},
        source=(yaml_path, pipeline_path), version=installed_version() or "",
    )


__all__ = ["ENGINE_KEYS", "STAGES", "Qwen3TTSDeploy", "deploy_defaults", "pipeline_stages"]
