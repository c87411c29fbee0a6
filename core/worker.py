"""Omni workers: vLLM ``worker_cls`` targets that build the omni runner.

``worker_cls="core.worker.OmniARWorker"`` (or ``OmniGenerationWorker``) is
resolved by vLLM in each worker process through ``getattr`` on this module;
the class is built there, over the driver the parent selected
(``OMNI_BACKENDS_SELECTION``, checked by
:func:`omni_backends.registry.verify_worker_selection`), as
``type(name, (OmniWorkerMixin, backend.worker_base()), {})``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from core.kinds import AR, GENERATION
from core.patches.model_config_fields import apply_model_config_fields
from core.patches.worker_runner import replace_model_runner
from core.runner import build_runner_class
from omni_backends.placement import check_worker_binding, distributed_backend_in_use
from omni_backends.registry import verify_worker_selection

_KIND_BY_NAME = {"OmniARWorker": AR, "OmniGenerationWorker": GENERATION}


class OmniWorkerMixin:
    """After the base worker set its device up and built vLLM's runner,
    replace that runner with the omni runner over the same base
    (:mod:`core.patches.worker_runner`), and set the per-stage model-config
    fields the engine was started with, before the model is built
    (:mod:`core.patches.model_config_fields`)."""

    omni_kind: str = AR

    def init_device(self) -> None:
        backend = verify_worker_selection().backend  # a rank on another driver/stack fails here, before device work
        super().init_device()
        # this rank's device must be the mapping's (the parent already checked the whole world fits; under Ray
        # or DP, local_world_size / local_rank span more than this host's visible list, so check this rank only;
        # Ray assigns each node's GPUs itself, so there only the device type is checked)
        executor = self.parallel_config.distributed_executor_backend
        self.rank_device = check_worker_binding(backend, self.local_rank, self.local_rank + 1,
                                                getattr(self, "device", self.model_runner.device), os.environ,
                                                check_index=executor not in ("ray", "external_launcher"))
        runner_cls = build_runner_class(backend, self.omni_kind, v2=bool(self.vllm_config.use_v2_model_runner))
        replace_model_runner(self, runner_cls)  # the patch core.patches.worker_runner
        apply_model_config_fields(self.vllm_config)  # the patch core.patches.model_config_fields

    def omni_outputs_on_device(self, on: bool = True) -> None:
        """Keep each step's multimodal outputs on this worker's device (``on``) or copy them to the host (the
        default): :attr:`core.hooks.step_rows.StepRowsCollector.outputs_on_device`. Only for a caller in this
        process (:func:`core.engine.keep_outputs_on_device` checks that)."""
        hooks = getattr(self.model_runner, "omni_hooks", None)
        if hooks is not None:
            hooks.rows.outputs_on_device = bool(on)

    def omni_release_request_state(self, keys: list[str]) -> int:
        """Tell this rank's model that the requests keyed ``keys`` ended (``OmniHooks.release_request_state``:
        the model's ``on_requests_finished``), e.g. the utterance whose code2wav chunk requests kept decoder
        state (``llm.collective_rpc("omni_release_request_state", args=(keys,))``); returns how many keys it
        was told."""
        hooks = getattr(self.model_runner, "omni_hooks", None)
        return hooks.release_request_state(keys) if hooks is not None else 0

    def omni_state(self) -> dict[str, Any]:
        """What this rank's omni runner holds (``llm.collective_rpc("omni_state")``):
        driver, runner class, live payload request ids, talker-MTP calls per request."""
        import os

        from omni_backends.registry import current

        runner = self.model_runner
        hooks = getattr(runner, "omni_hooks", None)
        sel = current()
        return {
            "pid": os.getpid(),
            "rank": getattr(self, "rank", None),
            "driver": sel.name if sel else None,
            "fingerprint": sel.fingerprint if sel else None,
            "worker_cls": type(self).__name__,
            "runner_cls": type(runner).__name__,
            "runner_mro": [c.__name__ for c in type(runner).__mro__],
            # V2: the ModelState the runner holds (vLLM's own for a stock model, composed with the omni hooks else)
            "model_state_mro": [c.__name__ for c in type(getattr(runner, "model_state", None)).__mro__]
            if getattr(runner, "model_state", None) is not None else None,
            "payload_ids": hooks.payloads.request_ids() if hooks else None,
            "payload_devices": (
                {r: {k: v.device.type for k, v in hooks.payloads.get(r).items() if hasattr(v, "device")}
                 for r in hooks.payloads.request_ids()} if hooks else None
            ),
            "outputs_on_device": hooks.rows.outputs_on_device if hooks else None,
            "mtp_calls": dict(hooks.mtp_calls) if hooks else None,
            "mtp_calls_finished": dict(hooks.mtp_calls_finished) if hooks else None,
            "mtp_mode": hooks.mtp_mode if hooks else None,
            "forward_requests": dict(hooks.forward_requests) if hooks else None,  # {requests in a forward: count}
            # talker MTP graphs: sizes captured and replays since (None when the head runs eager or is absent)
            "mtp_graph": getattr(getattr(hooks, "talker_mtp", None), "graph_stats", lambda: None)() if hooks else None,
            "peak_memory_bytes": sel.backend.peak_memory() if sel else None,
            "local_rank": getattr(self, "local_rank", None),
            "rank_device": self.rank_device.to_json() if getattr(self, "rank_device", None) else None,
            "dist_backend": distributed_backend_in_use(),
        }


@functools.lru_cache(maxsize=None)
def worker_class(kind: str) -> type:
    """The omni worker class of ``kind`` over the selected driver's worker base."""
    backend = verify_worker_selection().backend
    base = backend.worker_base()
    name = "OmniARWorker" if kind == AR else "OmniGenerationWorker"
    return type(name, (OmniWorkerMixin, base), {"omni_kind": kind, "__module__": __name__})


def __getattr__(name: str) -> Any:
    if name in _KIND_BY_NAME:
        return worker_class(_KIND_BY_NAME[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
