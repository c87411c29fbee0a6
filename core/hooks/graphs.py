"""Graph policy, in one place: when the omni parts run in graphs, and how the talker MTP's graphs are made.

The V1 runner (:mod:`core.runner.v1`), the V2 model state and runner
(:mod:`core.runner.model_state`, :mod:`core.runner.v2`) and
:meth:`core.hooks.OmniHooks.bind_model` all call these, so the policy is the
same on V1 and V2 and on every vLLM of the window:

- :func:`graphs_enabled`: the engine runs graphs at all (not ``enforce_eager``,
  ``cudagraph_mode`` not ``NONE``); otherwise the talker MTP runs eager too.
- :func:`no_full_graphs`: a model taking per-request Python objects lowers
  vLLM's ``cudagraph_mode`` to its non-FULL part before vLLM captures.
- :func:`talker_mtp_buffers`: the talker MTP on persistent buffers
  ``[max_num_reqs, H]``; in graph mode one FULL graph per capture size
  (``omni_backends.policy.capture_sizes``), each selected by
  :func:`mtp_graph_context` (``Backend.forward_context`` with
  ``CUDAGraphMode.FULL`` and ``BatchDescriptor(num_tokens=p)``).
- :func:`capture_talker_mtp`: those graphs, captured after vLLM's own
  ``capture_model`` inside ``Backend.graph_capture_context``.

The vLLM symbols used here are declared in :mod:`core.seams`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, ContextManager

from core.hooks.talker_mtp import TalkerMTP
from core.patches.compilation_config import lower_cudagraph_mode
from core.seams import BATCH_DESCRIPTOR, CUDAGRAPH_CAPTURING, CUDAGRAPH_CAPTURING_FLAG, CUDAGRAPH_MODE
from omni_backends.backend import Backend
from omni_backends.policy import capture_sizes

log = logging.getLogger(__name__)

#: FULL CUDA-graph modes and what is left of each without its FULL part (vLLM's ``CUDAGraphMode`` names)
_WITHOUT_FULL = {"FULL_AND_PIECEWISE": "PIECEWISE", "FULL": "NONE", "FULL_DECODE_ONLY": "NONE"}


def graphs_enabled(vllm_config: Any) -> bool:
    """False when the engine runs without graphs (``model_config.enforce_eager``
    or ``compilation_config.cudagraph_mode`` ``NONE``): the talker MTP then runs
    eager too, so ``--enforce-eager`` compares a wholly eager run."""
    model_config = getattr(vllm_config, "model_config", None)
    if getattr(model_config, "enforce_eager", False):
        return False
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    return mode is None or getattr(mode, "name", str(mode)) != "NONE"


def no_full_graphs(vllm_config: Any, why: str) -> str | None:
    """Lower ``vllm_config.compilation_config.cudagraph_mode`` to its non-FULL part
    (``FULL_AND_PIECEWISE`` -> ``PIECEWISE``; ``FULL`` / ``FULL_DECODE_ONLY`` -> ``NONE``).

    A model whose forward takes vLLM-Omni's per-request Python objects
    (``core.model_io.takes_per_request_kwargs``: ``model_intermediate_buffer``,
    token spans, ...) cannot run in a FULL graph: the capture freezes the dummy
    batch's kwargs and every replay reuses them. PIECEWISE graphs leave the
    model's own code eager and keep working. Called from ``OmniHooks.bind_model``
    (V1 ``load_model``; V2 when the runner binds the model state), before vLLM
    resolves its graph mode and captures. Returns the new mode's name, or None
    if unchanged.
    """
    cc = getattr(vllm_config, "compilation_config", None)
    mode = getattr(cc, "cudagraph_mode", None)
    name = getattr(mode, "name", None)
    if name not in _WITHOUT_FULL:
        return None
    lowered = _WITHOUT_FULL[name]
    lower_cudagraph_mode(cc, type(mode)[lowered])  # the patch core.patches.compilation_config
    log.warning("cudagraph_mode %s -> %s: %s (a FULL graph would freeze them at capture)", name, lowered, why)
    return lowered


def mtp_graph_context(backend: Backend, vllm_config: Any, p: int) -> ContextManager[None]:
    """The FULL forward context that selects the talker-MTP graph for ``p`` rows:
    ``backend.forward_context(None, vllm_config, num_tokens=p,
    cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=BatchDescriptor(num_tokens=p))``."""
    return backend.forward_context(
        None, vllm_config, num_tokens=p, cudagraph_runtime_mode=CUDAGRAPH_MODE.resolve().FULL,
        batch_descriptor=BATCH_DESCRIPTOR.resolve()(num_tokens=p),
    )


def talker_mtp_buffers(backend: Backend, vllm_config: Any, *, graph: bool, max_num_reqs: int, dtype: Any,
                       device: Any) -> Callable[[Any, Any, int], TalkerMTP]:
    """The ``mtp_runner`` that ``OmniHooks.bind_model`` calls as ``(head, eager_head, hidden_size)``: a
    :class:`~core.hooks.TalkerMTP` on persistent buffers ``[max_num_reqs, hidden_size]`` of ``dtype`` on
    ``device``; ``graph=True``: capture sizes ``capture_sizes(max_num_reqs)``, each call under
    :func:`mtp_graph_context`. V1 and V2 build theirs with this."""

    def build(head: Any, eager: Any, hidden_size: int) -> TalkerMTP:
        return TalkerMTP(
            head, max_num_reqs, hidden_size, dtype, device, eager=eager,
            sizes=capture_sizes(max_num_reqs) if graph else None,
            context=functools.partial(mtp_graph_context, backend, vllm_config) if graph else None,
            count_graphs=backend.captured_graphs if graph else None,
        )

    return build


def capture_talker_mtp(mtp: TalkerMTP | None, backend: Backend, device: Any) -> int:
    """Capture the talker MTP's FULL graphs (one per capture size) inside
    ``backend.graph_capture_context(device)``, with vLLM's capture switch
    (``vllm.compilation.monitor.set_cudagraph_capturing_enabled``) on and then
    back as it was. The runners call it after their own ``capture_model`` (V1
    and V2). Returns the number of graphs; 0 when eager, absent or done."""
    if mtp is None or not mtp.sizes or mtp.captured:  # once: a second capture of a size would re-record it
        return 0
    was = bool(CUDAGRAPH_CAPTURING_FLAG.resolve())
    set_capturing = CUDAGRAPH_CAPTURING.resolve()
    set_capturing(True)
    try:
        with backend.graph_capture_context(device):
            n = mtp.capture()
    finally:
        set_capturing(was)
    log.info("captured %d talker-MTP graphs (sizes %s)", n, mtp.sizes)
    return n


__all__ = ["capture_talker_mtp", "graphs_enabled", "mtp_graph_context", "no_full_graphs", "talker_mtp_buffers"]
