"""A step's outputs to its rows in one worker-side call (``core.hooks.step_rows.StepRowsCollector``).

Units: what :meth:`StepRowsCollector.collect` makes of one step (token-aligned tensors placed once for the whole
step, nested names, per-request lists, padded rows, rows emitted before). The V2 model state (fakes,
``tests/core/v2_fakes.py``) and a V1 engine (the demo thinker): a model with no output hook of its own reaches
its step's rows through one collector call per step -- no ``process_model_output``, no ``OmniOutput`` built by
the adapter, no batch view built after the forward, and (V2) no persistent copy of the hidden states.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from core.hooks.step_rows import StepRowsCollector  # noqa: E402
from core.outputs import rows_per_request  # noqa: E402


def test_collect_places_each_name_once_for_the_whole_step(cpu_backend):
    rows = StepRowsCollector(cpu_backend)
    per_token = torch.arange(14, dtype=torch.float32)[:, None].repeat(1, 2)  # 10 rows used, 4 padded
    codes = torch.arange(14 * 3).reshape(14, 3)
    waves = [torch.ones(2), None, torch.zeros(3)]
    rows.collect({"hidden": per_token, "codes": {"audio": codes}, "wave": waves},
                 ["a", "b", "c"], np.array([0, 4, 5, 10]), [0, 7, 2])
    (block, items) = rows.take().rows()
    assert (block.req_ids, block.starts, block.ends) == (["a", "b", "c"], [0, 4, 5], [4, 5, 10])
    assert set(block.tensors) == {"hidden", "codes.audio"}  # nested: vLLM-Omni's category.qualifier
    assert torch.equal(block.tensors["hidden"], per_token[:10]) and torch.equal(block.tensors["codes.audio"], codes[:10])
    assert block.tensors["hidden"].untyped_storage().data_ptr() != per_token.untyped_storage().data_ptr()  # a copy
    assert items.item_req_ids == ["a", "c"] and items.item_names == ["wave", "wave"]
    assert rows.emitted == {"a": 4, "b": 8, "c": 7}
    # recomputed after preemption: "a" again from position 0, 6 rows; the 4 it emitted are skipped
    rows.collect({"hidden": per_token}, ["a"], [0, 6], np.array([0]))
    got = rows_per_request(rows.take().rows())
    assert torch.equal(got["a"]["hidden"], per_token[4:6]) and rows.emitted["a"] == 6
    rows.drop(["a", "b"])
    assert rows.emitted == {"c": 7}


class _Plain(torch.nn.Module):
    """An omni model with no output hook: its forward returns an ``OmniOutput`` with per-token hidden states
    (as the demo thinker does); no postprocess, ``make_omni_output`` nor ``set_batch_req_ids``."""

    have_multimodal_outputs = True

    def __init__(self, hidden: int):
        super().__init__()
        self.embed = torch.nn.Embedding(64, hidden)

    def embed_input_ids(self, input_ids):
        return self.embed(input_ids.long())

    def compute_logits(self, hidden):
        return hidden @ self.embed.weight.T

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        from core.outputs import OmniOutput

        h = self.embed_input_ids(input_ids) * 2.0
        return OmniOutput(h, {"hidden": h})


def _count(monkeypatch, cls, name, calls):
    inner = getattr(cls, name)

    def counted(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return inner(*args, **kwargs)

    monkeypatch.setattr(cls, name, counted)


def test_v2_a_model_without_output_hooks_reaches_its_rows_in_one_collector_call(vllm_config, monkeypatch):
    from core.hooks import OmniHooks
    from core.model_io import ModelOutputAdapter
    from tests.core.v2_fakes import H, IDS, add_all, greedy_inner, input_batch, make_state, omni_sampler

    model = _Plain(H)
    state = make_state(vllm_config, model)
    assert state.omni_hooks.outputs_only and not state.omni_io.keep_hidden  # no persistent hidden copy per step
    rs = add_all(state, {r: {} for r in IDS})
    calls: dict = {}
    for cls, name in ((StepRowsCollector, "collect"), (OmniHooks, "process_model_output"),
                      (ModelOutputAdapter, "take")):
        _count(monkeypatch, cls, name, calls)
    b = input_batch()
    kw = state.prepare_inputs(b, rs)
    out = model(**{"input_ids": b.input_ids, "positions": None, **kw})
    sampler, _ = omni_sampler(state, greedy_inner())
    sampler(model.compute_logits(out[b.logits_indices]), b)
    assert calls == {"collect": 1}
    step = state.omni_hooks.take_step_outputs()
    qsl = b.query_start_loc_np.tolist()
    for i, r in enumerate(IDS):
        torch.testing.assert_close(step[r]["hidden"], out[qsl[i] : qsl[i + 1]].detach())


@pytest.mark.engine_tier
def test_v1_the_thinkers_step_reaches_its_rows_in_one_collector_call(demo_dir, test_device, monkeypatch):
    """The demo thinker (hidden states per token, no output hook) on vLLM's V1 runner: one collector call per
    step with tokens, and none of the general path's calls."""
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    import vllm.envs as envs

    if envs.VLLM_USE_V2_MODEL_RUNNER:
        pytest.skip("V1 runner test: VLLM_USE_V2_MODEL_RUNNER=1 (the V2 state's test is the one above)")
    from vllm import SamplingParams

    from core.hooks import OmniHooks
    from core.model_io import ModelOutputAdapter
    from core.pipeline.release import release_engine
    from core.runner.v1 import OmniV1RunnerMixin
    from core.stage import make_engine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    calls: dict = {}
    for cls, name in ((StepRowsCollector, "collect"), (OmniHooks, "process_model_output"),
                      (ModelOutputAdapter, "take"), (OmniV1RunnerMixin, "_lean_batch_view")):
        _count(monkeypatch, cls, name, calls)
    llm = make_engine(os.path.join(demo_dir, "thinker"), device=test_device, dtype="float32", enforce_eager=True,
                      max_model_len=64, max_num_seqs=2, seed=0)
    try:
        calls.clear()  # engine start: vLLM's dummy runs collect nothing
        params = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}], params, use_tqdm=False)
    finally:
        release_engine(llm, "thinker")
    assert [o.multimodal_outputs["hidden"].shape[0] for o in outs] == [3 + 4, 2 + 4]
    assert calls == {"collect": 5}  # the prefill step and 4 decode steps
