"""Tiny demo omni models (thinker, talker + MTP, code2wav) on vLLM's own layers.

:func:`register` is the ``vllm.general_plugins`` entry point: vLLM calls it in
every process (front end, engine core, workers), so the architectures below
resolve everywhere. Registration is by qualified name: no model code is
imported until vLLM builds the model.
"""

ARCHITECTURES = {
    "OmniDemoThinker": "core.models.demo:OmniDemoThinker",
    "OmniDemoTalker": "core.models.demo:OmniDemoTalker",
    "OmniDemoCode2Wav": "core.models.demo:OmniDemoCode2Wav",
}


def register() -> None:
    """Register the demo architectures in vLLM's ``ModelRegistry`` (idempotent)."""
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, qualname in ARCHITECTURES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, qualname)
