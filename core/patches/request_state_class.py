"""Patch: each request's ``RequestState`` in the front end -- its class is swapped to an omni subclass.

- What: :func:`omni_request_state` sets ``state.__class__`` to ``core.engine.OmniRequestState`` over the
  state's own class on the ``RequestState`` vLLM's ``OutputProcessor.add_request`` just stored in
  ``request_states``, and sets the omni fields (the request's step accumulator, the processor's step log and
  the position read so far).
- Why: vLLM makes a request's ``RequestOutput`` in ``RequestState.make_request_output`` and builds the
  state itself (``RequestState.from_new_request``) with no option for another class; the omni state adds the
  request's multimodal outputs to every output vLLM makes.
- Versions: vLLM 0.26 through 0.33.
- Until: a request-state class option on ``OutputProcessor`` (or vLLM-Omni's front end upstream).
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol

_OP = "vllm.v1.engine.output_processor"
REQUEST_STATE_LAYOUT = VendorSymbol(_OP, "RequestState", kind="class", absent=("__slots__",))
#: ``add_request`` stores the state it built under the request id (where the patch finds it)
STATE_STORED = VendorSymbol(_OP, "OutputProcessor.add_request", mentions=("self.request_states[request_id] =",))
#: every output of a request is made by its state (the omni state's override adds the multimodal outputs)
MAKE_OUTPUT = VendorSymbol(_OP, "RequestState.make_request_output",
                           params=("new_token_ids", "pooling_output", "finish_reason", "stop_reason"),
                           required=("new_token_ids", "pooling_output", "finish_reason", "stop_reason"))

PATCH = Patch.declare(__name__, __doc__, (REQUEST_STATE_LAYOUT, STATE_STORED, MAKE_OUTPUT))


def omni_request_state(state: Any, cls: type, **fields: Any) -> Any:
    """Make ``state`` an instance of ``cls`` (an omni subclass of its class) and set ``fields`` on it;
    returns ``state``."""
    state.__class__ = cls
    for name, value in fields.items():
        setattr(state, name, value)
    return state
