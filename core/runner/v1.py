"""The omni model runner for vLLM's V1 runners, built over the driver's base.

:func:`v1_runner_class` combines :class:`OmniV1RunnerMixin` with
``backend.model_runner_base(v2=False)`` at run time (``type(name, (mixin, base), {...})``),
the driver's :class:`~omni_backends.backend.Backend` passed in as the class's ``omni_backend``.
The mixin overrides only narrow seams of vLLM's ``GPUModelRunner`` (which the
CPU, XPU and Ascend V1 runners subclass) and calls :class:`~core.hooks.OmniHooks`
in them; which hook runs in which seam is the V1/V2 x hook table of
``docs/core-runner.md`` (checked against :mod:`core.seams` by ``tests/test_docs.py``).

No body of ``execute_model``, ``_dummy_run`` or ``sample_tokens`` is copied.
What these seams rely on in the base runner is declared in :mod:`core.seams` (``V1_SYMBOLS``, ``V1``);
graph policy (the talker MTP's graphs) is :mod:`core.hooks.graphs`.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from core.hooks import BatchView, OmniHooks
from core.hooks.contract import needs_omni_hooks
from core.hooks.graphs import capture_talker_mtp, graphs_enabled, talker_mtp_buffers
from core.kinds import AR
from core.mrope import provide_text_mrope_positions
from core.patches.runner_sampler import wrap_runner_sampler
from core.runner.classes import omni_runner_class
from core.model_io import ModelOutputAdapter, omni_runner_output, prompt_embeds_without_embeds_path
from omni_backends.backend import Backend


class StepPlan(enum.Enum):
    """What the runner does around a step, chosen once per model by ``OmniV1RunnerMixin.load_model``.

    - ``STOCK``: a stock vLLM model (no omni contract, :func:`core.hooks.contract.needs_omni_hooks`): vLLM's
      steps run untouched;
    - ``LEAN``: a model that reads nothing per request before its forward (no preprocess, a forward taking none
      of the per-request or runner kwargs): a step builds nothing before the forward and its batch view after it
      (a step carrying prompt embeddings takes ``VIEW``'s path);
    - ``VIEW``: the batch view built before the forward (offsets, computed and prompt tokens);
    - ``VIEW_FACTS``: that view with ``num_output`` / ``max_tokens`` / ``seeds`` too (the model reads them).
    """

    STOCK = "stock"
    LEAN = "lean"
    VIEW = "view"
    VIEW_FACTS = "view+facts"


#: ``_omni_batch`` of a real ``LEAN`` step, whose batch view is built after the forward
_AFTER_FORWARD = object()
#: the extra model kwargs the AR runner hands the hooks (``OmniHooks.build_extra_kwargs``)
_RUNNER_KWARGS = frozenset(("sampling_metadata", "sampler"))


class OmniV1RunnerMixin:
    """Omni hooks on a V1 ``GPUModelRunner`` subclass (see module docstring)."""

    omni_kind: str = AR
    #: the driver this runner class was built for (:func:`v1_runner_class`)
    omni_backend: Backend
    #: what a step does for this model (:class:`StepPlan`, set by ``load_model``)
    _omni_plan: StepPlan = StepPlan.VIEW_FACTS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.omni_hooks = OmniHooks(self.omni_backend, self.omni_kind)
        # the driver's sampling rules on the sampler vLLM built (in place: its rejection sampler holds it too)
        wrap_runner_sampler(self, self.omni_hooks.backend.prepare_sampler)  # the patch core.patches.runner_sampler
        self._omni_batch: Any = None  # BatchView, _AFTER_FORWARD, or None outside a real step
        self._omni_kwargs: dict[str, Any] | None = None

    # -------------------------------------------------------------- seams
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        self._omni_talker_mtp = None
        old = getattr(self, "_omni_io", None)
        if old is not None:  # a reload: one adapter per model
            old.remove()
            self._omni_io = None
        model = self.get_model()
        provide_text_mrope_positions(model, self.model_config)  # M-RoPE config, no SupportsMRoPE (core.mrope)
        self.omni_hooks.bind_model(model, self.vllm_config, mtp_runner=self._omni_mtp_runner)
        self._omni_plan = self._step_plan(model)

    def _step_plan(self, model: Any) -> StepPlan:
        """The model's :class:`StepPlan`; for all but a stock model (which gets no adapter, no hooks in its steps,
        as V2 keeps vLLM's ModelState for it) its output adapter installed."""
        if not needs_omni_hooks(model, self.omni_kind):
            return StepPlan.STOCK
        # at the model (its forward wrapped, no module hook), so every call vLLM makes (_dummy_run, profile,
        # warm-up, graph capture) gets a tensor; persistent buffers only where a captured graph may replay it
        self._omni_io = ModelOutputAdapter(model, self.max_num_tokens, self.model_config.get_hidden_size(),
                                           self.dtype, persistent=graphs_enabled(self.vllm_config),
                                           exact_tokens=bool(getattr(self.omni_hooks, "exact_tokens", False)))
        hooks = self.omni_hooks
        if getattr(hooks, "uses_preprocess", False):  # real steps always pass embeddings: so do dummy runs
            self._omni_io.feed_embeddings(self._omni_dummy_embeds)
        if getattr(hooks, "passes_request_state", True) or getattr(hooks, "uses_preprocess", False):
            return StepPlan.VIEW_FACTS
        params = getattr(getattr(hooks, "contract", None), "forward_params", None)
        lean = params is not None and (hooks.kind != AR or not (_RUNNER_KWARGS & params))
        return StepPlan.LEAN if lean else StepPlan.VIEW

    def _omni_dummy_embeds(self, input_ids: Any) -> Any:
        """``[num_tokens, H]``: the persistent ``inputs_embeds`` buffer as it is -- what vLLM's own dummy run
        passes for a model taking prompt embeddings. Nothing is written into it here: a FULL graph captured
        from this call must read the buffer the real step's ``preprocess`` (and talker MTP) filled, not
        recompute the token embeddings over it (a dummy run that filled it made the Qwen3-TTS talker's decode
        codes wrong under FULL_AND_PIECEWISE; ``docs/core-runner.md``)."""
        return self.inputs_embeds.gpu[: input_ids.shape[0]]

    def _omni_mtp_runner(self, head: Any, eager: Any, hidden_size: int) -> Any:
        """The talker MTP on persistent buffers ``[max_num_reqs, hidden_size]``
        (:func:`core.hooks.graphs.talker_mtp_buffers`, shared with V2)."""
        build = talker_mtp_buffers(self.omni_backend, self.vllm_config, graph=self.omni_hooks.mtp_mode == "graph",
                                   max_num_reqs=self.max_num_reqs, dtype=self.dtype, device=self.device)
        self._omni_talker_mtp = build(head, eager, hidden_size)
        return self._omni_talker_mtp

    def capture_model(self) -> int:
        """vLLM's captures, then the talker MTP's (:func:`core.hooks.graphs.capture_talker_mtp`)."""
        n = super().capture_model()
        capture_talker_mtp(getattr(self, "_omni_talker_mtp", None), self.omni_backend, self.device)
        return n

    def _update_states(self, scheduler_output: Any) -> Any:
        if self._omni_plan is not StepPlan.STOCK:
            self.omni_hooks.on_finished_requests(scheduler_output.finished_req_ids)
            if scheduler_output.scheduled_new_reqs:
                self.omni_hooks.on_new_requests((r.req_id, r.sampling_params)
                                                for r in scheduler_output.scheduled_new_reqs)
        return super()._update_states(scheduler_output)

    def _batch_view(self) -> BatchView:
        """The scheduled batch; ``num_output`` only when the forward takes the per-request state
        (``generated_len``), ``max_tokens`` / ``seeds`` only for a model with ``preprocess``."""
        batch = self.input_batch
        n = batch.num_reqs
        view = BatchView(
            req_ids=batch.req_ids[:n],
            query_start_loc=self.query_start_loc.np[: n + 1].copy(),
            num_computed=batch.num_computed_tokens_cpu[:n].copy(),
            num_prompt=batch.num_prompt_tokens[:n].copy(),
        )
        if self._omni_plan is not StepPlan.VIEW_FACTS:
            return view
        reqs = list(map(self.requests.get, view.req_ids))
        if None in reqs:  # a request vLLM no longer holds has no tokens
            outputs = [r.output_token_ids if r is not None else () for r in reqs]
        else:
            outputs = [r.output_token_ids for r in reqs]
        view.num_output = np.fromiter(map(len, outputs), dtype=np.int64, count=n)
        if self.omni_hooks.uses_preprocess:
            view.max_tokens = [getattr(r.sampling_params, "max_tokens", None) if r is not None else None
                               for r in reqs]
            view.seeds = [getattr(r.sampling_params, "seed", None) if r is not None else None for r in reqs]
        return view

    def _lean_batch_view(self) -> BatchView:
        """The scheduled batch of a lean model's step, read after the forward: offsets and computed tokens as
        int lists (what the output hooks read; no array copies), prompt lengths a view of vLLM's array."""
        batch = self.input_batch
        n = batch.num_reqs
        return BatchView(batch.req_ids[:n], self.query_start_loc.np[: n + 1].tolist(),
                         batch.num_computed_tokens_cpu[:n].tolist(), batch.num_prompt_tokens[:n])

    def _preprocess(self, scheduler_output: Any, num_input_tokens: int, intermediate_tensors: Any = None) -> Any:
        out = super()._preprocess(scheduler_output, num_input_tokens, intermediate_tensors)
        if self._omni_plan is StepPlan.STOCK:
            return out
        input_ids, inputs_embeds, positions, intermediate_tensors, model_kwargs, ec_out = out
        hooks = self.omni_hooks
        self._omni_io.begin_step()
        if self._omni_plan is StepPlan.LEAN and not hooks.payloads.with_embeds:  # nothing read per step is built
            self._omni_batch, self._omni_kwargs = _AFTER_FORWARD, model_kwargs  # vLLM's model kwargs, as they are
            return out
        batch = self._omni_batch = self._batch_view()
        if inputs_embeds is None and hooks.needs_embeds(batch):
            if not hooks.uses_preprocess:  # embeddings on some steps only: the call signature would change
                raise prompt_embeds_without_embeds_path(self.model)
            inputs_embeds = self.inputs_embeds.gpu[:num_input_tokens]  # input_ids stay, as in dummy runs
            inputs_embeds.copy_(self.model.embed_input_ids(input_ids))
        if inputs_embeds is not None:
            hooks.prepare_prefill_embeds(batch, inputs_embeds)
            if hooks.uses_preprocess:
                ids = input_ids if input_ids is not None else self.input_ids.gpu[:num_input_tokens]
                hooks.preprocess(batch, ids, inputs_embeds)
        extra = {"sampling_metadata": self.input_batch.sampling_metadata, "sampler": self.sampler} \
            if hooks.kind == AR else {}
        model_kwargs.update(hooks.build_extra_kwargs(batch, **extra))
        self._omni_kwargs = model_kwargs
        return input_ids, inputs_embeds, positions, intermediate_tensors, model_kwargs, ec_out

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        hidden = super()._model_forward(*args, **kwargs)  # a tensor: the adapter sits at the model
        batch = self._omni_batch
        if self._omni_plan is StepPlan.STOCK or batch is None or not hasattr(hidden, "shape"):  # dummy runs; PP
            return hidden
        hooks = self.omni_hooks
        if batch is _AFTER_FORWARD:  # the same step's arrays: vLLM changes them only in the next _update_states
            if hooks.outputs_only:  # no model hook to run: the forward's outputs to the step's rows in one call
                mm = self._omni_io.outputs()
                if mm:
                    ib = self.input_batch
                    n = ib.num_reqs
                    hooks.rows.collect(mm, ib.req_ids[:n], self.query_start_loc.np[: n + 1],
                                       ib.num_computed_tokens_cpu[:n])
                return hidden
            batch = self._omni_batch = self._lean_batch_view()
        hooks.process_model_output(self._omni_io.take(hidden), batch, self._omni_kwargs)
        return hidden

    def sample_tokens(self, grammar_output: Any) -> Any:
        out = super().sample_tokens(grammar_output)
        if self._omni_plan is StepPlan.STOCK:
            return out
        self._omni_batch, self._omni_kwargs = None, None
        return omni_runner_output(out, self.omni_hooks)  # async outputs: a real AsyncModelRunnerOutput


def v1_runner_class(base: type, kind: str, backend: Backend) -> type:
    """``OmniV1RunnerMixin`` over the driver's V1 runner ``base``, for ``backend`` (one class per
    ``(base, kind, backend)``, :func:`core.runner.classes.omni_runner_class`). Raises ``ValueError`` for an
    unknown ``kind``."""
    return omni_runner_class(OmniV1RunnerMixin, base, kind, backend)


__all__ = ["OmniV1RunnerMixin", "StepPlan", "v1_runner_class"]
