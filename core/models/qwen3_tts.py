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

The tests' tiny random checkpoint for these classes is a test fixture:
``tests/fixtures/qwen3_tts/tiny_checkpoint.py``.
"""

from __future__ import annotations

from typing import Any

TALKER_ARCH = "Qwen3TTSTalkerForConditionalGeneration"
CODE2WAV_ARCH = "Qwen3TTSCode2Wav"
MODEL_TYPE = "qwen3_tts"
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


def __getattr__(name: str) -> Any:
    if name in ARCHITECTURES:
        return model_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
