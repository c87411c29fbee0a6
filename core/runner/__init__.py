"""The omni model runner, one-way: worker -> V1 / V2 runner -> hooks -> model I/O -> outputs.

::

    core.worker              OmniWorkerMixin: builds the runner over the driver's worker base
      core.runner            build_runner_class(backend, kind, v2=...)
        .v1                  OmniV1RunnerMixin over backend.model_runner_base(v2=False)
        .v2                  OmniV2RunnerMixin over backend.model_runner_base(v2=True)
        .model_state         the omni ModelState, composed with the one vLLM / the platform built
      core.hooks             OmniHooks (RFC-005's protocol), BatchView, the model contract, TalkerMTP,
                             graph policy (core.hooks.graphs)
      core.model_io          ModelOutputAdapter, the runner output
      core.outputs           OmniOutput, OmniModelRunnerOutput
    core.seams               every vLLM symbol and seam the above rely on (what check-drift reads)

V1 never imports V2; both take the driver's :class:`~omni_backends.backend.Backend`
from :func:`build_runner_class` (as the class's ``omni_backend``), never from a
process global.
"""

from __future__ import annotations

from core.kinds import AR, KINDS
from core.runner.model_state import (
    ModelStateCompositionError,
    OmniModelStateMixin,
    OmniSampler,
    compose_model_state,
    model_state_cls,
    omni_state_cls,
)
from core.runner.v1 import OmniV1RunnerMixin, v1_runner_class
from core.runner.v2 import OmniV2RunnerMixin, v2_runner_class
from omni_backends.backend import Backend
from omni_backends.errors import OmniBackendError


def build_runner_class(backend: Backend, kind: str = AR, *, v2: bool = False) -> type:
    """The omni runner class for ``backend``: the V1 or V2 mixin over the
    driver's base runner (``backend.model_runner_base(v2=...)``).

    Raises ``ValueError`` for an unknown ``kind``, :class:`OmniBackendError`
    when V2 is asked of a driver whose ``capabilities().v2_runner`` is False,
    and the driver's error when it cannot supply the base runner.
    """
    if kind not in KINDS:
        raise ValueError(f"runner kind must be one of {KINDS}, got {kind!r}")
    if v2:
        if not backend.capabilities().v2_runner:
            raise OmniBackendError(
                f"vLLM selected its V2 model runner (VLLM_USE_V2_MODEL_RUNNER / config) but driver {backend.name!r} "
                "cannot run it (capabilities().v2_runner is False); set VLLM_USE_V2_MODEL_RUNNER=0"
            )
        return v2_runner_class(backend.model_runner_base(v2=True), kind, backend)
    return v1_runner_class(backend.model_runner_base(v2=False), kind, backend)


__all__ = [
    "ModelStateCompositionError", "OmniModelStateMixin", "OmniSampler", "OmniV1RunnerMixin", "OmniV2RunnerMixin",
    "build_runner_class", "compose_model_state", "model_state_cls", "omni_state_cls",
    "v1_runner_class", "v2_runner_class",
]
