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

from typing import Any

import numpy as np

from core.hooks import BatchView, OmniHooks
from core.hooks.graphs import capture_talker_mtp, talker_mtp_buffers
from core.kinds import AR
from core.runner.classes import omni_runner_class
from core.model_io import ModelOutputAdapter, omni_runner_output
from omni_backends.backend import Backend


class OmniV1RunnerMixin:
    """Omni hooks on a V1 ``GPUModelRunner`` subclass (see module docstring)."""

    omni_kind: str = AR
    #: the driver this runner class was built for (:func:`v1_runner_class`)
    omni_backend: Backend

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.omni_hooks = OmniHooks(self.omni_backend, self.omni_kind)
        # the driver's sampling rules on the sampler vLLM built (in place: its rejection sampler holds it too)
        self.sampler = self.omni_hooks.backend.prepare_sampler(self.sampler)
        self._omni_batch: BatchView | None = None
        self._omni_hidden = None
        self._omni_kwargs: dict[str, Any] | None = None

    # -------------------------------------------------------------- seams
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        self._omni_talker_mtp = None
        old = getattr(self, "_omni_io", None)
        if old is not None:  # a reload: one hook per model
            old.remove()
        # at the model, so every call vLLM makes (_dummy_run, profile, warm-up, graph capture) gets a tensor
        self._omni_io = ModelOutputAdapter(
            self.get_model(), self.max_num_tokens, self.model_config.get_hidden_size(), self.dtype
        )
        self.omni_hooks.bind_model(self.get_model(), self.vllm_config, mtp_runner=self._omni_mtp_runner)
        if getattr(self.omni_hooks, "uses_preprocess", False):  # real steps always pass embeddings: so do dummy runs
            self._omni_io.feed_embeddings(self._omni_dummy_embeds)

    def _omni_dummy_embeds(self, input_ids: Any) -> Any:
        """``[num_tokens, H]``: the persistent ``inputs_embeds`` buffer holding ``input_ids``' token embeddings
        (what vLLM's own dummy run passes for a model taking prompt embeddings)."""
        embeds = self.inputs_embeds.gpu[: input_ids.shape[0]]
        embeds.copy_(self.model.embed_input_ids(input_ids))
        return embeds

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
        self.omni_hooks.on_finished_requests(scheduler_output.finished_req_ids)
        self.omni_hooks.on_new_requests((r.req_id, r.sampling_params) for r in scheduler_output.scheduled_new_reqs)
        return super()._update_states(scheduler_output)

    def _batch_view(self) -> BatchView:
        n = self.input_batch.num_reqs
        ids = list(self.input_batch.req_ids[:n])
        reqs = [self.requests.get(r) for r in ids]
        return BatchView(
            req_ids=ids,
            query_start_loc=self.query_start_loc.np[: n + 1].copy(),
            num_computed=self.input_batch.num_computed_tokens_cpu[:n].copy(),
            num_prompt=self.input_batch.num_prompt_tokens[:n].copy(),
            num_output=np.array([len(r.output_token_ids) if r is not None else 0 for r in reqs], dtype=np.int64),
            max_tokens=[getattr(r.sampling_params, "max_tokens", None) if r is not None else None for r in reqs],
            seeds=[getattr(r.sampling_params, "seed", None) if r is not None else None for r in reqs],
        )

    def _preprocess(self, scheduler_output: Any, num_input_tokens: int, intermediate_tensors: Any = None) -> Any:
        input_ids, inputs_embeds, positions, intermediate_tensors, model_kwargs, ec_out = super()._preprocess(
            scheduler_output, num_input_tokens, intermediate_tensors
        )
        hooks = self.omni_hooks
        batch = self._omni_batch = self._batch_view()
        self._omni_io.begin_step()
        if inputs_embeds is None and hooks.needs_embeds(batch):
            inputs_embeds = self.inputs_embeds.gpu[:num_input_tokens]
            inputs_embeds.copy_(self.model.embed_input_ids(input_ids))
            if not hooks.uses_preprocess:
                input_ids = None
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
        if self._omni_batch is None or not hasattr(hidden, "shape"):  # dummy runs; intermediate tensors (PP)
            return hidden
        self.omni_hooks.process_model_output(self._omni_io.take(hidden), self._omni_batch, self._omni_kwargs)
        self._omni_hidden = hidden
        return hidden

    def sample_tokens(self, grammar_output: Any) -> Any:
        out = super().sample_tokens(grammar_output)
        self._omni_batch, self._omni_hidden, self._omni_kwargs = None, None, None
        return omni_runner_output(out, self.omni_hooks)  # async outputs: a real AsyncModelRunnerOutput


def v1_runner_class(base: type, kind: str, backend: Backend) -> type:
    """``OmniV1RunnerMixin`` over the driver's V1 runner ``base``, for ``backend`` (one class per
    ``(base, kind, backend)``, :func:`core.runner.classes.omni_runner_class`). Raises ``ValueError`` for an
    unknown ``kind``."""
    return omni_runner_class(OmniV1RunnerMixin, base, kind, backend)


__all__ = ["OmniV1RunnerMixin", "v1_runner_class"]
