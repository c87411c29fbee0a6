"""Patch: the model runner's ``sampler`` -- replaced by the omni one (V2) or given the driver's rules (V1).

- What: :func:`wrap_runner_sampler` sets ``runner.sampler = wrap(runner.sampler)`` on the model runner vLLM
  built: on V1 after ``__init__``, ``wrap`` is the driver's ``Backend.prepare_sampler`` (the same sampler,
  its top-k / top-p module wrapped in place: :mod:`omni_backends.patches`); on V2 after ``load_model``,
  ``core.runner.model_state.OmniSampler`` around vLLM's sampler.
- Why: vLLM builds the sampler inside the runner with no option for another; the V2 runner calls it right
  after the forward with the batch (``sample``), where the omni hooks process the model's output, and the V1
  sampler must follow the drivers' one-token rule.
- Versions: vLLM 0.26 through 0.33 (V1 ``_sample`` and V2 ``sample`` call ``self.sampler(``).
- Until: a sampler class option on the model runners (and a V2 post-forward hook for model outputs).
"""

from __future__ import annotations

from typing import Any, Callable

from omni_backends.binding import Patch, VendorSymbol

V1_SAMPLER_CALL = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample", mentions=("self.sampler(",))
V2_SAMPLER_CALL_SITE = VendorSymbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample",
                                    mentions=("self.sampler(",))
V1_SAMPLER_ATTR = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sampler", kind="attribute")

PATCH = Patch.declare(__name__, __doc__, (V1_SAMPLER_CALL, V2_SAMPLER_CALL_SITE, V1_SAMPLER_ATTR))


def wrap_runner_sampler(runner: Any, wrap: Callable[[Any], Any]) -> None:
    """``runner.sampler = wrap(runner.sampler)``."""
    runner.sampler = wrap(runner.sampler)
