"""core.mrope: M-RoPE positions for a model whose config declares M-RoPE but whose class lacks vLLM's
``SupportsMRoPE`` (the released Qwen3-TTS talker). The engine path is tests/core/test_qwen3_tts.py (its talker
runs with the released ``rope_scaling``; before core.mrope vLLM's runner asserted "M-RoPE support is not
implemented")."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")


def test_text_positions_are_the_same_on_every_channel() -> None:
    from core.mrope import text_mrope_positions

    pos, delta = text_mrope_positions([1] * 5, [], 3)
    assert pos.dtype == torch.int64 and pos.shape == (3, 5) and delta == 0
    assert all(torch.equal(row, torch.arange(5)) for row in pos)


def test_multimodal_features_are_one_clear_error() -> None:
    from core.mrope import MRoPEFeaturesUnsupportedError, text_mrope_positions

    with pytest.raises(MRoPEFeaturesUnsupportedError, match="text-only"):
        text_mrope_positions([1, 2], [object()], 3)


def test_a_model_without_supports_mrope_gets_vllms_interface() -> None:
    from vllm.model_executor.models.interfaces import supports_mrope

    from core.mrope import provide_text_mrope_positions

    model = torch.nn.Linear(2, 2)
    assert not supports_mrope(model)
    config = types.SimpleNamespace(uses_mrope=True, mrope_num_dims=3)
    assert provide_text_mrope_positions(model, config) is True
    assert supports_mrope(model)  # vLLM's own check (V1 asserts it, V2's get_rope_state too)
    pos, delta = model.get_mrope_input_positions([7, 7, 7, 7], [])
    assert pos.shape == (3, 4) and delta == 0
    assert provide_text_mrope_positions(model, config) is False  # it has one now: left alone


def test_no_mrope_config_changes_nothing() -> None:
    from core.mrope import provide_text_mrope_positions, text_mrope_on_model_state

    model = torch.nn.Linear(2, 2)
    assert provide_text_mrope_positions(model, types.SimpleNamespace(uses_mrope=False)) is False
    assert not hasattr(model, "get_mrope_input_positions")
    import vllm.v1.worker.gpu.model_runner as v2

    before = v2.init_model_state
    with text_mrope_on_model_state(types.SimpleNamespace(model_config=types.SimpleNamespace(uses_mrope=False))):
        assert v2.init_model_state is before


def test_v2_model_state_sees_the_model_with_positions_during_load_only() -> None:
    import vllm.v1.worker.gpu.model_runner as v2

    from core.mrope import text_mrope_on_model_state

    original = v2.init_model_state
    seen = {}
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(uses_mrope=True, mrope_num_dims=3))
    model = torch.nn.Linear(2, 2)
    def fake(cfg, m, *a, **k):
        seen["model"] = m
        seen["supports"] = getattr(m, "supports_mrope", False)

    v2.init_model_state = fake
    try:
        with text_mrope_on_model_state(config):
            assert v2.init_model_state is not fake
            v2.init_model_state(config, model, None, "cpu")
        assert v2.init_model_state is fake and seen["model"] is model and seen["supports"] is True
    finally:
        v2.init_model_state = original
