"""M-RoPE positions on synthetic inputs, checked against vLLM's own Qwen2-VL implementation."""

from __future__ import annotations

import types

import pytest
import torch

from core.mrope import MRoPESpan, OmniMRoPEMixin, mrope_decode_positions, mrope_positions


def test_text_only_is_arange_on_all_channels():
    pos, delta = mrope_positions(5, [])
    assert pos.tolist() == [[0, 1, 2, 3, 4]] * 3 and delta == 0


def test_image_grid_then_text():
    # 2 text tokens, a 1x2x3 image grid (6 tokens), 2 text tokens
    pos, delta = mrope_positions(10, [MRoPESpan(offset=2, grid_t=1, grid_h=2, grid_w=3)])
    assert pos[:, :2].tolist() == [[0, 1]] * 3
    assert pos[0, 2:8].tolist() == [2] * 6
    assert pos[1, 2:8].tolist() == [2, 2, 2, 3, 3, 3]
    assert pos[2, 2:8].tolist() == [2, 3, 4, 2, 3, 4]
    assert pos[:, 8:].tolist() == [[5, 6]] * 3  # continues from max + 1
    assert delta == 7 - 10


def test_decode_positions_continue_with_delta():
    _, delta = mrope_positions(10, [MRoPESpan(2, 1, 2, 3)])
    assert mrope_decode_positions(delta, 10, 2).tolist() == [[7, 8]] * 3


def test_bad_spans_are_refused():
    with pytest.raises(ValueError, match="sorted and non-overlapping"):
        mrope_positions(20, [MRoPESpan(4, 2, 2, 2), MRoPESpan(5, 1)])
    with pytest.raises(ValueError, match="runs past the prompt"):
        mrope_positions(6, [MRoPESpan(4, 1, 2, 2)])


@pytest.mark.parametrize("spans", [
    [],
    [(3, 2, 2, 2, 1.0)],
    [(1, 1, 2, 2, 1.0), (6, 3, 1, 1, 1.0), (12, 2, 2, 1, 2.0)],
])
def test_matches_vllm_qwen2_vl(spans):
    # vLLM's qwen2_vl module imports torchvision, which the cpu stack leaves out (see README); then this skips.
    qwen2_vl = pytest.importorskip("vllm.model_executor.models.qwen2_vl")
    n = 20
    stub = types.SimpleNamespace(iter_mm_grid_thw=lambda feats: iter(spans))
    expect, expect_delta = qwen2_vl.Qwen2VLForConditionalGeneration.get_mrope_input_positions(stub, list(range(n)), [])
    got, delta = mrope_positions(n, [MRoPESpan(*s) for s in spans])
    assert torch.equal(got, expect.to(torch.int64)) and delta == expect_delta


def test_mixin_implements_vllm_protocol():
    interfaces = pytest.importorskip("vllm.model_executor.models.interfaces")

    class Model(OmniMRoPEMixin):
        def omni_mrope_span(self, feature):
            return None if feature["modality"] == "text" else MRoPESpan(feature["offset"], feature["t"], 1, 1)

    m = Model()
    assert interfaces.supports_mrope(m)
    pos, delta = m.get_mrope_input_positions(list(range(8)), [{"modality": "audio", "offset": 2, "t": 3}])
    assert pos[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # audio: time advances, h/w stay
    assert pos[1].tolist() == pos[2].tolist() == [0, 1, 2, 2, 2, 5, 6, 7]
    assert delta == 0
