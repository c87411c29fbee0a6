"""Carry multimodal outputs worker -> engine core -> caller on vLLM's extension points.

- worker: the omni runner returns :class:`~core.outputs.OmniModelRunnerOutput`
  (this step's outputs per request);
- engine core: :class:`OmniScheduler` (``scheduler_cls``; over vLLM's
  ``AsyncScheduler`` when async scheduling is on) moves them onto
  :class:`OmniEngineCoreOutput` (an ``EngineCoreOutput`` msgspec subclass with
  one appended field), holding them back for a request until the scheduler
  emits an output for it;
- front end: :func:`attach_omni_frontend` makes the ``LLM``'s engine-core client
  decode :class:`OmniEngineCoreOutputs` and its output processor an
  :class:`OmniOutputProcessor`, which accumulates each request's outputs and
  sets ``RequestOutput.multimodal_outputs`` (name -> tensor, steps concatenated
  along dim 0).

Works in vLLM's multiprocess engine (msgspec over ZMQ) and in-process.
Nothing here is device-specific.
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
from core.outputs import StepAccumulator, merge_step_outputs
from core.payloads import EXTRA_ARGS_KEY, unpack
from core.seams import ASYNC_SCHEDULER, ASYNC_SCHEDULING

log = logging.getLogger(__name__)


class OmniEngineCoreOutput(EngineCoreOutput, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    """``EngineCoreOutput`` + this step's multimodal outputs (name -> CPU tensor)."""

    multimodal_outputs: dict[str, torch.Tensor] | None = None


class OmniEngineCoreOutputs(EngineCoreOutputs, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    outputs: list[OmniEngineCoreOutput] = []  # type: ignore[assignment]


"""vLLM symbols the scheduler choice binds (for the drift check)."""


class OmniSchedulerMixin:
    """Forwards the runner's multimodal outputs; over vLLM's ``Scheduler`` or
    ``AsyncScheduler`` (:func:`omni_scheduler_cls`).

    Outputs of a step in which the scheduler emits nothing for a request
    (e.g. a chunked-prefill step) are held and attached to its next output;
    they are dropped when the request finishes or is aborted.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._omni_pending: dict[str, list[dict[str, torch.Tensor]]] = {}

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> dict[int, EngineCoreOutputs]:
        step = getattr(model_runner_output, "multimodal_outputs", None)
        pending = self._omni_pending
        result = super().update_from_output(scheduler_output, model_runner_output)
        if not step and not pending:  # a stock model, or a step without multimodal outputs
            return result
        step = step or {}
        attached = 0
        astuple = msgspec.structs.astuple
        for eco_batch in result.values():
            outs = eco_batch.outputs
            for j, eco in enumerate(outs):
                rid = eco.request_id
                mm = step.get(rid)
                if mm is not None:
                    attached += 1
                if pending:
                    held = pending.pop(rid, None)
                    if held:  # outputs of earlier steps the scheduler emitted nothing for (chunked prefill)
                        mm = merge_step_outputs(held + [mm] if mm is not None else held)
                if mm:
                    # positional (7x cheaper than asdict + keywords): the parent's fields in order, then ours
                    outs[j] = OmniEngineCoreOutput(*astuple(eco), mm)
        if attached < len(step):  # some requests got no output this step: hold theirs for their next one
            emitted = {eco.request_id for b in result.values() for eco in b.outputs}
            for rid, mm in step.items():
                if rid not in emitted:
                    pending.setdefault(rid, []).append(mm)
        if pending:
            for rid in [r for r in pending if r not in self.requests]:  # finished or aborted: dropped
                del pending[rid]
        return result


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
    :class:`OmniOutputProcessor`: holds the request's multimodal steps not yet handed out and sets
    ``RequestOutput.multimodal_outputs`` on every output vLLM makes for it (``make_request_output``: the
    outputs of ``process_outputs`` and the final one of an abort). The steps live on the state, so vLLM frees
    them when it frees the state (request finished or aborted).

    ``RequestOutputKind.DELTA``: the steps since the previous output; ``CUMULATIVE`` / ``FINAL_ONLY``: every
    step so far (a :class:`~core.outputs.StepAccumulator`: each read copies the new rows only)."""

    omni_steps: StepAccumulator

    def omni_take(self) -> dict[str, torch.Tensor]:
        steps = self.omni_steps
        mm = steps.merged() if len(steps) else {}  # new rows only are copied per read (StepAccumulator)
        if getattr(self, "output_kind", None) == RequestOutputKind.DELTA:
            self.omni_steps = StepAccumulator()
        return mm

    def make_request_output(self, *args: Any, **kwargs: Any) -> Any:
        out = super().make_request_output(*args, **kwargs)  # type: ignore[misc]
        if out is not None and not hasattr(out, "multimodal_outputs") and hasattr(out, "outputs"):
            out.multimodal_outputs = self.omni_take()
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
            prev.multimodal_outputs = merge_step_outputs([old, new]) if old and new else dict(old or new)
        elif hasattr(output, "multimodal_outputs"):
            prev.multimodal_outputs = new


class OmniOutputProcessor(OutputProcessor):
    """``OutputProcessor`` that gives each request's outputs ``RequestOutput.multimodal_outputs`` (name ->
    tensor, the engine steps' outputs concatenated along dim 0), for ``vllm.LLM`` (outputs returned by
    ``process_outputs``) and ``AsyncLLM`` (outputs put on the request's ``RequestOutputCollector``) alike:
    the steps are kept on the request's state (:class:`OmniRequestState`), the queue keeps them when it merges
    (:class:`OmniRequestOutputCollector`)."""

    def process_outputs(self, engine_core_outputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        for eco in engine_core_outputs:
            mm = getattr(eco, "multimodal_outputs", None)
            state = self.request_states.get(eco.request_id) if mm else None
            if state is not None and hasattr(state, "omni_steps"):
                state.omni_steps.append(mm)
        return super().process_outputs(engine_core_outputs, *args, **kwargs)

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
        queue = kwargs.get("queue", args[3] if len(args) > 3 else None)
        if type(queue) is RequestOutputCollector:
            queue.__class__ = OmniRequestOutputCollector
        result = super().add_request(request, *args, **kwargs)
        state = self.request_states.get(request.request_id)
        if state is not None and not isinstance(state, OmniRequestState):
            state.__class__ = _omni_state_cls(type(state))
            state.omni_steps = StepAccumulator()
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
    if not isinstance(op, OmniOutputProcessor):
        op.__class__ = type("Omni" + type(op).__name__, (OmniOutputProcessor, type(op)), {})
    op.omni_kind = kind
    op.omni_validate_payload = _payload_validator(engine)
    client = engine.engine_core
    decoder = getattr(client, "decoder", None)
    if decoder is not None:  # multiprocess client: decode our output type
        inner = getattr(decoder, "decoder", None)
        if inner is None or not hasattr(decoder, "ext_hook"):
            raise RuntimeError("vLLM's engine-core client decoder has an unexpected shape; this vLLM is not supported")
        decoder.decoder = msgspec.msgpack.Decoder(OmniEngineCoreOutputs, ext_hook=decoder.ext_hook, dec_hook=decoder.dec_hook)
    return llm
