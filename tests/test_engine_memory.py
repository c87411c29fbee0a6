"""Every engine this project starts is sized for its model (``omni_backends.engine_memory``), the conformance
kit's engine check included: at vLLM's default ``gpu_memory_utilization`` (0.9 of the card) the kit's engine
left the H200 with 1.9 GiB free, and engines starting beside it failed in ``cublasCreate`` (issue 21)."""

from __future__ import annotations

import pytest

from core.models.create import create_demo_models
from omni_backends.testing import engine_check


class _Stop(Exception):
    pass


def test_the_kit_engine_check_sizes_its_engine_for_the_model(tmp_path, monkeypatch):
    create_demo_models(str(tmp_path / "demo"))
    seen = {}

    def fake_llm(model, **kw):
        seen.update(kw)
        raise _Stop

    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(vllm, "LLM", fake_llm)
    for side in ("stock", "omni"):
        seen.clear()
        with pytest.raises(_Stop):
            engine_check.run("cpu", str(tmp_path / "demo" / "thinker"), side, engine_check.OMNI_WORKER_CLS,
                             engine_check.OMNI_SCHEDULER_CLS)
        assert seen["kv_cache_memory_bytes"] >= 64 << 20, seen
        assert 0 < seen["gpu_memory_utilization"] < 0.5, seen


class _Device:
    name = "fake"

    def memory_info(self):
        return 100 << 30, 100 << 30  # free, total


def _write(tmp_path, cfg):
    import json

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_a_composite_config_is_sized_by_its_largest_nested_decoder(tmp_path):
    """vLLM-Omni's composite models (Qwen3-TTS: ``talker_config``; Qwen2.5-Omni: ``thinker_config.text_config``)
    have no top-level ``hidden_size``: the KV size comes from their decoders (this raised KeyError before)."""
    from omni_backends.engine_memory import engine_memory_kw

    talker = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "code_predictor_config": {"hidden_size": 16}}
    nested = _write(tmp_path, {"model_type": "qwen3_tts", "talker_config": talker,
                               "speaker_encoder_config": {"hidden_size": 8, "num_hidden_layers": 1}})
    kw = engine_memory_kw(_Device(), nested, max_model_len=4096, max_num_seqs=16)
    per_token = 2 * 3 * 2 * 32 * 4  # the talker's, the largest decoder
    assert kw["kv_cache_memory_bytes"] == max(64 << 20, 2 * per_token * 4096 * 16)
    flat = tmp_path / "flat"
    flat.mkdir()
    assert engine_memory_kw(_Device(), _write(flat, talker), max_model_len=4096, max_num_seqs=16) == kw


def test_a_config_without_any_decoder_is_one_clear_error(tmp_path):
    from omni_backends.engine_memory import engine_memory_kw
    from omni_backends.errors import BadInputError

    with pytest.raises(BadInputError, match="describes no decoder.*cannot size its KV cache"):
        engine_memory_kw(_Device(), _write(tmp_path, {"model_type": "x", "vision_config": {"patch": 14}}),
                         max_model_len=256, max_num_seqs=4)
