"""Patch: the front end's ``OutputProcessor`` -- its class is swapped to an omni subclass of its own class.

- What: :func:`omni_output_processor` sets ``processor.__class__`` to ``type("Omni" + name, (mixin,
  type(processor)), {})`` (``core.engine.OmniOutputProcessor`` over vLLM's class) on the processor a
  ``vllm.LLM``'s ``LLMEngine`` or an ``AsyncLLM`` built, and sets the mixin's fields on it.
- Why: ``LLMEngine`` and ``AsyncLLM`` build their ``OutputProcessor`` in ``__init__`` with no option for
  another class; the omni front end logs each step's multimodal outputs there and hands each request its rows.
- Versions: vLLM 0.26 through 0.33 (``vllm.v1.engine.output_processor.OutputProcessor``, a plain class).
- Until: an output-processor class option on ``LLMEngine`` / ``AsyncLLM`` (or vLLM-Omni's front end upstream).
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol

OUTPUT_PROCESSOR_LAYOUT = VendorSymbol("vllm.v1.engine.output_processor", "OutputProcessor", kind="class",
                                       absent=("__slots__",))
LLM_ENGINE_PROCESSOR = VendorSymbol("vllm.v1.engine.llm_engine", "LLMEngine.output_processor", kind="attribute")
ASYNC_LLM_PROCESSOR = VendorSymbol("vllm.v1.engine.async_llm", "AsyncLLM.output_processor", kind="attribute")
PROCESS_OUTPUTS = VendorSymbol("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs",
                               params=("engine_core_outputs",), required=None)

PATCH = Patch.declare(__name__, __doc__, (
    OUTPUT_PROCESSOR_LAYOUT, LLM_ENGINE_PROCESSOR, ASYNC_LLM_PROCESSOR, PROCESS_OUTPUTS))


def omni_output_processor(processor: Any, mixin: type, **fields: Any) -> Any:
    """Make ``processor`` an instance of ``mixin`` over its own class (unless it is one) and set ``fields``
    on it; returns ``processor``."""
    if not isinstance(processor, mixin):
        processor.__class__ = type("Omni" + type(processor).__name__, (mixin, type(processor)), {})
    for name, value in fields.items():
        setattr(processor, name, value)
    return processor
