"""Patch: the model instance's ``forward`` -- wrapped so every call vLLM makes returns a tensor.

- What: :func:`install_forward` sets ``model.forward`` (an instance attribute shadowing the class's) to the
  output adapter's wrapper (``core.model_io.ModelOutputAdapter``); :func:`restore_forward` puts back what the
  instance held before (or removes the attribute).
- Why: an omni model's forward returns its multimodal outputs beside the hidden states; vLLM calls the model
  from several places (``_model_forward``, ``_dummy_run`` for profiling, warm-up and graph capture, compiled
  runs) and needs a tensor from each. ``nn.Module.__call__`` looks ``forward`` up on the instance, so one
  instance attribute covers every call site, which a hook around one runner method would not.
- Versions: vLLM 0.26 through 0.33, V1 and V2 runners (the call sites check-drift lists under the seams'
  model calls).
- Until: a vLLM model interface for auxiliary outputs (vLLM-Omni's ``OmniOutput`` upstream).
"""

from __future__ import annotations

from typing import Any, Callable

from omni_backends.binding import Patch, VendorSymbol

#: the runners call the model through ``nn.Module.__call__`` (``self.model(``), which reads the instance forward
V1_MODEL_CALL = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward",
                             mentions=("self.model(",))
V1_DUMMY_RUN_CALL = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._dummy_run",
                                 mentions=("self.model(",))
V2_MODEL_CALL = VendorSymbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
                             mentions=("self.model(",))
RUNNER_MODEL_ATTR = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.model", kind="attribute")

PATCH = Patch.declare(__name__, __doc__, (V1_MODEL_CALL, V1_DUMMY_RUN_CALL, V2_MODEL_CALL, RUNNER_MODEL_ATTR))

#: what ``model.__dict__`` held under ``forward`` when nothing was there
ABSENT = object()


def install_forward(model: Any, forward: Callable[..., Any]) -> Any:
    """Set ``forward`` as ``model``'s instance ``forward``; returns what the instance held before
    (:data:`ABSENT` when nothing: the class's forward was used)."""
    saved = model.__dict__.get("forward", ABSENT)
    model.forward = forward
    return saved


def restore_forward(model: Any, forward: Callable[..., Any], saved: Any) -> None:
    """Undo :func:`install_forward` if ``model``'s instance forward is still ``forward``: put ``saved`` back
    (remove the attribute when it is :data:`ABSENT`)."""
    if model.__dict__.get("forward") is not forward:
        return
    if saved is ABSENT:
        del model.__dict__["forward"]
    else:
        model.__dict__["forward"] = saved
