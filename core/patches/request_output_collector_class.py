"""Patch: each ``AsyncLLM`` request's output queue (``RequestOutputCollector``) -- its class is swapped.

- What: :func:`omni_collector` sets ``queue.__class__`` to ``core.engine.OmniRequestOutputCollector`` on the
  queue ``AsyncLLM`` hands ``OutputProcessor.add_request`` (only when it is exactly vLLM's class).
- Why: ``AsyncLLM`` builds the queue itself; when a new output arrives before the consumer took the previous
  one, vLLM's ``put`` merges them with ``RequestOutput.add``, which knows only the text fields: the omni queue
  keeps the multimodal outputs too.
- Versions: vLLM 0.26 through 0.33 (``queue`` is ``add_request``'s fifth parameter).
- Until: ``RequestOutput.add`` merging multimodal outputs (vLLM-Omni's ``OmniRequestOutput`` upstream).
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol

_OP = "vllm.v1.engine.output_processor"
COLLECTOR_LAYOUT = VendorSymbol(_OP, "RequestOutputCollector", kind="class", absent=("__slots__",))
#: the queue reaches the processor as ``add_request(request, prompt, parent_req, request_index, queue)``
ADD_REQUEST_QUEUE = VendorSymbol(_OP, "OutputProcessor.add_request",
                                 params=("request", "prompt", "parent_req", "request_index", "queue"),
                                 required=None)
COLLECTOR_PUT = VendorSymbol(_OP, "RequestOutputCollector.put", params=("output",), required=("output",))
COLLECTOR_OUTPUT = VendorSymbol(_OP, "RequestOutputCollector.output", kind="attribute")
COLLECTOR_AGGREGATE = VendorSymbol(_OP, "RequestOutputCollector.aggregate", kind="attribute")

#: ``add_request``'s positional index of ``queue``
QUEUE_ARG = ADD_REQUEST_QUEUE.params.index("queue") - 1  # ``request`` counted, ``self`` not passed

PATCH = Patch.declare(__name__, __doc__, (
    COLLECTOR_LAYOUT, ADD_REQUEST_QUEUE, COLLECTOR_PUT, COLLECTOR_OUTPUT, COLLECTOR_AGGREGATE))


def omni_collector(queue: Any, base: type, cls: type) -> None:
    """Make ``queue`` an instance of ``cls`` when it is exactly vLLM's ``base`` (another class or ``None``:
    left as it is)."""
    if type(queue) is base:
        queue.__class__ = cls
