"""Patch: the V2 runner's ``model_state`` -- its class is swapped, in place, to the omni-composed class.

- What: :func:`compose_in_place` sets ``state.__class__`` to ``type("Omni...", (OmniModelStateMixin,
  type(state)), ...)`` (``core.runner.model_state.omni_state_cls``) on the ``ModelState`` vLLM's (or the
  vendor's) V2 runner built in ``load_model``, then binds the omni hooks; if binding raises, the state's
  ``__dict__`` and class are put back exactly as they were.
- Why: the V2 runner builds its model state itself (``init_model_state``; 0.32+ through
  ``resolve_model_state_cls``) from the model's or the platform's choice (vllm-ascend's ``AscendModelState``);
  composing with whatever was built keeps the vendor's state and adds the omni hooks, which a subclass chosen
  up front could not.
- Versions: vLLM 0.26 through 0.33 (``vllm.v1.worker.gpu.model_states``), vllm-ascend 0.26.
- Until: a V2 runner hook that wraps the model state it built (or a model-state mixin registry).
"""

from __future__ import annotations

from typing import Any, Callable

from omni_backends.binding import Patch, VendorSymbol

_V2 = "vllm.v1.worker.gpu.model_runner"
#: the states vLLM builds keep an instance ``__dict__`` (no ``__slots__``), so a subclass adding none can take over
DEFAULT_MODEL_STATE_LAYOUT = VendorSymbol("vllm.v1.worker.gpu.model_states.default", "DefaultModelState",
                                          kind="class", absent=("__slots__",))
MODEL_STATE_INTERFACE_LAYOUT = VendorSymbol("vllm.v1.worker.gpu.model_states.interface", "ModelState",
                                            kind="class", absent=("__slots__",))
#: the runner builds ``self.model_state`` in ``load_model`` and reads it afterwards (the swap is then seen)
RUNNER_BUILDS_STATE = VendorSymbol(_V2, "GPUModelRunner.load_model", mentions=("self.model_state =",))
RUNNER_STATE_ATTR = VendorSymbol(_V2, "GPUModelRunner.model_state", kind="attribute")

PATCH = Patch.declare(__name__, __doc__, (
    DEFAULT_MODEL_STATE_LAYOUT, MODEL_STATE_INTERFACE_LAYOUT, RUNNER_BUILDS_STATE, RUNNER_STATE_ATTR))


class ClassSwapError(TypeError):
    """The instance layout of a model state does not allow the swap (Python's ``TypeError`` from the
    ``__class__`` assignment, e.g. ``__slots__`` that differ)."""


def compose_in_place(state: Any, cls: type, bind: Callable[[], None]) -> None:
    """Make ``state`` an instance of ``cls`` (a subclass of its class) and call ``bind()``; if either
    raises, ``state`` is left exactly as it was (its ``__dict__`` and class). Raises :class:`ClassSwapError`
    when the instance layout does not allow the swap, and whatever ``bind`` raises."""
    base = type(state)
    before = dict(vars(state))
    if cls is not base:
        try:
            state.__class__ = cls
        except TypeError as e:
            raise ClassSwapError(str(e)) from e
    try:
        bind()
    except BaseException:
        state.__dict__.clear()
        state.__dict__.update(before)
        state.__class__ = base
        raise
