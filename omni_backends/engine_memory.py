"""One vLLM engine's device memory, sized for its model rather than for the card.

vLLM reserves ``gpu_memory_utilization`` (default 0.9) of the whole device per engine. Every engine this project
starts (the pipeline's stages, the engine tests, the conformance kit's engine check) is sized here instead, so
several share one GPU -- and none grabs 90 % of it (engines started next to one at vLLM's default fail in
vLLM's ``request_memory`` check or in ``cublasCreate``; ``docs/core-runner.md``).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from omni_backends.errors import BadInputError

#: device memory each stage may take besides its KV cache (weights of the tiny models, activations, graph pools,
#: cuBLAS / compile workspaces), in bytes; sizes ``gpu_memory_utilization`` (see :func:`engine_memory_kw`)
STAGE_HEADROOM_BYTES = 2 << 30
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def _decoder_configs(cfg: dict[str, Any]):
    """The decoder configs of a HF ``config.json``: the top level when it has ``hidden_size``, else every nested
    config that has (vLLM-Omni's composite models nest theirs: Qwen3-TTS ``talker_config``, Qwen2.5-Omni
    ``thinker_config.text_config``, ...)."""
    if "hidden_size" in cfg:
        yield cfg
        return
    for value in cfg.values():
        if isinstance(value, dict):
            yield from _decoder_configs(value)


def _kv_bytes_per_token(cfg: dict[str, Any], dtype: str) -> int:
    layers = int(cfg.get("num_hidden_layers", 1))
    heads = int(cfg.get("num_attention_heads", 1))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(str(dtype).removeprefix("torch."), 4)


def engine_memory_kw(backend: Any, model_dir: str, *, max_model_len: int, max_num_seqs: int,
                    dtype: str = "float32") -> dict[str, Any]:
    """vLLM arguments that size one engine's device memory for its model, not for the card.

    vLLM reserves ``gpu_memory_utilization`` (default 0.9) of the whole device
    per engine; three demo stages on one GPU would not fit. This returns
    ``kv_cache_memory_bytes`` = twice the KV cache of ``max_num_seqs`` full
    sequences (``2 * layers * kv_heads * head_dim * dtype bytes * max_model_len
    * max_num_seqs``, from the model's ``config.json``: its top level, or the
    largest of its nested decoder configs; at least 64 MiB) and
    ``gpu_memory_utilization`` = that plus :data:`STAGE_HEADROOM_BYTES` as a
    fraction of the device's total memory (``Backend.memory_info()``; vLLM's
    GPU worker checks that much is free when the engine starts). vLLM's CPU
    worker reads both as host memory; its legacy ``VLLM_CPU_KVCACHE_SPACE``,
    when set, overrides the KV size.

    Raises :class:`BadInputError` when the device has less free memory than a
    stage needs, or the config describes no decoder.
    """
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    decoders = list(_decoder_configs(cfg))
    if not decoders:
        raise BadInputError(f"{os.path.join(model_dir, 'config.json')} describes no decoder (no hidden_size, at the "
                            "top or in a nested config such as text_config / talker_config): cannot size its KV cache")
    per_token = max(_kv_bytes_per_token(c, dtype) for c in decoders)
    kv_bytes = max(64 << 20, 2 * per_token * max_model_len * max_num_seqs)
    kv_bytes = -(-kv_bytes // (1 << 20)) << 20  # whole MiB
    free, total = backend.memory_info()
    util = min(0.9, math.ceil((kv_bytes + STAGE_HEADROOM_BYTES) / total * 1e4) / 1e4)
    need = math.ceil(util * total)  # what vLLM's worker checks is free at start (vllm.v1.worker.utils.request_memory)
    if free < need:
        raise BadInputError(
            f"{os.path.basename(os.path.normpath(model_dir))} stage needs about {need / 2**30:.2f} GiB of "
            f"{backend.name} device memory but only {free / 2**30:.2f} GiB of {total / 2**30:.2f} GiB is free; "
            "free the device (other processes) or pick another device with --device"
        )
    return {"kv_cache_memory_bytes": int(kv_bytes), "gpu_memory_utilization": util}
