"""V1 talker MTP in graph mode uses the same persistent-buffer head as V2
(core.model_state.StaticTalkerMTP): fixed input addresses per capture size,
each call under the FULL forward context for its padded size."""

from __future__ import annotations

import contextlib
import types

import torch

from core.runner import OmniV1RunnerMixin


def _head(hidden, code0):
    return torch.stack([(hidden.sum(-1) * 10).long() % 7 + code0, code0 * 2], dim=-1)


def _fake_runner(mode):
    entered = []

    class Backend:
        def forward_context(self, attn_metadata, vllm_config, **kw):
            entered.append(kw["num_tokens"])
            return contextlib.nullcontext()

    hooks = types.SimpleNamespace(mtp_mode=mode, backend=Backend())
    runner = types.SimpleNamespace(
        omni_hooks=hooks, max_num_reqs=12, dtype=torch.float32, device=torch.device("cpu"), vllm_config=object(),
        model_config=types.SimpleNamespace(get_hidden_size=lambda: 8),
    )
    return runner, entered


def test_graph_mode_runs_on_persistent_buffers_padded_to_capture_sizes():
    runner, entered = _fake_runner("graph")
    mtp = OmniV1RunnerMixin._omni_static_mtp(runner, _head)
    assert runner._omni_talker_mtp is mtp and mtp.sizes[-1] == 12
    addr = mtp.hidden.data_ptr()
    g = torch.Generator().manual_seed(0)
    for n in (1, 3, 5, 12, 2):
        h, c = torch.randn(n, 8, generator=g), torch.randint(0, 5, (n,), generator=g)
        out = mtp(h, c)
        assert torch.equal(out, _head(h, c))  # padding rows never leak into the result
        assert mtp.hidden.data_ptr() == addr  # same input address every call
    assert entered == [1, 4, 8, 12, 2]  # each call under the FULL context of its padded capture size


def test_eager_mode_leaves_the_head_alone():
    runner, entered = _fake_runner("eager")
    assert OmniV1RunnerMixin._omni_static_mtp(runner, _head) is _head
    assert entered == []
