"""The omni hooks on vLLM's V2 model runner, through the model's ``ModelState``.

vLLM's V2 runner (``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` and the
XPU / Ascend / CPU runners built on it) builds its per-model state in
``load_model`` with ``init_model_state``: the model's own
``get_model_state_cls()`` if it has one, else the state vLLM picks for it
(``DefaultModelState``, the encoder-decoder or Mamba state; 0.32+ through
``resolve_model_state_cls``), or, on a vendor stack, the vendor's (vllm-ascend
replaces ``init_model_state`` and builds its ``AscendModelState``, whose
``prepare_attn`` builds the NPU attention metadata).

**The runner decides the omni state, not the model.** After that state is built,
the omni V2 runner (:mod:`core.runner.v2`) composes the omni hooks with it:
:func:`compose_model_state` rebases the instance onto
``type(f"Omni{Base}", (OmniModelStateMixin, Base), ...)`` (:func:`omni_state_cls`)
and binds the hooks (:meth:`OmniModelStateMixin.bind_omni`), so every method of
the state vLLM or the platform built (``prepare_attn`` included) stays the one
that runs, and the omni overrides call it through ``super()``. A model whose
state already is omni (``get_model_state_cls`` returning :func:`model_state_cls`)
is bound as it is. A model with no omni contract at all (a stock vLLM class)
keeps vLLM's state untouched (:func:`core.hooks.contract.needs_omni_hooks`, the rule V1 shares): it runs exactly as on
stock V2. Seams whose spelling differs across vLLM versions are one
``VendorSymbol`` with ``alternatives`` in :mod:`core.seams`; no code here branches
on a version.

Which hook runs in which ``ModelState`` / runner seam is the V1/V2 x hook table
of ``docs/core-runner.md`` (checked against :mod:`core.seams` by ``tests/test_docs.py``).

Graphs. Everything a FULL graph reads or writes lives in persistent buffers
written in place: ``inputs_embeds`` ``[max_num_tokens, H]``; the model's text
hidden states and per-token multimodal outputs ``[max_num_tokens, ...]``
(copied by the adapter on every forward, so a replay refreshes them); the talker
MTP's inputs ``[max_num_reqs, H]`` / ``[max_num_reqs]`` int64 and output
``[max_num_reqs, K-1]`` int64 (:class:`core.hooks.TalkerMTP`, width ``mtp_hidden_size``).

Not supported on V2 (a clear error, or documented in ``docs/v2.md``):
speculative decoding, batch-sharded sampling, prefill context parallelism.
"""

from __future__ import annotations

import abc
import functools
import logging
from typing import Any

from core.hooks.contract import read_contract
from core.hooks.graphs import talker_mtp_buffers
from core.kinds import AR, GENERATION, KINDS
from core.patches.model_state_class import ClassSwapError, compose_in_place
from core.seams import (
    DEFAULT_MODEL_STATE,
    MODEL_STATE_INTERFACE,
    MS_PREPARE_INPUTS_EMBEDS,
    REQUIRES_RAW_INPUT_TOKENS,
)
from omni_backends.backend import Backend
from omni_backends.errors import OmniBackendError

log = logging.getLogger(__name__)


class ModelStateCompositionError(OmniBackendError):
    """The omni hooks cannot be composed with a model state class (raised at load, naming both classes)."""

    @classmethod
    def for_state(cls, base: type, why: str) -> "ModelStateCompositionError":
        """The error for state class ``base``: ``why`` it cannot be composed, and the fix."""
        return cls(
            f"cannot compose the omni hooks (core.runner.model_state.OmniModelStateMixin) with the model state "
            f"{getattr(base, '__module__', '?')}.{getattr(base, '__qualname__', base)}: {why}. Fix the state class, "
            "or run this model on vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0)"
        )


#: the vLLM ``ModelState`` methods the omni state overrides (each calls the base's through ``super()``)
STATE_SEAMS = ("add_request", "remove_request", "prepare_inputs", "prepare_dummy_inputs")


class OmniModelStateMixin(abc.ABC):
    """The omni part of a V2 model state (see the module docstring).

    Composed over the state class vLLM or the platform chose
    (:func:`omni_state_cls`); inert until :meth:`bind_omni` (so a state class a
    model returns from ``get_model_state_cls`` also runs on stock vLLM, as that
    class). ``omni_kind`` is the runner kind (``core.kinds``). Its base is
    ``abc.ABC``, as vLLM's ``ModelState`` interface's is, so a built state's
    class can become the composed one (same instance layout).
    """

    omni_kind: str = AR
    #: the name the installed vLLM calls for the runner's embeds (``core.seams.MS_PREPARE_INPUTS_EMBEDS``),
    #: set by :func:`omni_state_cls`, which binds :meth:`omni_inputs_embeds` under it
    vllm_embeds_seam: str = "prepare_inputs_embeds"
    #: :class:`~core.hooks.OmniHooks` once bound, else ``None`` (every override then only calls the base)
    omni_hooks: Any = None

    # ------------------------------------------------------------- binding
    def bind_omni(self, backend: Backend, kind: str | None = None) -> None:
        """Bind the omni hooks to this (already built) state: ``bind_model`` on
        ``self.model`` (talker MTP on persistent buffers, graph-wrapped through
        ``backend``), the persistent ``inputs_embeds`` buffer
        ``[max_num_tokens, inputs_embeds_size]`` when the model feeds prompt
        embeddings, and the model output adapter. Raises ``ValueError`` for
        speculative decoding; whatever it raises, the state is left as it was."""
        import torch

        from core.hooks import OmniHooks
        from core.model_io import ModelOutputAdapter, feeds_prompt_embeds

        vllm_config = self.vllm_config  # type: ignore[attr-defined]
        if getattr(vllm_config, "speculative_config", None) is not None:
            raise ValueError(
                "the omni V2 model state does not support speculative decoding (its sampler wrapper replaces "
                "vLLM's rejection sampler); remove the speculative config or set VLLM_USE_V2_MODEL_RUNNER=0"
            )
        model = self.model  # type: ignore[attr-defined]
        hooks = OmniHooks(backend, kind or self.omni_kind)
        self.talker_mtp: Any = None  # core.hooks.TalkerMTP
        hooks.bind_model(model, vllm_config, mtp_runner=functools.partial(self._static_mtp, backend, hooks))
        # vLLM's runner builds inputs_embeds itself for multimodal models, and for --enable-prompt-embeds where
        # its state implements them (``supports_prompt_embeds``, vLLM 0.32+; absent before: not built there)
        self.runner_builds_embeds = bool(self.supports_mm_inputs or (  # type: ignore[attr-defined]
            self.model_config.enable_prompt_embeds and getattr(self, "supports_prompt_embeds", False)))  # type: ignore[attr-defined]
        self.omni_inputs_embeds = None
        # only a model whose payloads bring prompt embeddings reads inputs_embeds; others keep vLLM's
        # input_ids path (the same compiled graphs as stock vLLM)
        if not self.runner_builds_embeds and feeds_prompt_embeds(model):
            self.omni_inputs_embeds = torch.zeros(
                self.max_num_tokens, self.inputs_embeds_size, dtype=self.dtype, device=self.device  # type: ignore[attr-defined]
            )
        self.keep_input_ids = bool(REQUIRES_RAW_INPUT_TOKENS.resolve()(model))
        # with the omni inputs_embeds, input_ids go along where the model reads them (vLLM's
        # requires_raw_input_tokens; a preprocess hook reads the step's ids): the same on real steps, dummy
        # runs and graph captures (one call signature per engine: core.model_io.ModelOutputAdapter)
        self.pass_input_ids = self.keep_input_ids or hooks.uses_preprocess
        self._pending: tuple[list[str], Any] | None = None  # (req_ids, BatchView) of this real step
        self._kwargs: dict[str, Any] = {}
        # at the model: every call vLLM makes gets a tensor; outputs (and the hidden states, where a model hook
        # reads them in the sampler hook: not for a model without one) land in persistent buffers a FULL-graph
        # replay refreshes
        self.omni_io = ModelOutputAdapter(model, self.max_num_tokens,  # type: ignore[attr-defined]
                                          self.model_config.get_hidden_size(), self.dtype,  # type: ignore[attr-defined]
                                          keep_hidden=not hooks.outputs_only, exact_tokens=hooks.exact_tokens)
        self.backend = backend
        self.omni_hooks = hooks  # last: the state counts as bound only when all of the above is set

    def _static_mtp(self, backend: Backend, hooks: Any, head: Any, eager: Any, hidden_size: int) -> Any:
        """The talker MTP on persistent buffers ``[max_num_reqs, hidden_size]``
        (:func:`core.hooks.graphs.talker_mtp_buffers`, shared with V1)."""
        build = talker_mtp_buffers(backend, self.vllm_config, graph=hooks.mtp_mode == "graph",  # type: ignore[attr-defined]
                                   max_num_reqs=self.max_num_reqs, dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]
        self.talker_mtp = build(head, eager, hidden_size)
        return self.talker_mtp

    # ------------------------------------------------------ payload lifecycle
    def add_request(self, req_index: int, new_req_data: Any) -> None:
        super().add_request(req_index, new_req_data)  # type: ignore[misc]
        if self.omni_hooks is not None:
            self.omni_hooks.on_new_requests([(new_req_data.req_id, new_req_data.sampling_params)])

    def remove_request(self, req_id: str) -> None:
        super().remove_request(req_id)  # type: ignore[misc]
        if self.omni_hooks is not None:
            self.omni_hooks.on_finished_requests([req_id])

    # ------------------------------------------------------------- the batch
    def batch_view(self, input_batch: Any, req_states: Any) -> Any:
        """The :class:`~core.hooks.BatchView` of a real V2 batch; ``None`` for a
        dummy batch (profile, warm-up, capture), whose ids are not in ``req_states``."""
        from core.hooks import BatchView

        n = int(input_batch.num_reqs)
        ids = list(input_batch.req_ids[:n])
        index = req_states.req_id_to_index
        if n == 0 or not all(map(index.__contains__, ids)):
            return None
        # snapshots of vLLM's arrays: offsets and computed tokens as int lists (what the output hooks read as
        # they are), prompt lengths a new array (numpy's fancy index copies)
        return BatchView(
            req_ids=ids,
            query_start_loc=input_batch.query_start_loc_np[: n + 1].tolist(),
            num_computed=input_batch.num_computed_tokens_np[:n].tolist(),
            num_prompt=req_states.prompt_len.np[input_batch.idx_mapping_np[:n]],
        )

    @staticmethod
    def _dummy_view(input_batch: Any) -> Any:
        import numpy as np

        from core.hooks import BatchView

        n = int(input_batch.num_reqs)
        return BatchView(list(input_batch.req_ids[:n]), input_batch.query_start_loc_np[: n + 1].copy(),
                         np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32), dummy=True)

    # ----------------------------------------------------------- model inputs
    def omni_inputs_embeds(self, scheduled_encoder_inputs: Any, input_batch: Any, req_states: Any) -> Any:
        """vLLM's embeds (multimodal / ``prompt_embeds``), then the omni overlay. Bound as
        ``prepare_inputs_embeds`` (vLLM 0.32+) or ``get_mm_embeddings`` (0.26)."""
        vllm_embeds = getattr(super(), self.vllm_embeds_seam)
        embeds = vllm_embeds(scheduled_encoder_inputs, input_batch, req_states)
        if self.omni_hooks is None:
            return embeds
        batch = self.batch_view(input_batch, req_states)
        if batch is not None and self.omni_hooks.needs_embeds(batch):
            self.omni_hooks.prepare_prefill_embeds(batch, embeds)
        return embeds

    def prepare_inputs(self, input_batch: Any, req_states: Any) -> dict[str, Any]:
        """The base state's (M-RoPE positions, ...), plus: ``inputs_embeds`` from
        the persistent buffer ``[num_tokens_after_padding, H]`` (token embeddings
        with the payloads' ``prompt_embeds`` on prompt rows) unless vLLM builds
        them, and the model kwargs extra. Records the batch for the sampler hook."""
        kwargs = dict(super().prepare_inputs(input_batch, req_states))  # type: ignore[misc]
        hooks = self.omni_hooks
        if hooks is None:
            return kwargs
        batch = self.batch_view(input_batch, req_states)
        self._pending = (list(batch.req_ids), batch) if batch is not None else None
        self.omni_io.begin_step()
        if self.omni_inputs_embeds is not None:
            n, padded = int(input_batch.num_tokens), int(input_batch.num_tokens_after_padding)
            embeds = self.omni_inputs_embeds[:padded]
            embeds[:n].copy_(self.model.embed_input_ids(input_batch.input_ids[:n]))  # type: ignore[attr-defined]
            if batch is not None and hooks.needs_embeds(batch):
                hooks.prepare_prefill_embeds(batch, embeds)
                hooks.preprocess(batch, input_batch.input_ids[:n], embeds)  # vLLM-Omni's per-step preprocess + MTP
            kwargs["inputs_embeds"] = embeds
            if not self.pass_input_ids:
                kwargs["input_ids"] = None
        elif batch is not None and not self.runner_builds_embeds and hooks.needs_embeds(batch):
            from core.model_io import prompt_embeds_without_embeds_path

            raise prompt_embeds_without_embeds_path(self.model)  # type: ignore[attr-defined]
        extra = hooks.build_extra_kwargs(batch if batch is not None else self._dummy_view(input_batch))
        kwargs.update(extra)
        self._kwargs = extra
        return kwargs

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        """The base state's, plus the persistent ``inputs_embeds`` slice (what a
        graph captured from this dummy batch reads on every replay)."""
        kwargs = dict(super().prepare_dummy_inputs(num_reqs, num_tokens))  # type: ignore[misc]
        if self.omni_hooks is None:
            return kwargs
        self._pending = None
        if self.omni_inputs_embeds is not None:
            kwargs["inputs_embeds"] = self.omni_inputs_embeds[:num_tokens]
            if not self.pass_input_ids:  # as prepare_inputs: a capture from here replays for real steps
                kwargs["input_ids"] = None
        return kwargs

    # ---------------------------------------------------------- model output
    def on_sampled(self, input_batch: Any, sampled_token_ids: Any | None = None) -> None:
        """For a real batch, before sampling: this step's output to its rows -- one call of the hooks'
        :class:`~core.hooks.step_rows.StepRowsCollector` for a model with no output hook
        (``OmniHooks.outputs_only``), else ``process_model_output`` (``postprocess``, multimodal outputs) --
        once per batch ``prepare_inputs`` made (the step's state is cleared then; the talker MTP ran before the
        forward, in ``prepare_inputs``). ``sampled_token_ids``: not read (the sampler's output, where a caller
        has it)."""
        hooks, pending = self.omni_hooks, self._pending
        if hooks is None or pending is None or list(input_batch.req_ids[: input_batch.num_reqs]) != pending[0]:
            return  # unbound, a dummy sampler run, or this batch's outputs were taken already
        self._pending = None
        batch = pending[1]
        if hooks.outputs_only:
            mm = self.omni_io.outputs()
            if mm:
                hooks.rows.collect(mm, batch.req_ids, batch.query_start_loc, batch.num_computed)
            return
        hooks.process_model_output(self.omni_io.take(int(input_batch.num_tokens_after_padding)), batch, self._kwargs)


#: names :class:`OmniModelStateMixin` adds to a state (a base class defining one of them conflicts)
OMNI_STATE_NAMES = frozenset(
    {n for n in vars(OmniModelStateMixin) if not n.startswith(("__", "_abc_"))} - set(STATE_SEAMS)
    | {"talker_mtp", "runner_builds_embeds", "omni_inputs_embeds", "keep_input_ids", "pass_input_ids", "omni_io", "backend",
       "_pending", "_kwargs"}
)


class OmniSampler:
    """vLLM's V2 sampler with the omni hooks around it.

    ``__call__(logits [num_logits, vocab], input_batch) -> SamplerOutput``:
    takes the batch's outputs (``on_sampled``), then runs vLLM's sampler
    (the talker MTP ran before the forward, in ``prepare_inputs``). Every other
    attribute is the wrapped sampler's (the runner calls ``add_request``,
    ``apply_staged_writes``, reads ``penalties_state``, ...). The omni V2 runner
    wraps its ``sampler`` in one after ``load_model`` (:mod:`core.runner.v2`).
    """

    def __init__(self, inner: Any, state: OmniModelStateMixin) -> None:
        self.inner = inner
        self.state = state

    def __call__(self, logits: Any, input_batch: Any) -> Any:
        self.state.on_sampled(input_batch, None)
        return self.inner(logits, input_batch)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "state"):
            raise AttributeError(name)
        return getattr(self.inner, name)


# ------------------------------------------------------------------ composition
def _why_not_composable(base: type) -> str | None:
    """Why the omni hooks cannot be composed over ``base`` (None when they can)."""
    interface = MODEL_STATE_INTERFACE.resolve()
    if not (isinstance(base, type) and issubclass(base, interface)):
        return f"it is not a subclass of vLLM's {interface.__module__}.{interface.__qualname__}"
    embeds = MS_PREPARE_INPUTS_EMBEDS.resolve_spelling()[0].attr_name
    missing = [n for n in (*STATE_SEAMS, embeds) if not callable(getattr(base, n, None))]
    if missing:
        return (f"it has no {', '.join(missing)} (the omni hooks run in these ModelState methods; this vLLM / "
                "vendor stack's V2 runner does not call them)")
    clash = sorted(n for klass in base.__mro__ if not issubclass(OmniModelStateMixin, klass)
                   for n in vars(klass) if n in OMNI_STATE_NAMES)
    if clash:
        return (f"it defines {', '.join(dict.fromkeys(clash))}, which the omni hooks define differently "
                "(rename them in the state class)")
    if getattr(base, "__slots__", None):
        return "it declares __slots__ (the omni state adds attributes)"
    return None


@functools.lru_cache(maxsize=None)
def omni_state_cls(base: type, kind: str = AR) -> type:
    """``OmniModelStateMixin`` composed over the state class ``base`` for runner
    ``kind``, the embeds overlay bound under the name the installed vLLM calls.
    Raises ``ValueError`` for an unknown kind and :class:`ModelStateCompositionError`
    (naming both classes and the fix) when ``base`` cannot be composed."""
    if kind not in KINDS:
        raise ValueError(f"runner kind must be one of {KINDS}, got {kind!r}")
    if isinstance(base, type) and issubclass(base, OmniModelStateMixin):
        return base
    why = _why_not_composable(base)
    if why is not None:
        raise ModelStateCompositionError.for_state(base, why)
    seam = MS_PREPARE_INPUTS_EMBEDS.resolve_spelling()[0].attr_name  # prepare_inputs_embeds / get_mm_embeddings
    default = base is DEFAULT_MODEL_STATE.resolve()
    name = f"Omni{'AR' if kind == AR else 'Generation'}ModelState" if default else f"Omni{base.__name__}"
    return type(name, (OmniModelStateMixin, base), {"omni_kind": kind, "__module__": __name__,
                                                   "vllm_embeds_seam": seam, seam: OmniModelStateMixin.omni_inputs_embeds})


def model_state_cls(kind: str = AR) -> type:
    """The omni ``ModelState`` class for ``kind`` over vLLM's ``DefaultModelState``
    (a model may return it from its ``get_model_state_cls()``; the omni V2 runner
    does not need it to). Raises ``ValueError`` for an unknown kind."""
    return omni_state_cls(DEFAULT_MODEL_STATE.resolve(), kind)


def compose_model_state(state: Any, backend: Backend, kind: str) -> OmniModelStateMixin:
    """Compose the omni hooks with ``state``, the ModelState the runner built,
    in place (its class becomes :func:`omni_state_cls` of its class: the patch
    :mod:`core.patches.model_state_class`), and bind them (:meth:`OmniModelStateMixin.bind_omni`). Raises
    :class:`ModelStateCompositionError` when its class cannot be composed, and
    whatever binding raises; in both cases ``state`` is left exactly as it was."""
    base = type(state)
    cls = omni_state_cls(base, kind)
    clash = sorted(n for n in vars(state) if n in OMNI_STATE_NAMES)
    if clash and not isinstance(state, OmniModelStateMixin):  # set by the base's __init__: bind_omni would overwrite
        raise ModelStateCompositionError.for_state(
            base, f"its instance sets {', '.join(clash)}, which the omni hooks set differently (rename them in the "
            "state class)")
    try:
        compose_in_place(state, cls, lambda: state.bind_omni(backend, kind))
    except ClassSwapError as e:  # an instance layout the composed class does not share
        raise ModelStateCompositionError.for_state(base, str(e)) from e
    return state


__all__ = [
    "GENERATION", "ModelStateCompositionError", "OMNI_STATE_NAMES", "OmniModelStateMixin", "OmniSampler",
    "STATE_SEAMS", "compose_model_state", "model_state_cls", "omni_state_cls",
]
