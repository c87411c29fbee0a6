"""The omni hooks on vLLM's V2 model runner, through an omni ``ModelState``.

vLLM's V2 runner (``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` and the
XPU / Ascend / CPU runners built on it) builds its per-model state with
``init_model_state``, which takes the model's own ``get_model_state_cls()``
first (vLLM 0.32+: ``vllm.v1.worker.gpu.model_states.resolve_model_state_cls``;
0.26: inside ``init_model_state`` itself; declared once, with both spellings,
as :data:`RESOLVE_MODEL_STATE_CLS`). An omni model returns
:func:`model_state_cls` there; no vLLM module global is swapped.

Every seam whose spelling differs across the vLLM versions the drivers
support (0.26 through 0.33) is one ``VendorSymbol`` with ``alternatives``
(``omni_backends.binding``); no code here branches on a version.

The state is a subclass of vLLM's ``DefaultModelState`` (built on first use by
:func:`model_state_cls`, so importing this module imports no vLLM) and calls
the same :class:`~core.hooks.OmniHooks` methods as the V1 runner
(``core.runner``), on a :class:`~core.hooks.BatchView` built from V2's
``InputBatch``:

=================================  ============================================
V2 ``ModelState`` seam             omni hook
=================================  ============================================
``__init__``                       ``bind_model`` (MTP graph wrap via Backend)
``add_request``                    ``on_new_requests``
``remove_request``                 ``on_finished_requests`` (also preemption)
``prepare_inputs_embeds``          ``prepare_prefill_embeds`` (when vLLM builds
(0.26: ``get_mm_embeddings``)      ``inputs_embeds``: multimodal / prompt embeds)
``prepare_inputs``                 ``prepare_prefill_embeds`` and the model's
                                   ``preprocess`` + talker MTP (decode rows) into a
                                   persistent ``inputs_embeds`` buffer;
                                   ``build_extra_kwargs``
model forward hook                 ``core.model_io.ModelOutputAdapter``: every
                                   call returns the text hidden states
``custom_sampler`` (wraps vLLM's)  ``process_model_output`` (``postprocess``,
                                   multimodal outputs) before sampling
runner ``capture_model``           talker-MTP FULL graphs, one per capture size,
                                   after vLLM's captures (:class:`OmniV2RunnerMixin`)
``OmniHooks.bind_model``           no FULL graphs for models taking per-request
                                   omni kwargs (Python objects a graph would freeze):
                                   ``core.hooks.no_full_graphs``, V1 and V2 alike
=================================  ============================================

The one seam no ``ModelState`` reaches is the runner's output:
:class:`OmniV2RunnerMixin` overrides ``sample_tokens`` only, to hand this
step's multimodal outputs over as an ``OmniModelRunnerOutput`` (the V1 runner's
last seam, the same ``get_model_runner_output`` hook).

Graphs. Everything a FULL graph reads or writes lives in persistent buffers
written in place: ``inputs_embeds`` ``[max_num_tokens, H]``; the model's text
hidden states and per-token multimodal outputs ``[max_num_tokens, ...]``
(copied by the adapter on every forward, so a replay refreshes them); the talker MTP's inputs ``[max_num_reqs, H]`` /
``[max_num_reqs]`` int64 and output ``[max_num_reqs, K-1]`` int64
(:class:`core.hooks.TalkerMTP`, width ``mtp_hidden_size``).

Not supported on V2 (a clear error, or documented in ``docs/v2.md``):
speculative decoding, batch-sharded sampling, prefill context parallelism.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import sys
from typing import Any, Callable, ContextManager

from core.kinds import AR, GENERATION, KINDS
from omni_backends.backend import capture_sizes
from omni_backends.binding import VendorSymbol

log = logging.getLogger(__name__)

# ----------------------------------------------------------------- vLLM V2 symbols
# Declared once (omni_backends.binding); tests/core/test_model_state.py runs the
# drift check over them against vLLM 0.33.0's source.
_DEFAULT = "vllm.v1.worker.gpu.model_states.default"
_INTERFACE = "vllm.v1.worker.gpu.model_states.interface"


def _called(module: str, attr: str, *params: str, kind: str = "callable") -> VendorSymbol:
    """A vLLM callable the state calls or overrides with all of ``params``."""
    frame = sys._getframe(1)
    return VendorSymbol(module, attr, params=params, required=params, kind=kind,
                        defined_at=f"{frame.f_code.co_filename}:{frame.f_lineno}")


DEFAULT_MODEL_STATE = _called(_DEFAULT, "DefaultModelState", "vllm_config", "model", "encoder_cache", "device", kind="class")
_STATES = "vllm.v1.worker.gpu.model_states"
#: vLLM asks the model for its ModelState class: 0.32+ in ``resolve_model_state_cls``, 0.26 inline in
#: ``init_model_state`` (both must mention ``get_model_state_cls``; vLLM 0.23's ``init_model_state`` does not)
RESOLVE_MODEL_STATE_CLS = VendorSymbol(
    _STATES, "resolve_model_state_cls", params=("vllm_config", "model"), required=("vllm_config", "model"),
    mentions=("get_model_state_cls",),
    alternatives=(VendorSymbol(_STATES, "init_model_state", params=("vllm_config", "model", "encoder_cache", "device"),
                               required=("vllm_config", "model", "encoder_cache", "device"),
                               mentions=("get_model_state_cls",)),),
)
MS_ADD_REQUEST = _called(_DEFAULT, "DefaultModelState.add_request", "req_index", "new_req_data")
MS_REMOVE_REQUEST = _called(_DEFAULT, "DefaultModelState.remove_request", "req_id")
MS_PREPARE_INPUTS = _called(_DEFAULT, "DefaultModelState.prepare_inputs", "input_batch", "req_states")
#: the runner's embeds of a multimodal / prompt-embeds batch: 0.32+ ``prepare_inputs_embeds``, 0.26 ``get_mm_embeddings``
#: (same parameters); :func:`model_state_cls` binds the omni overlay under whichever name the installed vLLM calls
MS_PREPARE_INPUTS_EMBEDS = VendorSymbol(
    _DEFAULT, "DefaultModelState.prepare_inputs_embeds", params=("scheduled_encoder_inputs", "input_batch", "req_states"),
    required=("scheduled_encoder_inputs", "input_batch", "req_states"),
    alternatives=(VendorSymbol(_DEFAULT, "DefaultModelState.get_mm_embeddings",
                               params=("scheduled_encoder_inputs", "input_batch", "req_states"),
                               required=("scheduled_encoder_inputs", "input_batch", "req_states")),),
)
MS_PREPARE_DUMMY_INPUTS = _called(_DEFAULT, "DefaultModelState.prepare_dummy_inputs", "num_reqs", "num_tokens")
MS_CUSTOM_SAMPLER = _called(_INTERFACE, "ModelState.custom_sampler", "sampler")
# What the state reads: the V2 batch, request state, new-request data, sampler output.
INPUT_BATCH_FIELDS = tuple(
    VendorSymbol("vllm.v1.worker.gpu.input_batch", f"InputBatch.{name}", kind="attribute")
    for name in (
        "req_ids", "num_reqs", "idx_mapping_np", "query_start_loc_np", "num_computed_tokens_np",
        "num_tokens", "num_tokens_after_padding", "input_ids",
    )
)
REQUEST_STATE_PROMPT_LEN = VendorSymbol("vllm.v1.worker.gpu.states", "RequestState.prompt_len", kind="attribute")
REQUEST_STATE_IDS = VendorSymbol("vllm.v1.worker.gpu.states", "RequestState.req_id_to_index", kind="attribute")
NEW_REQUEST_FIELDS = tuple(
    VendorSymbol("vllm.v1.core.sched.output", f"NewRequestData.{name}", kind="attribute")
    for name in ("req_id", "sampling_params")
)
V2_SAMPLER_CALL = _called("vllm.v1.worker.gpu.sample.sampler", "Sampler.__call__", "logits", "input_batch")
V2_SAMPLED_TOKEN_IDS = VendorSymbol("vllm.v1.worker.gpu.sample.output", "SamplerOutput.sampled_token_ids", kind="attribute")
V2_SAMPLE_TOKENS = _called("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens", "grammar_output")
V2_MODEL_STATE_ATTR = VendorSymbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.model_state", kind="attribute")
#: the V2 runner's graph capture (no arguments), after which the talker MTP's graphs are captured (every version)
V2_CAPTURE_MODEL = _called("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model")
#: vLLM's switch that lets a graph wrapper capture (what the runners set around their captures)
CUDAGRAPH_CAPTURING = _called("vllm.compilation.monitor", "set_cudagraph_capturing_enabled", "enabled")
CUDAGRAPH_CAPTURING_FLAG = VendorSymbol("vllm.compilation.monitor", "cudagraph_capturing_enabled", kind="attribute")
BATCH_DESCRIPTOR = VendorSymbol(
    "vllm.forward_context", "BatchDescriptor", params=("num_tokens",), required=("num_tokens",), kind="class"
)
CUDAGRAPH_MODE = VendorSymbol("vllm.config", "CUDAGraphMode", kind="class")
REQUIRES_RAW_INPUT_TOKENS = _called("vllm.model_executor.models.interfaces", "requires_raw_input_tokens", "model")

V2_SYMBOLS: tuple[VendorSymbol, ...] = (
    DEFAULT_MODEL_STATE, RESOLVE_MODEL_STATE_CLS, MS_ADD_REQUEST, MS_REMOVE_REQUEST, MS_PREPARE_INPUTS,
    MS_PREPARE_INPUTS_EMBEDS, MS_PREPARE_DUMMY_INPUTS, MS_CUSTOM_SAMPLER, V2_CAPTURE_MODEL, CUDAGRAPH_CAPTURING,
    CUDAGRAPH_CAPTURING_FLAG,
    *INPUT_BATCH_FIELDS, REQUEST_STATE_PROMPT_LEN, REQUEST_STATE_IDS, *NEW_REQUEST_FIELDS, V2_SAMPLER_CALL,
    V2_SAMPLED_TOKEN_IDS, V2_SAMPLE_TOKENS, V2_MODEL_STATE_ATTR, BATCH_DESCRIPTOR,
    CUDAGRAPH_MODE, REQUIRES_RAW_INPUT_TOKENS,
)
"""Every vLLM V2 symbol this module binds (for the drift check)."""


# ------------------------------------------------------------------ talker MTP
def capture_talker_mtp(mtp: Any, backend: Any, device: Any) -> int:
    """Capture the talker MTP's FULL graphs (one per capture size) inside
    ``Backend.graph_capture_context``, with vLLM's capture switch
    (``vllm.compilation.monitor.set_cudagraph_capturing_enabled``) on and then
    back as it was. The runners call it after their own ``capture_model`` (V1
    and V2, every vLLM of the window). Returns the number of graphs; 0 eager."""
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


def mtp_graph_context(backend: Any, vllm_config: Any, p: int) -> ContextManager[None]:
    """The FULL forward context that selects the talker-MTP graph for ``p`` rows
    (``Backend.forward_context`` with a ``BatchDescriptor(num_tokens=p)``); V1 and V2 use it."""
    return backend.forward_context(
        None, vllm_config, num_tokens=p, cudagraph_runtime_mode=CUDAGRAPH_MODE.resolve().FULL,
        batch_descriptor=BATCH_DESCRIPTOR.resolve()(num_tokens=p),
    )


# ------------------------------------------------------------------ model state
class OmniModelStateMixin:
    """The omni part of the V2 model state (see the module docstring).

    Combined with vLLM's ``DefaultModelState`` by :func:`model_state_cls`;
    ``omni_kind`` is the runner kind (``core.kinds``).
    """

    omni_kind: str = AR

    def __init__(self, vllm_config: Any, model: Any, encoder_cache: Any, device: Any) -> None:
        import torch

        from core.hooks import OmniHooks
        from core.model_io import ModelOutputAdapter, feeds_prompt_embeds
        from omni_backends.registry import get_backend

        if getattr(vllm_config, "speculative_config", None) is not None:
            raise ValueError(
                "the omni V2 model state does not support speculative decoding (its sampler wrapper replaces "
                "vLLM's rejection sampler); remove the speculative config or set VLLM_USE_V2_MODEL_RUNNER=0"
            )
        super().__init__(vllm_config, model, encoder_cache, device)  # type: ignore[call-arg]
        self.backend = get_backend()
        self.omni_hooks = OmniHooks(self.backend, self.omni_kind)
        self.talker_mtp: Any = None  # core.hooks.TalkerMTP
        self.omni_hooks.bind_model(model, vllm_config, mtp_runner=self._static_mtp)
        # vLLM's runner builds inputs_embeds itself for multimodal models, and for --enable-prompt-embeds where
        # its state implements them (``supports_prompt_embeds``, vLLM 0.32+; absent before: not built there)
        self.runner_builds_embeds = bool(self.supports_mm_inputs or (
            self.model_config.enable_prompt_embeds and getattr(self, "supports_prompt_embeds", False)))
        self.omni_inputs_embeds = None
        # only a model whose payloads bring prompt embeddings reads inputs_embeds; others keep vLLM's
        # input_ids path (the same compiled graphs as stock vLLM)
        if not self.runner_builds_embeds and feeds_prompt_embeds(model):
            self.omni_inputs_embeds = torch.zeros(
                self.max_num_tokens, self.inputs_embeds_size, dtype=self.dtype, device=self.device
            )
        self.keep_input_ids = bool(REQUIRES_RAW_INPUT_TOKENS.resolve()(model))
        self._pending: tuple[list[str], Any] | None = None  # (req_ids, BatchView) of this real step
        self._hidden: Any = None
        self._kwargs: dict[str, Any] = {}
        # at the model: every call vLLM makes gets a tensor; outputs (and the hidden states, which the
        # sampler hook reads) land in persistent buffers a FULL-graph replay refreshes
        self.omni_io = ModelOutputAdapter(model, self.max_num_tokens, self.model_config.get_hidden_size(),
                                          self.dtype, keep_hidden=True)

    # ------------------------------------------------------------- talker MTP
    def _static_mtp(self, head: Callable[..., Any], eager: Callable[..., Any], hidden_size: int) -> Any:
        """The talker MTP on persistent buffers ``[max_num_reqs, hidden_size]``
        (``core.hooks.TalkerMTP``); graph mode: one FULL graph per capture size."""
        from core.hooks import TalkerMTP

        graph = self.omni_hooks.mtp_mode == "graph"
        self.talker_mtp = TalkerMTP(
            head, self.max_num_reqs, hidden_size, self.dtype, self.device, eager=eager,
            sizes=capture_sizes(self.max_num_reqs) if graph else None,
            context=self._mtp_graph_context if graph else None,
        )
        return self.talker_mtp

    def _mtp_graph_context(self, p: int) -> ContextManager[None]:
        return mtp_graph_context(self.backend, self.vllm_config, p)

    # ------------------------------------------------------ payload lifecycle
    def add_request(self, req_index: int, new_req_data: Any) -> None:
        super().add_request(req_index, new_req_data)  # type: ignore[misc]
        self.omni_hooks.on_new_requests([(new_req_data.req_id, new_req_data.sampling_params)])

    def remove_request(self, req_id: str) -> None:
        super().remove_request(req_id)  # type: ignore[misc]
        self.omni_hooks.on_finished_requests([req_id])

    # ------------------------------------------------------------- the batch
    def batch_view(self, input_batch: Any, req_states: Any) -> Any:
        """The :class:`~core.hooks.BatchView` of a real V2 batch; ``None`` for a
        dummy batch (profile, warm-up, capture), whose ids are not in ``req_states``."""
        from core.hooks import BatchView

        n = int(input_batch.num_reqs)
        ids = list(input_batch.req_ids[:n])
        index = req_states.req_id_to_index
        if n == 0 or any(r not in index for r in ids):
            return None
        return BatchView(
            req_ids=ids,
            query_start_loc=input_batch.query_start_loc_np[: n + 1].copy(),
            num_computed=input_batch.num_computed_tokens_np[:n].copy(),
            num_prompt=req_states.prompt_len.np[input_batch.idx_mapping_np[:n]].copy(),
        )

    @staticmethod
    def _dummy_view(input_batch: Any) -> Any:
        import numpy as np

        from core.hooks import BatchView

        n = int(input_batch.num_reqs)
        return BatchView(list(input_batch.req_ids[:n]), input_batch.query_start_loc_np[: n + 1].copy(),
                         np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32))

    # ----------------------------------------------------------- model inputs
    #: the name the installed vLLM calls for the runner's embeds (:data:`MS_PREPARE_INPUTS_EMBEDS`), set by
    #: :func:`model_state_cls`, which binds :meth:`omni_inputs_embeds` under it
    vllm_embeds_seam: str = "prepare_inputs_embeds"

    def omni_inputs_embeds(self, scheduled_encoder_inputs: Any, input_batch: Any, req_states: Any) -> Any:
        """vLLM's embeds (multimodal / ``prompt_embeds``), then the omni overlay. Bound as
        ``prepare_inputs_embeds`` (vLLM 0.32+) or ``get_mm_embeddings`` (0.26)."""
        vllm_embeds = getattr(super(), self.vllm_embeds_seam)
        embeds = vllm_embeds(scheduled_encoder_inputs, input_batch, req_states)
        batch = self.batch_view(input_batch, req_states)
        if batch is not None and self.omni_hooks.needs_embeds(batch):
            self.omni_hooks.prepare_prefill_embeds(batch, embeds)
        return embeds

    def prepare_inputs(self, input_batch: Any, req_states: Any) -> dict[str, Any]:
        """vLLM's (M-RoPE positions), plus: ``inputs_embeds`` from the persistent
        buffer ``[num_tokens_after_padding, H]`` (token embeddings with the
        payloads' ``prompt_embeds`` on prompt rows) unless vLLM builds them,
        and the model kwargs extra. Records the batch for the sampler hook."""
        kwargs = dict(super().prepare_inputs(input_batch, req_states))  # type: ignore[misc]
        hooks = self.omni_hooks
        batch = self.batch_view(input_batch, req_states)
        self._pending = (list(batch.req_ids), batch) if batch is not None else None
        self.omni_io.begin_step()
        if self.omni_inputs_embeds is not None:
            n, padded = int(input_batch.num_tokens), int(input_batch.num_tokens_after_padding)
            embeds = self.omni_inputs_embeds[:padded]
            embeds[:n].copy_(self.model.embed_input_ids(input_batch.input_ids[:n]))
            if batch is not None and hooks.needs_embeds(batch):
                hooks.prepare_prefill_embeds(batch, embeds)
                hooks.preprocess(batch, input_batch.input_ids[:n], embeds)  # vLLM-Omni's per-step preprocess + MTP
            kwargs["inputs_embeds"] = embeds
            if not self.keep_input_ids and not hooks.uses_preprocess:
                kwargs["input_ids"] = None
        extra = hooks.build_extra_kwargs(batch if batch is not None else self._dummy_view(input_batch))
        kwargs.update(extra)
        self._kwargs = extra
        return kwargs

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        """vLLM's, plus the persistent ``inputs_embeds`` slice (what a graph
        captured from this dummy batch reads on every replay)."""
        kwargs = dict(super().prepare_dummy_inputs(num_reqs, num_tokens))  # type: ignore[misc]
        self._pending = None
        if self.omni_inputs_embeds is not None:
            kwargs["inputs_embeds"] = self.omni_inputs_embeds[:num_tokens]
            if not self.keep_input_ids:
                kwargs["input_ids"] = None
        return kwargs

    # ---------------------------------------------------------- model output
    def on_sampled(self, input_batch: Any, sampled_token_ids: Any | None) -> None:
        """For a real batch, before sampling (``sampled_token_ids=None``):
        ``process_model_output`` on this step's output (``postprocess``, multimodal
        outputs); after sampling: the step's state is cleared (the talker MTP ran
        before the forward, in ``prepare_inputs``)."""
        if self._pending is None or list(input_batch.req_ids[: input_batch.num_reqs]) != self._pending[0]:
            return  # a dummy sampler run
        batch = self._pending[1]
        if sampled_token_ids is None:
            out = self.omni_io.take(int(input_batch.num_tokens_after_padding))
            self._hidden = self.omni_hooks.process_model_output(out, batch, self._kwargs)
            return
        self._pending, self._hidden = None, None

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any]:
        """Wrap vLLM's V2 sampler (:class:`OmniSampler`); no rejection sampler
        (speculative decoding is refused in ``__init__``)."""
        return OmniSampler(sampler, self), None


class OmniSampler:
    """vLLM's V2 sampler with the omni hooks around it.

    ``__call__(logits [num_logits, vocab], input_batch) -> SamplerOutput``:
    runs ``process_model_output`` for the batch's forward, then vLLM's sampler
    (the talker MTP ran before the forward, in ``prepare_inputs``). Every other
    attribute is the wrapped sampler's (the runner calls ``add_request``,
    ``apply_staged_writes``, reads ``penalties_state``, ...).
    """

    def __init__(self, inner: Any, state: OmniModelStateMixin) -> None:
        self.inner = inner
        self.state = state

    def __call__(self, logits: Any, input_batch: Any) -> Any:
        self.state.on_sampled(input_batch, None)
        out = self.inner(logits, input_batch)
        self.state.on_sampled(input_batch, out.sampled_token_ids)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@functools.lru_cache(maxsize=None)
def model_state_cls(kind: str = AR) -> type:
    """The omni ``ModelState`` class for ``kind``: ``OmniModelStateMixin`` over
    vLLM's ``DefaultModelState``. A model returns it from its
    ``get_model_state_cls()``. Raises ``ValueError`` for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"runner kind must be one of {KINDS}, got {kind!r}")
    base = DEFAULT_MODEL_STATE.resolve()
    name = f"Omni{'AR' if kind == AR else 'Generation'}ModelState"
    seam = MS_PREPARE_INPUTS_EMBEDS.resolve_spelling()[0].attr_name  # prepare_inputs_embeds / get_mm_embeddings
    return type(name, (OmniModelStateMixin, base), {"omni_kind": kind, "__module__": __name__,
                                                   "vllm_embeds_seam": seam, seam: OmniModelStateMixin.omni_inputs_embeds})


# ------------------------------------------------------------------ V2 runner
class OmniV2RunnerMixin:
    """The V2 runner's one omni seam: ``sample_tokens`` hands this step's
    multimodal outputs over as an ``OmniModelRunnerOutput`` (taken from the
    hooks when the step ends, so an output read later by async scheduling gets
    its own step's outputs). ``load_model`` checks the model's state is omni."""

    @property
    def omni_hooks(self) -> Any:
        """The model state's :class:`~core.hooks.OmniHooks` (``None`` before
        ``load_model``), where the V1 runner keeps its own (``omni_state`` RPC)."""
        return getattr(getattr(self, "model_state", None), "omni_hooks", None)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)  # type: ignore[misc]
        state = getattr(self, "model_state", None)
        if not isinstance(state, OmniModelStateMixin):
            from omni_backends.errors import OmniBackendError

            raise OmniBackendError(
                f"the omni V2 runner needs the model's ModelState to be core.model_state's omni state, but vLLM "
                f"built {type(state).__name__}: either {type(self.get_model()).__name__} has no "  # type: ignore[attr-defined]
                "`get_model_state_cls()` returning core.model_state.model_state_cls(kind) (give it one), or this "
                "vLLM / vendor stack does not consult it (vLLM 0.23 and vllm-ascend 0.23's V2 runner do not; "
                "vLLM 0.26 through 0.33 do); set VLLM_USE_V2_MODEL_RUNNER=0 to run the omni hooks on V1"
            )

    def capture_model(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's captures, then the talker MTP's (:func:`capture_talker_mtp`);
        nothing more for vLLM 0.33's memory-profiling pass (``profile_only=True``)."""
        n = super().capture_model(*args, **kwargs)  # type: ignore[misc]
        state = getattr(self, "model_state", None)
        if kwargs.get("profile_only"):
            return n
        capture_talker_mtp(getattr(state, "talker_mtp", None), getattr(state, "backend", None), self.device)  # type: ignore[attr-defined]
        return n

    def sample_tokens(self, grammar_output: Any) -> Any:
        from core.model_io import omni_runner_output

        # V2 returns an async output at every step: a real AsyncModelRunnerOutput subclass wraps it
        return omni_runner_output(super().sample_tokens(grammar_output), self.omni_hooks)  # type: ignore[misc]


@functools.lru_cache(maxsize=None)
def v2_runner_class(base: type, kind: str = AR) -> type:
    """``OmniV2RunnerMixin`` over the driver's V2 runner ``base``."""
    if kind not in KINDS:
        raise ValueError(f"runner kind must be one of {KINDS}, got {kind!r}")
    name = f"Omni{'AR' if kind == AR else 'Generation'}{base.__name__}"
    return type(name, (OmniV2RunnerMixin, base), {"__module__": __name__})


__all__ = [
    "GENERATION", "OmniModelStateMixin", "OmniSampler", "OmniV2RunnerMixin",
    "V2_SYMBOLS", "model_state_cls", "v2_runner_class",
]
