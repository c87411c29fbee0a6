"""Patch: the V2 runner module's ``init_model_state`` -- replaced for the duration of the runner's ``load_model``.

- What: :func:`replaced_init_model_state` sets ``vllm.v1.worker.gpu.model_runner.init_model_state`` (the name
  the V2 runner's ``load_model`` calls once the model is built) to a wrapper for the ``with`` block only, and
  puts vLLM's back after it; ``core.mrope.text_mrope_on_model_state`` uses it, only when the config declares
  M-RoPE, to give the model vLLM's ``SupportsMRoPE`` before the state is built.
- Why: building the V2 model state asserts the model implements ``SupportsMRoPE`` when the config declares
  M-RoPE (``get_rope_state``), and the model is built inside ``load_model``, so no earlier point can reach it.
- Versions: vLLM 0.26 through 0.33 (``load_model`` calls the module-level ``init_model_state``).
- Until: the same as :mod:`core.patches.model_mrope_interface` (then nothing needs the model before the state).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator

from omni_backends.binding import Patch, VendorSymbol

_V2 = "vllm.v1.worker.gpu.model_runner"
#: the V2 runner's module-level ``init_model_state`` (what its ``load_model`` calls once the model is built)
V2_RUNNER_INIT_MODEL_STATE = VendorSymbol(_V2, "init_model_state", params=("vllm_config", "model"), required=None)
V2_LOAD_MODEL_CALLS_IT = VendorSymbol(_V2, "GPUModelRunner.load_model", mentions=("init_model_state(",))

PATCH = Patch.declare(__name__, __doc__, (V2_RUNNER_INIT_MODEL_STATE, V2_LOAD_MODEL_CALLS_IT))


@contextlib.contextmanager
def replaced_init_model_state(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """Inside the block, the V2 runner module's ``init_model_state`` is ``wrap(vLLM's)``; vLLM's afterwards
    (also when the block raises). Imports vLLM."""
    module = importlib.import_module(V2_RUNNER_INIT_MODEL_STATE.module)
    original = getattr(module, V2_RUNNER_INIT_MODEL_STATE.attr)
    setattr(module, V2_RUNNER_INIT_MODEL_STATE.attr, wrap(original))
    try:
        yield
    finally:
        setattr(module, V2_RUNNER_INIT_MODEL_STATE.attr, original)
