"""vLLM-Omni's Qwen3-TTS models on the core runner.

The classes are vLLM-Omni 0.30.0's own, unchanged, imported through
:mod:`core.models.vllm_omni` (no ``vllm_omni/__init__``, no patches):

- ``Qwen3TTSTalkerForConditionalGeneration`` (AR kind): text -> codec frames
  ``[T, Q]``; codebook 0 is sampled by vLLM, codebooks 1..Q-1 by its code
  predictor, which the runner calls as the talker MTP before each decode forward;
- ``Qwen3TTSCode2Wav`` (generation kind): codec frames -> waveform, in one forward.

Attribute access on this module (``core.models.qwen3_tts:Qwen3TTSCode2Wav``,
the qualified name :func:`core.models.register` gives vLLM's ``ModelRegistry``)
loads the class on first use, in whichever process vLLM builds the model.

Serving a checkpoint in the released layout (imports neither torch nor vLLM until called):

- :func:`read_checkpoint` -> :class:`Qwen3TTSCheckpoint` (:mod:`.checkpoint`): the release's files and config
  checked before any engine starts;
- :func:`deploy_defaults` -> :class:`Qwen3TTSDeploy` (:mod:`.deploy`): vLLM-Omni's ``deploy/qwen3_tts.yaml`` and
  pipeline, read from the installed wheel;
- :class:`TTSRequest`, :func:`check_tts_request`, :func:`talker_inputs` (:mod:`.requests`): vLLM-Omni's speech
  request, built by its own functions;
- :func:`stage_engine_args`, :func:`talker_frames`, :func:`code2wav_inputs`, :func:`code2wav_waveform`
  (:mod:`.stages`): what each stage's engine takes and gives.

Random-weight checkpoints in the released layout (tiny for tests, 0.6B / 1.7B for the bench):
:mod:`.checkpoint_writer`.
"""

from __future__ import annotations

from typing import Any

from core.models.qwen3_tts.layout import MODEL_TYPE, RELEASED_ARCH, SAMPLE_RATE, TASK_TYPES  # noqa: F401

TALKER_ARCH = "Qwen3TTSTalkerForConditionalGeneration"
CODE2WAV_ARCH = "Qwen3TTSCode2Wav"
#: vLLM architecture name -> vLLM-Omni module (under ``vllm_omni.model_executor.models.qwen3_tts``)
ARCHITECTURES = {TALKER_ARCH: "qwen3_tts_talker", CODE2WAV_ARCH: "qwen3_tts_code2wav"}
#: vLLM-Omni's Qwen3-TTS package, relative to ``vllm_omni`` (for :func:`core.models.vllm_omni.load_module`)
PACKAGE = "model_executor.models.qwen3_tts"


def model_class(arch: str) -> type:
    """vLLM-Omni's class for ``arch`` (a key of :data:`ARCHITECTURES`), unchanged."""
    from core.models.vllm_omni import load_module

    return getattr(load_module(f"{PACKAGE}.{ARCHITECTURES[arch]}"), arch)


def config_class() -> type:
    """vLLM-Omni's ``Qwen3TTSConfig`` (``model_type: qwen3_tts``)."""
    from core.models.vllm_omni import load_module

    return load_module(f"{PACKAGE}.configuration_qwen3_tts", platform=False).Qwen3TTSConfig


def register_config() -> bool:
    """Make ``model_type: qwen3_tts`` resolve in vLLM's and transformers' config
    registries (what vLLM-Omni's plugin does, without its patches). Returns
    False when vLLM-Omni is not installed (nothing registered)."""
    from core.models.vllm_omni import installed_version

    if installed_version() is None:
        return False
    from transformers import AutoConfig
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    cls = config_class()
    try:
        AutoConfig.register(MODEL_TYPE, cls)
    except ValueError:  # already registered
        pass
    if MODEL_TYPE not in _CONFIG_REGISTRY:
        _CONFIG_REGISTRY[MODEL_TYPE] = cls
    return True


#: the public API, by the submodule that defines it (loaded on first access)
_API = {
    "read_checkpoint": "checkpoint", "Qwen3TTSCheckpoint": "checkpoint",
    "deploy_defaults": "deploy", "Qwen3TTSDeploy": "deploy",
    "TTSRequest": "requests", "TTSRequestError": "requests", "check_tts_request": "requests",
    "talker_inputs": "requests",
    "stage_engine_args": "stages", "talker_frames": "stages", "code2wav_inputs": "stages",
    "code2wav_waveform": "stages", "code2wav_model_config": "stages",
}


def __getattr__(name: str) -> Any:
    if name in ARCHITECTURES:
        return model_class(name)
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
