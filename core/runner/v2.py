"""The omni model runner for vLLM's V2 runners, built over the driver's base.

:func:`v2_runner_class` combines :class:`OmniV2RunnerMixin` with
``backend.model_runner_base(v2=True)`` (vLLM's ``GPUModelRunner`` in
``vllm.v1.worker.gpu.model_runner``, or the XPU / CPU / Ascend runner built on
it), the driver's :class:`~omni_backends.backend.Backend` passed in as the
class's ``omni_backend``. The mixin overrides four runner methods:

- ``load_model``: vLLM's (or the vendor's), which builds the model, its
  ``ModelState`` and the sampler (a model whose config declares M-RoPE without
  vLLM's ``SupportsMRoPE`` given text positions first, :mod:`core.mrope`); then the omni state is composed with the state
  that was built (:func:`core.runner.model_state.compose_model_state`) and the
  sampler wrapped (:class:`~core.runner.model_state.OmniSampler`). A stock model
  keeps vLLM's state and sampler (:func:`~core.hooks.contract.needs_omni_hooks`).
- ``capture_model``: vLLM's captures, then the talker MTP's (:mod:`core.hooks.graphs`).
- ``initialize_kv_cache``: vLLM's, then, for a model without a KV cache (a code2wav
  with no attention layer), the check that this vLLM's V2 block tables can run it
  (:class:`KVFreeModelUnsupportedError` at engine start otherwise).
- ``sample_tokens``: hands this step's multimodal outputs over as an
  ``OmniModelRunnerOutput`` (``core.model_io.omni_runner_output``), the same
  output seam as V1's; a stock model's output is vLLM's own, unwrapped.

The vLLM symbols are declared in :mod:`core.seams` (``V2_SYMBOLS``, ``V2``).
"""

from __future__ import annotations

from typing import Any

from core.hooks.graphs import capture_talker_mtp
from core.kinds import AR
from core.mrope import text_mrope_on_model_state
from core.patches.runner_sampler import wrap_runner_sampler
from core.runner.classes import omni_runner_class
from core.hooks.contract import needs_omni_hooks
from core.runner.model_state import OmniModelStateMixin, OmniSampler, compose_model_state
from omni_backends.backend import Backend
from omni_backends.errors import OmniBackendError


class KVFreeModelUnsupportedError(OmniBackendError):
    """This vLLM's V2 model runner cannot run a model without a KV cache (raised at engine start)."""


class OmniV2RunnerMixin:
    """The omni seams of a V2 runner (see the module docstring)."""

    omni_kind: str = AR
    #: the driver this runner class was built for (:func:`v2_runner_class`)
    omni_backend: Backend
    #: the hooks of a stock model (no omni state): set for it alone, read by the worker's ``omni_state`` RPC;
    #: its steps pass vLLM's outputs through (``sample_tokens``)
    _omni_output_hooks: Any = None

    @property
    def omni_hooks(self) -> Any:
        """The :class:`~core.hooks.OmniHooks` of this runner (``None`` before
        ``load_model``): the model state's, or for a stock model the runner's own
        (outputs only), where the V1 runner keeps its own (``omni_state`` RPC)."""
        hooks = getattr(getattr(self, "model_state", None), "omni_hooks", None)
        return hooks if hooks is not None else self._omni_output_hooks

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's ``load_model``, then the omni state composed with the state it
        built and the sampler wrapped. Raises
        :class:`~core.runner.model_state.ModelStateCompositionError` (both classes
        named) when the state cannot be composed."""
        with text_mrope_on_model_state(self.vllm_config):  # type: ignore[attr-defined]  # core.mrope
            super().load_model(*args, **kwargs)  # type: ignore[misc]
        state = self.model_state  # type: ignore[attr-defined]
        model = state.model
        if not isinstance(state, OmniModelStateMixin) and not needs_omni_hooks(model, self.omni_kind):
            from core.hooks import OmniHooks

            hooks = OmniHooks(self.omni_backend, self.omni_kind)
            hooks.bind_model(model, None)  # no state, no buffers: what omni_state reports (its steps never use it)
            self._omni_output_hooks = hooks
            return
        if getattr(state, "omni_hooks", None) is None:  # vLLM's / the platform's state, or a declared one unbound
            compose_model_state(state, self.omni_backend, self.omni_kind)
        sampler = getattr(self, "sampler", None)
        if sampler is not None and not isinstance(sampler, OmniSampler):
            wrap_runner_sampler(self, lambda inner: OmniSampler(inner, state))  # the patch core.patches.runner_sampler

    def capture_model(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's captures, then the talker MTP's (:func:`core.hooks.graphs.capture_talker_mtp`);
        nothing more for vLLM 0.33's memory-profiling pass (``profile_only=True``)."""
        n = super().capture_model(*args, **kwargs)  # type: ignore[misc]
        if kwargs.get("profile_only"):
            return n
        state = getattr(self, "model_state", None)
        capture_talker_mtp(getattr(state, "talker_mtp", None), self.omni_backend, self.device)  # type: ignore[attr-defined]
        return n

    def initialize_kv_cache(self, kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        """vLLM's; then, when ``kv_cache_config`` has no KV-cache group (a model with no attention layer, such as
        vLLM-Omni's ``Qwen3TTSCode2Wav``), the check that this vLLM's V2 block tables run such a model.

        (:func:`v2_runs_models_without_kv_cache`). Raises :class:`KVFreeModelUnsupportedError` naming the
        model and the fix, before any step ran."""
        result = super().initialize_kv_cache(kv_cache_config, *args, **kwargs)  # type: ignore[misc]
        if not getattr(kv_cache_config, "kv_cache_groups", None) and not v2_runs_models_without_kv_cache():
            model = type(getattr(getattr(self, "model_state", None), "model", None)).__name__
            raise KVFreeModelUnsupportedError(
                f"{model} has no KV cache (no attention layer) and this vLLM's V2 model runner cannot run "
                f"such a model (its BlockTables assert without a KV-cache group, as in vLLM 0.26; vLLM 0.32+ run it). "
                f"Run this engine on vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0, --runner v1) or a newer vLLM"
            )
        return result

    def sample_tokens(self, grammar_output: Any) -> Any:
        """vLLM's output; for a model with an omni state, with this step's multimodal outputs
        (:func:`core.model_io.omni_runner_output`). A stock model's (no omni state, whose step never has
        outputs) is vLLM's own object, unwrapped, as the V1 runner returns it."""
        out = super().sample_tokens(grammar_output)  # type: ignore[misc]
        if self._omni_output_hooks is not None:
            return out
        from core.model_io import omni_runner_output

        # V2 returns an async output at every step: a real AsyncModelRunnerOutput subclass wraps it
        return omni_runner_output(out, self.omni_hooks)


def v2_runs_models_without_kv_cache() -> bool:
    """Whether this vLLM's V2 ``BlockTables`` run a model without a KV-cache group (seam
    ``core.seams.V2_BLOCK_TABLES_STAGED_WRITES``): vLLM 0.32+'s ``apply_staged_writes`` returns at once
    for no group; vLLM 0.26's asserts a fused writer exists, on every step (and its kernel warm-up divides
    by zero blocks per request). Calls vLLM's own method on the state such block tables have (building
    real ones needs device memory); nothing is written. Imports vLLM."""
    from core.seams import V2_BLOCK_TABLES_STAGED_WRITES

    apply_staged_writes = V2_BLOCK_TABLES_STAGED_WRITES.resolve()  # the vendor's drift is its own error
    probe = type("KVFreeBlockTables", (), {"num_kv_cache_groups": 0, "fused_writer": None})()
    try:
        apply_staged_writes(probe)
    except (AssertionError, AttributeError):
        return False
    return True


def v2_runner_class(base: type, kind: str, backend: Backend) -> type:
    """``OmniV2RunnerMixin`` over the driver's V2 runner ``base``, for ``backend`` (one class per
    ``(base, kind, backend)``, :func:`core.runner.classes.omni_runner_class`). Raises ``ValueError`` for an
    unknown ``kind``."""
    return omni_runner_class(OmniV2RunnerMixin, base, kind, backend)


__all__ = ["KVFreeModelUnsupportedError", "OmniV2RunnerMixin", "v2_runner_class", "v2_runs_models_without_kv_cache"]
