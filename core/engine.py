"""Carry multimodal outputs worker -> engine core -> caller on vLLM's extension points, step-major.

- worker: the omni runner returns :class:`~core.outputs.OmniModelRunnerOutput`
  (``omni_rows``: this step's host tensors, one per name, with each request's row range);
- engine core: :class:`OmniScheduler` (``scheduler_cls``; over vLLM's
  ``AsyncScheduler`` when async scheduling is on) puts a step's rows on the first
  output of the step only (:class:`OmniEngineCoreOutput`, an ``EngineCoreOutput``
  msgspec subclass with one appended field): nothing per request;
- front end: :func:`attach_omni_frontend` makes the ``LLM``'s engine-core client
  decode :class:`OmniEngineCoreOutputs` and its output processor an
  :class:`OmniOutputProcessor`, which logs each step once and, when it makes a
  request's output, slices that request's rows from the steps since its last read
  and sets ``RequestOutput.multimodal_outputs`` (name -> tensor, steps concatenated
  along dim 0).

Works in vLLM's multiprocess engine (msgspec over ZMQ) and in-process.
Nothing here is device-specific. Where vLLM builds an object with no option for
another class (the output processor, each request's state and queue, the client's
decoder, ``RequestOutput``), the change is a patch in :mod:`core.patches`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import msgspec
import torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

from core.kinds import AR, GENERATION
from core.patches.engine_core_decoder import decode_as
from core.patches.output_processor_class import omni_output_processor
from core.patches.request_output_collector_class import QUEUE_ARG, omni_collector
from core.patches.request_output_field import set_multimodal_outputs
from core.patches.request_state_class import omni_request_state
from core.outputs import StepRows, merge_step_outputs
from core.step_log import STEP_LOG_STEPS, StepAccumulator, StepLog
from core.payloads import EXTRA_ARGS_KEY, unpack
from core.seams import ASYNC_SCHEDULER, ASYNC_SCHEDULING

log = logging.getLogger(__name__)


class OmniEngineCoreOutput(EngineCoreOutput, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    """``EngineCoreOutput`` + the multimodal outputs of the engine's steps since its last output, step-major
    (:class:`~core.outputs.StepRows`: each step's host tensors with every request's row range). Only the
    first output of a step carries them (:class:`OmniSchedulerMixin`); the others leave the field ``None``."""

    omni_rows: list[StepRows] | None = None


class OmniEngineCoreOutputs(EngineCoreOutputs, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    outputs: list[OmniEngineCoreOutput] = []  # type: ignore[assignment]


class OmniSchedulerMixin:
    """Forwards the runner's multimodal outputs; over vLLM's ``Scheduler`` or
    ``AsyncScheduler`` (:func:`omni_scheduler_cls`).

    Per step, not per request: the step's :class:`~core.outputs.StepRows` (``OmniModelRunnerOutput.omni_rows``)
    ride on the first ``EngineCoreOutput`` of each front end's ``EngineCoreOutputs`` (one
    :class:`OmniEngineCoreOutput` per step); the front end (:class:`OmniOutputProcessor`) hands each request
    its rows when it makes that request's output. A step in which a front end gets no output (e.g. only
    chunked-prefill steps) keeps its rows for that front end's next output; they are dropped when no request
    is left. With several front ends (``client_index``) each gets the rows of its own requests.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._omni_held: dict[int, list[StepRows]] = {}
        self._omni_clients: set[int] = set()

    def add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._omni_clients.add(getattr(request, "client_index", 0))
        return super().add_request(request, *args, **kwargs)  # type: ignore[misc]

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> dict[int, EngineCoreOutputs]:
        rows = getattr(model_runner_output, "omni_rows", None)
        held = self._omni_held
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if not rows and not held:  # a stock model, or a step without multimodal outputs
            return result
        clients = self._omni_clients
        if len(clients) <= 1:
            per_client = {next(iter(clients), 0): list(rows or ())}
        else:
            per_client = self._rows_by_client(rows or ())
        for ci, blocks in held.items():
            per_client[ci] = blocks + per_client.get(ci, [])
        held.clear()
        astuple = msgspec.structs.astuple
        for ci, blocks in per_client.items():
            if not blocks:
                continue
            batch = result.get(ci)
            if batch is not None and batch.outputs:
                outs = batch.outputs
                # positional (7x cheaper than asdict + keywords): the parent's fields in order, then ours
                outs[0] = OmniEngineCoreOutput(*astuple(outs[0]), blocks)
            elif self.requests:  # type: ignore[attr-defined]
                held[ci] = blocks  # no output for this front end this step: its next one carries them
        return result

    def _rows_by_client(self, rows: Any) -> dict[int, list[StepRows]]:
        """``rows`` split by the front end (``Request.client_index``) of each request (same tensors);
        requests no longer scheduled are left out."""
        requests = self.requests  # type: ignore[attr-defined]
        out: dict[int, list[StepRows]] = {}
        for ci in self._omni_clients:
            def mine(r: str, ci: int = ci) -> bool:
                req = requests.get(r)
                return req is not None and getattr(req, "client_index", 0) == ci
            out[ci] = [b.only(mine) for b in rows]
        return out


@functools.lru_cache(maxsize=None)
def omni_scheduler_cls(base: type) -> type:
    """:class:`OmniSchedulerMixin` over vLLM's scheduler class ``base``."""
    return type(f"Omni{base.__name__}", (OmniSchedulerMixin, base), {"__module__": __name__})


def scheduler_base(vllm_config: Any) -> type:
    """The scheduler vLLM itself would pick (``SchedulerConfig.get_scheduler_cls``
    without a custom class): ``AsyncScheduler`` when
    ``scheduler_config.async_scheduling`` is on (vLLM's default on CUDA),
    ``Scheduler`` otherwise. A subclass of plain ``Scheduler`` would silently
    turn async scheduling off."""
    if getattr(vllm_config.scheduler_config, ASYNC_SCHEDULING.attr.split(".")[-1]):
        return ASYNC_SCHEDULER.resolve()
    return Scheduler


class OmniScheduler:
    """vLLM's ``scheduler_cls`` for omni engines (``core.stage.SCHEDULER_CLS``).

    vLLM builds the scheduler with keyword arguments
    (``vllm_config=``, ``kv_cache_config=``, ...); this returns an instance of
    ``omni_scheduler_cls(scheduler_base(vllm_config))``, so async scheduling
    stays what the config says."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        return omni_scheduler_cls(scheduler_base(vllm_config))(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _omni_state_cls(base: type) -> type:
    """:class:`OmniRequestState` over vLLM's ``RequestState`` class ``base``."""
    return type(f"Omni{base.__name__}", (OmniRequestState, base), {"__module__": __name__})


class OmniRequestState:
    """Mixed over vLLM's per-request ``RequestState`` (``vllm.v1.engine.output_processor``) by
    :class:`OmniOutputProcessor`: sets ``RequestOutput.multimodal_outputs`` on every output vLLM makes for the
    request (``make_request_output``: the outputs of ``process_outputs`` and the final one of an abort), read
    then from the processor's step-major log (:class:`~core.step_log.StepLog`): the request's rows of the steps
    since its last read, folded into its :class:`~core.step_log.StepAccumulator` (new rows only are copied).
    The accumulator lives on the state, so vLLM frees it when it frees the state (finished or aborted).

    ``RequestOutputKind.DELTA``: the steps since the previous output; ``CUMULATIVE`` / ``FINAL_ONLY``: every
    step so far (``FINAL_ONLY``: read once, at finish)."""

    omni_steps: StepAccumulator
    #: the output processor's log and the position in it up to which this request has read
    omni_log: StepLog
    omni_since: int

    def omni_fold(self) -> None:
        """Move this request's rows of the steps logged since its last read into its accumulator."""
        log = self.omni_log
        if self.omni_since < log.end:
            self.omni_steps.extend(log.steps(self.request_id, self.omni_since))  # type: ignore[attr-defined]
            self.omni_since = log.end

    def omni_take(self) -> dict[str, torch.Tensor]:
        self.omni_fold()
        steps = self.omni_steps
        mm = steps.merged() if len(steps) else {}  # new rows only are copied per read (StepAccumulator)
        if getattr(self, "output_kind", None) == RequestOutputKind.DELTA:
            self.omni_steps = StepAccumulator()
        return mm

    def make_request_output(self, *args: Any, **kwargs: Any) -> Any:
        out = super().make_request_output(*args, **kwargs)  # type: ignore[misc]
        if out is not None and not hasattr(out, "multimodal_outputs") and hasattr(out, "outputs"):
            set_multimodal_outputs(out, self.omni_take())
        return out


class OmniRequestOutputCollector(RequestOutputCollector):
    """vLLM's per-request queue of ``AsyncLLM`` (``RequestOutputCollector``), keeping multimodal outputs when
    it merges a new output into one the consumer has not taken yet (``RequestOutput.add``, which knows only
    the text fields): ``DELTA`` concatenates them along dim 0, the other kinds keep the newer (it holds every
    step). Set on each request's queue by :meth:`OmniOutputProcessor.add_request`."""

    def put(self, output: Any) -> None:
        prev = self.output
        super().put(output)
        if prev is None or prev is output or self.output is not prev or isinstance(output, Exception):
            return
        new = getattr(output, "multimodal_outputs", None) or {}
        if self.aggregate:
            old = getattr(prev, "multimodal_outputs", None) or {}
            set_multimodal_outputs(prev, merge_step_outputs([old, new]) if old and new else dict(old or new))
        elif hasattr(output, "multimodal_outputs"):
            set_multimodal_outputs(prev, new)


class OmniOutputProcessor(OutputProcessor):
    """``OutputProcessor`` that gives each request's outputs ``RequestOutput.multimodal_outputs`` (name ->
    tensor, the engine steps' outputs concatenated along dim 0), for ``vllm.LLM`` (outputs returned by
    ``process_outputs``) and ``AsyncLLM`` (outputs put on the request's ``RequestOutputCollector``) alike:
    the steps are kept on the request's state (:class:`OmniRequestState`), the queue keeps them when it merges
    (:class:`OmniRequestOutputCollector`)."""

    def process_outputs(self, engine_core_outputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        """Log the steps' multimodal outputs (carried by the first output, :class:`OmniSchedulerMixin`) once
        per step, then vLLM's ``process_outputs``: a request reads its rows when its output is made."""
        rows = getattr(engine_core_outputs[0], "omni_rows", None) if engine_core_outputs else None
        if rows:
            log = self.omni_log
            if log is None:
                log = self.omni_log = StepLog()
            if len(log) >= STEP_LOG_STEPS:
                self._omni_compact(log)
            log.extend(rows)
        return super().process_outputs(engine_core_outputs, *args, **kwargs)

    #: the step-major log of multimodal outputs the requests read from (set at the first request)
    omni_log: StepLog | None = None

    def _omni_compact(self, log: StepLog) -> None:
        """Fold every live request's unread rows into its accumulator, then clear the log (every
        :data:`~core.step_log.STEP_LOG_STEPS` steps: per request once per that many steps)."""
        for state in self.request_states.values():
            if isinstance(state, OmniRequestState) and state.omni_log is log:
                state.omni_fold()
        log.clear()

    #: runner kind of the engine this front end feeds (set by :func:`attach_omni_frontend`)
    omni_kind: str = AR
    #: ``payload, prompt_len -> None`` raising ``ValueError`` (the model's ``validate_omni_payload``)
    omni_validate_payload: Any = None

    def add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        """Refuse, in the caller's thread, a request the omni runner would fail on:
        a generation-kind engine produces its output in one forward (``max_tokens=1``)."""
        params = getattr(request, "sampling_params", None)
        if self.omni_kind == GENERATION and params is not None and params.max_tokens != 1:
            raise ValueError(
                f"request {request.request_id}: this is a generation-kind omni engine (one forward per request); "
                f"submit it with SamplingParams(max_tokens=1), not max_tokens={params.max_tokens}"
            )
        validate = self.omni_validate_payload
        if validate is not None and params is not None:
            extra = params.extra_args or {}
            try:
                validate(unpack(extra.get(EXTRA_ARGS_KEY)), len(request.prompt_token_ids or ()))
            except ValueError as exc:
                raise ValueError(f"request {request.request_id}: {exc}") from None
        queue = kwargs.get("queue", args[QUEUE_ARG] if len(args) > QUEUE_ARG else None)
        omni_collector(queue, RequestOutputCollector, OmniRequestOutputCollector)
        result = super().add_request(request, *args, **kwargs)
        state = self.request_states.get(request.request_id)
        if state is not None and not isinstance(state, OmniRequestState):
            log = self.omni_log
            if log is None:
                log = self.omni_log = StepLog()
            omni_request_state(state, _omni_state_cls(type(state)), omni_steps=StepAccumulator(), omni_log=log,
                               omni_since=log.end)
        return result


def _payload_validator(engine: Any) -> Any:
    """The model class's ``validate_omni_payload`` bound to its HF config, or None.

    Resolved through vLLM's ``ModelRegistry`` from the model's architectures
    (imports the model module in the front-end process, builds nothing)."""
    from vllm.model_executor.models.registry import ModelRegistry

    model_config = engine.model_config
    model_cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
    check = getattr(model_cls, "validate_omni_payload", None)
    if check is None:
        return None
    hf_config = model_config.hf_config
    return lambda payload, prompt_len: check(hf_config, payload, prompt_len)


def attach_omni_frontend(llm: Any, kind: str = AR) -> Any:
    """Make the front end of a ``vllm.LLM`` or an ``AsyncLLM`` (``vllm.v1.engine.async_llm``) understand omni
    outputs (see module doc); returns ``llm``.

    Reads the engine's ``output_processor`` and ``engine_core`` (``LLM.llm_engine``'s, or the ``AsyncLLM``'s
    own): the output processor becomes an :class:`OmniOutputProcessor`, a multiprocess client's decoder
    decodes :class:`OmniEngineCoreOutputs` (the ``MsgpackDecoder`` object is kept and its inner decoder
    replaced, so an output task that already holds it -- ``AsyncMPClient`` started in a running loop --
    decodes ours too). Raises ``RuntimeError`` if this vLLM's engine lacks them.
    """
    engine = getattr(llm, "llm_engine", llm)  # vllm.LLM -> its LLMEngine; an AsyncLLM is its own engine
    op = getattr(engine, "output_processor", None)
    if not isinstance(op, OutputProcessor):
        raise RuntimeError(f"vLLM's {type(engine).__name__} has no OutputProcessor at .output_processor; this vLLM "
                           "is not supported")
    omni_output_processor(op, OmniOutputProcessor, omni_kind=kind, omni_validate_payload=_payload_validator(engine))
    decode_as(engine.engine_core, OmniEngineCoreOutputs)  # a multiprocess client: decode our output type
    return llm


def keep_outputs_on_device(llm: Any) -> None:
    """Have the in-process worker of ``llm`` (a ``vllm.LLM`` whose engine core and uni-process executor run in
    this process: vLLM's ``InprocClient`` and ``UniProcExecutor``) keep each step's multimodal outputs on its
    device (the worker's ``omni_outputs_on_device``, :mod:`core.hooks.step_rows`): the step's rows then reach
    this process's front end and ``RequestOutput.multimodal_outputs`` as device tensors, with no host copy and
    no fence per step. Raises ``RuntimeError`` when the worker is not in this process (its outputs would have
    to cross a process boundary)."""
    engine = getattr(llm, "llm_engine", llm)
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)  # InprocClient: the EngineCore
    wrapper = getattr(getattr(core, "model_executor", None), "driver_worker", None)  # UniProcExecutor's
    worker = getattr(wrapper, "worker", None)
    if not callable(getattr(worker, "omni_outputs_on_device", None)):
        raise RuntimeError("outputs on the device need the engine's one omni worker in this process (an in-process "
                           "vllm.LLM with VLLM_ENABLE_V1_MULTIPROCESSING=0 and one worker); this engine's is not")
    worker.omni_outputs_on_device(True)
