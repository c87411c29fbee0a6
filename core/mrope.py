"""M-RoPE positions for a model whose config declares M-RoPE but whose class does not implement vLLM's
``SupportsMRoPE``, on the V1 and V2 runners alike.

vLLM decides that a model uses M-RoPE from its config (``ModelConfig.uses_mrope``: an ``mrope_section`` in the
text config's rope parameters), then asks the *model* for each prompt's positions:
``model.get_mrope_input_positions(input_tokens, mm_features) -> (positions [num_dims, n], delta)`` -- V1 in
``GPUModelRunner._init_mrope_positions`` after ``assert supports_mrope(model)``, V2 when it builds the model
state (``get_rope_state`` asserts ``isinstance(model, SupportsMRoPE)``) and per new request
(``RopeState.init_prefill_positions``). vLLM-Omni's own runner has a fallback for a model without the
interface (``OmniGPUModelRunner._init_mrope_positions`` -> ``MRotaryEmbedding.get_input_positions_tensor``);
vLLM's does not. The released Qwen3-TTS talker is such a model: its config has an interleaved M-RoPE
(``rope_scaling.mrope_section``) and dummy vision token ids (-1, "for mrope"), its prompts are text only.

:func:`provide_text_mrope_positions` gives such a model instance vLLM's interface with the text-only positions
vLLM-Omni's fallback computes for a prompt without vision tokens: ``arange(n)`` on every position channel,
delta 0 (vLLM then continues decode positions from the context length, the same on every channel). A prompt
with multimodal features gets one clear error instead (its positions depend on the model's grids). Called
by the V1 runner's ``load_model`` and around the V2 runner's (:func:`text_mrope_on_model_state`) before vLLM
builds its model state. The vLLM symbols are declared in :mod:`core.seams` (``MROPE_SYMBOLS``); the two changes
of vLLM objects are the patches :mod:`core.patches.model_mrope_interface` and :mod:`core.patches.v2_init_model_state`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from core.patches.model_mrope_interface import give_mrope_interface
from core.patches.v2_init_model_state import replaced_init_model_state


class MRoPEFeaturesUnsupportedError(ValueError):
    """A prompt with multimodal features reached a model whose M-RoPE positions the core provides (text only)."""


def needs_text_mrope_positions(model: Any, model_config: Any) -> bool:
    """Whether ``model_config`` declares M-RoPE (vLLM's ``ModelConfig.uses_mrope``) and ``model`` does not
    implement vLLM's ``SupportsMRoPE`` (``supports_mrope``). Imports vLLM."""
    if not getattr(model_config, "uses_mrope", False):
        return False
    from core.seams import SUPPORTS_MROPE

    return not SUPPORTS_MROPE.resolve()(model)


def text_mrope_positions(input_tokens: Any, mm_features: Any, num_dims: int = 3) -> tuple[Any, int]:
    """``(positions, delta)`` of a text-only prompt: int64 ``[num_dims, len(input_tokens)]``, every row
    ``0..n-1``, delta 0 (what vLLM-Omni's ``MRotaryEmbedding.get_input_positions_tensor`` gives a prompt without
    vision tokens). Raises :class:`MRoPEFeaturesUnsupportedError` when ``mm_features`` is not empty."""
    import torch

    if mm_features:
        raise MRoPEFeaturesUnsupportedError(
            f"this model has no M-RoPE position function of its own (vLLM's SupportsMRoPE) and the core provides "
            f"text-only positions; the prompt has {len(mm_features)} multimodal feature(s). Send a text-only prompt")
    n = len(input_tokens)
    return torch.arange(n, dtype=torch.int64).expand(num_dims, n).clone(), 0


def provide_text_mrope_positions(model: Any, model_config: Any) -> bool:
    """Give ``model`` (an instance) vLLM's ``SupportsMRoPE`` interface with :func:`text_mrope_positions` when
    :func:`needs_text_mrope_positions`; a model that has its own is left alone. Returns whether it was given.
    The instance gets ``supports_mrope = True`` and ``get_mrope_input_positions(input_tokens, mm_features)``
    (``num_dims`` from ``model_config.mrope_num_dims``). Idempotent."""
    if not needs_text_mrope_positions(model, model_config):
        return False
    num_dims = int(getattr(model_config, "mrope_num_dims", 3) or 3)

    def get_mrope_input_positions(input_tokens: Any, mm_features: Any = (), **_: Any) -> tuple[Any, int]:
        return text_mrope_positions(input_tokens, mm_features, num_dims)

    give_mrope_interface(model, get_mrope_input_positions)  # the patch core.patches.model_mrope_interface
    return True


@contextlib.contextmanager
def text_mrope_on_model_state(vllm_config: Any) -> Iterator[None]:
    """Around the V2 runner's ``load_model``: vLLM's ``init_model_state`` (which asserts the model implements
    ``SupportsMRoPE`` when the config declares M-RoPE) sees the model after :func:`provide_text_mrope_positions`.
    The runner module's ``init_model_state`` is replaced for the block only, and only when the config declares
    M-RoPE (otherwise nothing changes). Imports vLLM."""
    if not getattr(getattr(vllm_config, "model_config", None), "uses_mrope", False):
        yield
        return

    def wrap(original: Any) -> Any:
        def init_model_state(config: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
            provide_text_mrope_positions(model, config.model_config)
            return original(config, model, *args, **kwargs)

        return init_model_state

    with replaced_init_model_state(wrap):  # the patch core.patches.v2_init_model_state
        yield


__all__ = ["MRoPEFeaturesUnsupportedError", "needs_text_mrope_positions", "provide_text_mrope_positions",
           "text_mrope_on_model_state", "text_mrope_positions"]
