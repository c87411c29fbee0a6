"""The talker MTP in vLLM-Omni's form on the V1 runner (the same
``core.hooks.TalkerMTP`` V2 uses): persistent buffers of width
``mtp_hidden_size``, fixed input addresses per capture size, each call under the
FULL forward context for its padded size; a call carrying generators runs the
unwrapped head on exactly its rows."""

from __future__ import annotations

import contextlib
import types

import torch

from core.runner import OmniV1RunnerMixin

H = 8


def _head(ids, embeds, last_hidden, text_step, **sampling):
    """(embeds [p, H], codes [p, 3]): pure functions of each row, so padding rows can be checked not to leak."""
    codes = torch.stack([ids, (last_hidden.sum(-1) * 10).long() % 7, (text_step.sum(-1) * 10).long() % 5], dim=-1)
    return embeds + last_hidden + text_step, codes


def _fake_runner(mode):
    entered = []

    class Backend:
        def forward_context(self, attn_metadata, vllm_config, **kw):
            entered.append(kw["num_tokens"])
            return contextlib.nullcontext()

        def captured_graphs(self, wrapped):
            return None  # the wrapper does not tell: the stats count the sizes captured

    backend = Backend()
    hooks = types.SimpleNamespace(mtp_mode=mode, backend=backend)
    runner = types.SimpleNamespace(omni_hooks=hooks, omni_backend=backend, max_num_reqs=12, dtype=torch.float32,
                                   device=torch.device("cpu"), vllm_config=object())
    return runner, entered


def _rows(n, g):
    return (torch.randint(0, 30, (n,), generator=g), torch.randn(n, H, generator=g), torch.randn(n, H, generator=g),
            torch.randn(n, H, generator=g))


def test_graph_mode_runs_on_persistent_buffers_padded_to_capture_sizes():
    runner, entered = _fake_runner("graph")
    eager_calls = []
    mtp = OmniV1RunnerMixin._omni_mtp_runner(runner, _head, lambda *a, **k: eager_calls.append(a) or _head(*a, **k),
                                             H)
    assert runner._omni_talker_mtp is mtp and mtp.sizes[-1] == 12
    assert mtp.last_talker_hidden.shape == (12, H)  # sized by mtp_hidden_size
    addr = (mtp.input_ids.data_ptr(), mtp.input_embeds.data_ptr(), mtp.last_talker_hidden.data_ptr())
    g = torch.Generator().manual_seed(0)
    for n in (1, 3, 5, 12, 2):
        rows = _rows(n, g)
        embeds, codes = mtp(*rows)
        want_e, want_c = _head(*rows)
        assert torch.equal(codes, want_c) and torch.equal(embeds, want_e)  # padding rows never leak in
        assert (mtp.input_ids.data_ptr(), mtp.input_embeds.data_ptr(), mtp.last_talker_hidden.data_ptr()) == addr
    assert entered == [1, 4, 8, 12, 2]  # each call under the FULL context of its padded capture size
    assert eager_calls == []
    rows = _rows(3, g)
    embeds, codes = mtp(*rows, generators=[torch.Generator(), None, None])
    assert len(eager_calls) == 1 and eager_calls[0][0].shape[0] == 3  # unwrapped head, unpadded
    assert entered == [1, 4, 8, 12, 2] and torch.equal(codes, _head(*rows)[1])


def test_eager_mode_runs_the_head_unpadded_without_a_graph_context():
    runner, entered = _fake_runner("eager")
    mtp = OmniV1RunnerMixin._omni_mtp_runner(runner, _head, _head, H)
    assert mtp.sizes is None
    rows = _rows(5, torch.Generator().manual_seed(1))
    embeds, codes = mtp(*rows)
    assert torch.equal(codes, _head(*rows)[1]) and embeds.shape == (5, H)
    assert entered == []


def test_capture_warms_each_size_on_the_unwrapped_head_before_the_graph_wrapper_sees_it():
    """A head that sets itself up lazily (vLLM-Omni's code predictor compiles on its first call, copying from
    unpinned CPU tensors, which CUDA graph capture refuses) must have run outside capture first: each capture
    size runs the unwrapped head, then the wrapped one."""
    runner, _ = _fake_runner("graph")
    calls = []
    ready = []

    def eager(*a, **k):
        ready.append(True)  # the lazy set-up, done outside capture
        calls.append(("eager", a[0].shape[0]))
        return _head(*a, **k)

    def wrapped(*a, **k):
        assert ready, "the wrapped head captured before the head had ever run eager"
        calls.append(("graph", a[0].shape[0]))
        return _head(*a, **k)

    mtp = OmniV1RunnerMixin._omni_mtp_runner(runner, wrapped, eager, H)
    assert mtp.capture() == len(mtp.sizes)
    assert calls == [(kind, p) for p in reversed(mtp.sizes) for kind in ("eager", "graph")]
