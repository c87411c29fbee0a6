"""The omni V2 ``ModelState`` (core.runner.model_state) on CPU tensors: the model-output adapter, the sampler hook, postprocess
and the multimodal outputs of one step; a simulated FULL-graph replay (the persistent buffers written as a
replayed graph writes them; no graph runs on CPU); the graph-mode opt-out of models with per-request kwargs.
Fakes: ``tests/core/v2_fakes.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.core.v2_fakes import (  # noqa: E402
    H, IDS, MAX_REQS, MAX_TOKENS, NUM_TOKENS, TinyTalker, add_all, greedy_inner, input_batch, make_state, needs_vllm,
    omni_sampler, payloads,
)


# --------------------------------------- model-output adapter, sampler, postprocess, MTP
@needs_vllm
def test_one_step_postprocess_and_multimodal_outputs_through_the_sampler(vllm_config):
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    model = TinyTalker()
    state = make_state(vllm_config, model)
    assert state.omni_hooks.mtp_mode == "eager" and state.talker_mtp is not None  # cpu driver: no graphs
    assert state.talker_mtp.last_talker_hidden.shape == (MAX_REQS, H)  # sized by mtp_hidden_size
    rs = add_all(state, payloads())
    b = input_batch()
    kw = state.prepare_inputs(b, rs)
    out = model(**{"input_ids": b.input_ids, "positions": None, **kw})
    assert isinstance(out, torch.Tensor) and out.shape == (NUM_TOKENS, H)  # vLLM's V2 runner asserts a tensor
    raw = type(model).forward(model, **{"input_ids": None, "positions": None, **kw})  # the model's own forward
    assert not model._forward_hooks and not model._forward_pre_hooks  # the adapter wraps forward: no module hook
    torch.testing.assert_close(out, raw.text_hidden_states)
    sampler, rejection = omni_sampler(state, greedy_inner())
    assert rejection is None and sampler.compute_nans is False  # other attributes are vLLM's sampler's
    logits = model.compute_logits(out[b.logits_indices])
    so = sampler(logits, b)
    assert isinstance(so, SamplerOutput)
    step = state.omni_hooks.rows.step
    for i, r in enumerate(IDS):
        s, e = (0, 1, 9, 13)[i], (0, 1, 9, 13)[i + 1]
        torch.testing.assert_close(step[r]["hidden"], raw.text_hidden_states[s:e].detach())
        # postprocess merged the request's last hidden state into its state (the next decode's MTP input)
        torch.testing.assert_close(state.omni_hooks.payloads.get(r)["hidden_states"]["last"],
                                   raw.text_hidden_states[e - 1 : e].detach())
    assert state.omni_hooks.mtp_calls == {"dec": 1}  # ran before the forward, not after sampling


@needs_vllm
def test_full_graph_replay_reads_the_persistent_outputs(vllm_config):
    """Simulated FULL graph: a forward under capture copies its outputs into
    persistent buffers (in a graph, that copy is captured); a replayed step
    runs no Python forward, and the sampler hook reads those buffers
    (core.model_io.ModelOutputAdapter, at the model)."""
    model = TinyTalker()
    state = make_state(vllm_config, model)
    rs = add_all(state, payloads())
    kw = state.prepare_dummy_inputs(3, 16)  # vLLM's capture builds its inputs here
    model(**{"input_ids": None, "positions": None, **kw})
    hidden_buf, mm_buf = state.omni_io._hidden, state.omni_io._buffers["hidden"]
    assert hidden_buf.shape == (MAX_TOKENS, H) and mm_buf.shape == (MAX_TOKENS, H)
    b = input_batch(padded=16)
    kw = state.prepare_inputs(b, rs)
    replayed = type(model).forward(model, **{"input_ids": None, "positions": None, **kw})  # what the graph computes
    hidden_buf[:16].copy_(replayed.text_hidden_states.detach())  # ... into the captured buffers
    mm_buf[:16].copy_(replayed.multimodal_outputs["hidden"].detach())
    sampler, _ = omni_sampler(state, greedy_inner())
    sampler(model.compute_logits(hidden_buf[:16][b.logits_indices]), b)
    step = state.omni_hooks.rows.step
    torch.testing.assert_close(step["mid"]["hidden"], replayed.text_hidden_states[1:9].detach())
    torch.testing.assert_close(state.omni_hooks.payloads.get("mid")["hidden_states"]["last"],
                               replayed.text_hidden_states[8:9].detach())
    assert state.omni_hooks.mtp_calls == {"dec": 1}


@needs_vllm
def test_models_with_per_request_kwargs_opt_out_of_full_graphs(vllm_config):
    """The state's bind_model lowers vLLM's graph mode before vLLM resolves it (every vLLM of the window: 0.26
    has no ``get_additional_cg_support``), so a FULL graph never freezes per-request kwargs."""
    import copy

    from vllm.config import CUDAGraphMode

    cfg = copy.copy(vllm_config)
    cfg.compilation_config = copy.copy(vllm_config.compilation_config)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cfg.model_config = copy.copy(vllm_config.model_config)
    cfg.model_config.enforce_eager = False
    make_state(cfg, TinyTalker())
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE

    class NoKwargs(TinyTalker):  # a forward that takes none of the omni kwargs
        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    make_state(cfg, NoKwargs())
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE


