"""Omni models on the core runner: the demo models and vLLM-Omni's own.

:func:`register` is the ``vllm.general_plugins`` entry point: vLLM calls it in
every process (front end, engine core, workers), so the architectures below
resolve everywhere. Registration is by qualified name: no model code is
imported until vLLM builds the model.

- the demo thinker / talker / code2wav (``core.models.demo``);
- vLLM-Omni's Qwen3-TTS talker and code2wav, unchanged classes from the
  installed ``vllm-omni`` wheel (``core.models.qwen3_tts``, loaded without
  vLLM-Omni's patches by ``core.models.vllm_omni``), with the ``qwen3_tts``
  config type; only when that wheel is installed and ``vllm_omni`` was not imported the normal way in the
  process (a vLLM-Omni user's: vLLM-Omni's own plugin registers its classes there; ours then registers the
  demo models only, never raising).
"""

ARCHITECTURES = {
    "OmniDemoThinker": "core.models.demo:OmniDemoThinker",
    "OmniDemoTalker": "core.models.demo:OmniDemoTalker",
    "OmniDemoCode2Wav": "core.models.demo:OmniDemoCode2Wav",
}


def register() -> None:
    """Register the architectures in vLLM's ``ModelRegistry`` (idempotent). In a process an engine owner
    started (an engine core, a worker), first make it end with that owner
    (:func:`omni_backends.engine_lifetime.end_with_owner`; vLLM loads this plugin in every engine-core and
    worker process it spawns, ``core.seams.ENGINE_CORE_LOADS_PLUGINS`` / ``WORKER_LOADS_PLUGINS``)."""
    from omni_backends.engine_lifetime import end_with_owner

    end_with_owner()
    from vllm.model_executor.models.registry import ModelRegistry

    from core.models import qwen3_tts
    from core.models.vllm_omni import imported_normally

    archs = dict(ARCHITECTURES)
    # in a process where vllm_omni was imported the normal way (a vLLM-Omni user's process: its own plugin
    # registers its Qwen3-TTS), the bare loader cannot run: the demo architectures only, and no error
    if not imported_normally() and qwen3_tts.register_config():
        archs.update({arch: f"core.models.qwen3_tts:{arch}" for arch in qwen3_tts.ARCHITECTURES})
    supported = set(ModelRegistry.get_supported_archs())
    for arch, qualname in archs.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, qualname)
