"""Patch: vLLM-Omni's per-stage model-config fields, set on the engine's ``vllm_config.model_config`` in the worker.

- What: :func:`apply_model_config_fields` sets each field of :data:`FIELDS` that the engine was started with
  (``additional_config[ADDITIONAL_CONFIG_KEY]``, made by :func:`additional_config`) as an attribute of
  ``vllm_config.model_config``, from the omni worker's ``init_device``, before vLLM builds and loads the model.
- Why: vLLM-Omni's models read per-stage settings from fields its own ``OmniModelConfig`` (a ``ModelConfig``
  subclass) adds: Qwen3-TTS code2wav reads ``async_chunk`` in ``__init__`` and ``stage_connector_config``
  (the deploy's connector ``extra``: ``decode_batch_max_size``, ``codec_chunk_frames``, ...) in
  ``load_weights``, where it also enables its decoder's CUDA graph. vLLM's ``ModelConfig`` has neither field
  and no way to add one; ``additional_config`` (an ``EngineArgs`` field vLLM carries to every worker
  unchanged) carries them there. The vLLM-Omni side of the seam (the fields and what the model reads) is
  declared in ``core.seams`` (:data:`core.seams.VLLM_OMNI_SYMBOLS`).
- Versions: vLLM 0.26 through 0.33 (``EngineArgs.additional_config`` -> ``VllmConfig.additional_config``;
  ``ModelConfig`` a dataclass without ``__slots__``).
- Until: vLLM-Omni's model reads these from a place vLLM carries (or vLLM lets a model declare config fields).
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol

#: the engine argument that carries the fields to the worker, and vLLM's config that holds it there
ENGINE_ADDITIONAL_CONFIG = VendorSymbol("vllm.engine.arg_utils", "EngineArgs.additional_config", kind="attribute")
VLLM_ADDITIONAL_CONFIG = VendorSymbol("vllm.config.vllm", "VllmConfig.additional_config", kind="attribute")
#: the object the fields are set on: a dataclass without ``__slots__`` (new attributes can be set)
MODEL_CONFIG_LAYOUT = VendorSymbol("vllm.config.model", "ModelConfig", kind="class", required=None,
                                   absent=("__slots__",))

PATCH = Patch.declare(__name__, __doc__, (ENGINE_ADDITIONAL_CONFIG, VLLM_ADDITIONAL_CONFIG, MODEL_CONFIG_LAYOUT))

#: the key of ``additional_config`` that holds the fields
ADDITIONAL_CONFIG_KEY = "omni_model_config"
#: the ``OmniModelConfig`` fields the core sets (vLLM-Omni's names)
FIELDS = ("async_chunk", "stage_connector_config")


def additional_config(**fields: Any) -> dict[str, Any]:
    """The engine argument ``additional_config`` carrying ``fields`` (names of :data:`FIELDS`, JSON-able values:
    vLLM hashes ``additional_config`` into its compile-cache key). Raises ``ValueError`` naming an unknown
    field."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"model-config fields {unknown} are not among {FIELDS}")
    return {ADDITIONAL_CONFIG_KEY: dict(fields)}


def model_config_fields(vllm_config: Any) -> dict[str, Any]:
    """The fields the engine was started with (``{}`` when none)."""
    extra = getattr(vllm_config, "additional_config", None)
    return dict(extra.get(ADDITIONAL_CONFIG_KEY) or {}) if isinstance(extra, dict) else {}


def apply_model_config_fields(vllm_config: Any) -> dict[str, Any]:
    """Set the fields of :func:`model_config_fields` on ``vllm_config.model_config``; returns them. Raises
    ``ValueError`` naming a field outside :data:`FIELDS`."""
    fields = model_config_fields(vllm_config)
    additional_config(**fields)  # the same check as the engine side
    target = vllm_config.model_config
    for name, value in fields.items():
        setattr(target, name, value)
    return fields
