"""Patch: a model instance without vLLM's ``SupportsMRoPE`` is given the interface, with text-only positions.

- What: :func:`give_mrope_interface` sets ``model.supports_mrope = True`` and ``model.get_mrope_input_positions``
  (instance attributes) on a model whose config declares M-RoPE but whose class does not implement vLLM's
  ``SupportsMRoPE`` (``core.mrope.provide_text_mrope_positions`` decides and computes the positions).
- Why: vLLM decides from the config that a model uses M-RoPE, then asserts ``supports_mrope(model)`` and asks
  the model for each prompt's positions (V1 ``_init_mrope_positions``, V2 ``RopeState.init_prefill_positions``);
  vLLM-Omni's Qwen3-TTS talker declares M-RoPE in its released config without the interface, and only
  vLLM-Omni's own runner falls back to text positions.
- Versions: vLLM 0.26 through 0.33 (``SupportsMRoPE`` is a runtime-checked protocol read on the instance).
- Until: vLLM-Omni's talker implementing ``SupportsMRoPE`` (or vLLM falling back to text positions itself).
"""

from __future__ import annotations

from typing import Any, Callable

from omni_backends.binding import Patch, VendorSymbol

_INTERFACES = "vllm.model_executor.models.interfaces"
MROPE_INPUT_POSITIONS = VendorSymbol(_INTERFACES, "SupportsMRoPE.get_mrope_input_positions",
                                     params=("input_tokens", "mm_features"), required=("input_tokens", "mm_features"))
#: the runtime-checked flag the protocol test reads on the instance
SUPPORTS_MROPE_FLAG = VendorSymbol(_INTERFACES, "SupportsMRoPE.supports_mrope", kind="attribute")
#: where the runners ask the model (the instance's method is what they call)
V1_INIT_MROPE_POSITIONS = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._init_mrope_positions",
                                       params=("req_state",), required=("req_state",),
                                       mentions=("get_mrope_input_positions",))
V2_ROPE_STATE_INIT = VendorSymbol("vllm.v1.worker.gpu.mm.rope", "RopeState.init_prefill_positions",
                                  params=("req_idx", "model", "prefill_token_ids", "mm_features"),
                                  required=("req_idx", "model", "prefill_token_ids", "mm_features"),
                                  mentions=("get_mrope_input_positions",))

PATCH = Patch.declare(__name__, __doc__, (
    MROPE_INPUT_POSITIONS, SUPPORTS_MROPE_FLAG, V1_INIT_MROPE_POSITIONS, V2_ROPE_STATE_INIT))


def give_mrope_interface(model: Any, positions: Callable[..., Any]) -> None:
    """Make ``model`` (an instance) a ``SupportsMRoPE``: ``supports_mrope = True`` and
    ``get_mrope_input_positions = positions`` (``(input_tokens, mm_features) -> (positions [num_dims, n], delta)``)."""
    model.supports_mrope = True
    model.get_mrope_input_positions = positions
