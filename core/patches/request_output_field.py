"""Patch: vLLM's ``RequestOutput`` -- the omni front end sets an attribute ``multimodal_outputs`` on it.

- What: :func:`set_multimodal_outputs` sets ``output.multimodal_outputs`` (name -> tensor, the request's
  engine steps concatenated along dim 0) on a ``vllm.outputs.RequestOutput`` the front end made
  (``core.engine.OmniRequestState``, ``core.engine.OmniRequestOutputCollector``).
- Why: vLLM's ``RequestOutput`` has no field for multimodal outputs; the caller (``vllm.LLM.generate``, an
  ``AsyncLLM`` consumer) receives vLLM's own objects, so the outputs ride on them.
- Versions: vLLM 0.26 through 0.33 (``RequestOutput`` is a plain class, no ``__slots__``, no field of that
  name).
- Until: a multimodal-output field on ``RequestOutput`` (vLLM-Omni's ``OmniRequestOutput`` upstream).
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol

#: a plain class whose instances take new attributes, with no field of ours' name (a vLLM field would clash)
REQUEST_OUTPUT_LAYOUT = VendorSymbol("vllm.outputs", "RequestOutput", kind="class",
                                     absent=("__slots__", "multimodal_outputs"))
#: the merge of two outputs (``AsyncLLM``'s queue) knows only vLLM's fields
REQUEST_OUTPUT_ADD = VendorSymbol("vllm.outputs", "RequestOutput.add", params=("next_output", "aggregate"),
                                  required=("next_output", "aggregate"))

PATCH = Patch.declare(__name__, __doc__, (REQUEST_OUTPUT_LAYOUT, REQUEST_OUTPUT_ADD))


def set_multimodal_outputs(output: Any, value: Any) -> None:
    """``output.multimodal_outputs = value`` on a ``RequestOutput``."""
    output.multimodal_outputs = value
