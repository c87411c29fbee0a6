"""Patch: a generation model's ``compute_logits`` -- wrapped so that ``None`` becomes zero logits.

- What: :func:`install_logits_fallback` sets ``model.compute_logits`` (an instance attribute) to a wrapper of
  the model's own: where it returns ``None``, the wrapper returns zeros ``[num_tokens, vocab]`` on the hidden
  states' device. Idempotent.
- Why: a generation-kind model produces no text (vLLM-Omni's ``Qwen3TTSCode2Wav`` returns ``None`` from
  ``compute_logits``), while vLLM's runners sample after every forward and need logits; zeros end the
  request after its one step (``max_tokens=1``).
- Versions: vLLM 0.26 through 0.33 (V1 ``execute_model`` and V2 ``sample`` call ``self.model.compute_logits``).
- Until: vLLM runners that skip sampling for a model without text output (vLLM-Omni's generation runner does).
"""

from __future__ import annotations

import functools
from typing import Any

from omni_backends.binding import Patch, VendorSymbol

V1_COMPUTE_LOGITS_CALL = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model",
                                      mentions=("self.model.compute_logits(",))
V2_COMPUTE_LOGITS_CALL = VendorSymbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample",
                                      mentions=("self.model.compute_logits(",))

PATCH = Patch.declare(__name__, __doc__, (V1_COMPUTE_LOGITS_CALL, V2_COMPUTE_LOGITS_CALL))


def install_logits_fallback(model: Any, vocab: int) -> None:
    """Wrap ``model.compute_logits`` (if it has one, once) so that a ``None`` result becomes
    ``torch.zeros(hidden_states.shape[0], vocab)`` on ``hidden_states``' device."""
    import torch

    inner = getattr(model, "compute_logits", None)
    if inner is None or getattr(inner, "__omni_fallback__", False):
        return

    @functools.wraps(inner)
    def compute_logits(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        logits = inner(hidden_states, *args, **kwargs)
        if logits is None and isinstance(hidden_states, torch.Tensor):
            logits = torch.zeros(hidden_states.shape[0], vocab, device=hidden_states.device)
        return logits

    compute_logits.__omni_fallback__ = True  # type: ignore[attr-defined]
    model.compute_logits = compute_logits
