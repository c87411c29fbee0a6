"""Seeded talker-MTP rows stay on the graph (issue 44, item 1; ``core.hooks.talker_mtp``).

A head declaring vLLM-Omni's ``mtp_sample_uniforms`` (Qwen3-TTS's code predictor) takes its Gumbel noise as
``sample_uniforms=``; the core draws it per row outside the head, each seeded row from its own generator
(``tts_local_seed``). Shown here through :class:`core.hooks.OmniHooks` (``on_new_requests`` -> seeds,
``run_talker_mtp``) on a :class:`core.hooks.TalkerMTP` whose head is the simulated FULL-graph wrapper of
``tests/core/test_model_state_mtp_graphs.py`` (it records captures and replays, keyed on vLLM's forward
context, and checks that a replay sees the capture's input addresses, the noise buffer included):

- seeded and unseeded calls alike replay the captured graphs; the unwrapped head never runs after capture;
- the same seed gives the same codes alone and in a batch of 16 mixed requests (unseeded, other seeds, the same
  seed twice, the rows in another order every step), and the same codes eager as under the graph.
"""

from __future__ import annotations

import functools
import random
import types
import zlib

import pytest

torch = pytest.importorskip("torch")

from tests.core.v2_fakes import H, needs_vllm  # noqa: E402

VOCAB, STEPS, MAX = 32, 3, 16


class SeededHead:
    """vLLM-Omni's Qwen3-TTS ``talker_mtp`` contract in small: ``mtp_sample_uniforms`` declared, residual codes
    sampled by Gumbel-max ``argmax(logits - log(-log(u)))`` over ``sample_uniforms`` ``[n, STEPS, VOCAB]`` when
    given, else over uniforms it draws itself from ``generators`` (as the real head does). The logits of a row are
    computed from that row alone (an elementwise product summed per row), so they do not depend on the batch."""

    has_preprocess = False
    talker_mtp_graph_safe = True
    mtp_hidden_size = H
    mtp_sample_uniforms = True
    mtp_sample_steps = STEPS
    mtp_sample_vocab_size = VOCAB

    def __init__(self):
        g = torch.Generator().manual_seed(11)
        self.w = torch.randn(STEPS, VOCAB, H, generator=g, dtype=torch.float64)
        self.code_embed = torch.randn(VOCAB, H, generator=g, dtype=torch.float64)
        self.calls = []

    def talker_mtp(self, input_ids, input_embeds, last_talker_hidden, text_step, *, do_sample=None,
                   temperature=None, top_k=None, top_p=None, generator=None, generators=None, sample_uniforms=None):
        n = int(input_ids.shape[0])
        self.calls.append((n, sample_uniforms is not None, generators is not None or generator is not None))
        if sample_uniforms is None:
            u = torch.empty(n, STEPS, VOCAB)
            gens = generators if generators is not None else [generator] * n
            for i, g in enumerate(gens):
                u[i : i + 1].uniform_(1e-20, 1 - 1e-20, generator=g)
        else:
            assert tuple(sample_uniforms.shape) == (n, STEPS, VOCAB)
            u = sample_uniforms
        x = last_talker_hidden.to(torch.float64)
        codes = [input_ids.reshape(-1).long()]
        for s in range(STEPS):
            logits = (x[:, None, :] * self.w[s][None]).sum(-1)
            code = (logits - torch.log(-torch.log(u[:, s].to(torch.float64)))).argmax(-1)
            codes.append(code)
            x = x + self.code_embed[code]
        return input_embeds + 1.0, torch.stack(codes, -1)


class _Recorder:
    """The simulated FULL-graph wrapper of ``test_model_state_mtp_graphs`` with the noise buffer's address in
    the key it checks on a replay."""

    def __init__(self, runnable):
        self.runnable, self.entries, self.events = runnable, {}, []

    def __call__(self, ids, embeds, last, text, **sampling):
        from vllm.forward_context import get_forward_context

        key = get_forward_context().batch_descriptor
        noise = sampling.get("sample_uniforms")
        addrs = tuple(t.data_ptr() for t in (ids, embeds, last, text)) + (
            None if noise is None else noise.data_ptr(),)
        if key not in self.entries:
            self.entries[key] = addrs
            self.events.append(("capture", key.num_tokens))
        else:
            assert self.entries[key] == addrs, "replay with other input addresses than the capture"
            self.events.append(("replay", key.num_tokens))
        return self.runnable(ids, embeds, last, text, **sampling)


def _hooks(backend, vllm_config, head, *, graph):
    """OmniHooks bound to ``head`` with a TalkerMTP for 16 rows: graph mode (capture sizes, the recorder, vLLM's
    FULL forward context per size, captured) or eager; returns (hooks, recorder or None, eager calls)."""
    from core.hooks import OmniHooks, TalkerMTP
    from core.hooks.graphs import mtp_graph_context
    from omni_backends.policy import capture_sizes

    rec = _Recorder(head.talker_mtp) if graph else None

    def runner(wrapped, eager, hidden):
        if not graph:
            return TalkerMTP(eager, MAX, hidden, torch.float32, torch.device("cpu"))
        return TalkerMTP(rec, MAX, hidden, torch.float32, torch.device("cpu"), eager=eager,
                         sizes=capture_sizes(MAX), context=functools.partial(mtp_graph_context, backend, vllm_config))

    hooks = OmniHooks(backend)
    hooks.bind_model(head, vllm_config=None, mtp_runner=runner)
    if graph:
        assert hooks.talker_mtp.capture() == len(hooks.talker_mtp.sizes)
    return hooks, rec


def _row_inputs(req: str, step: int):
    """A request's MTP inputs at a decode step: a function of (its text, step) only -- the text being the id's
    part before ``#`` (two requests ``s#1``, ``s#2`` say the same thing)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{req.split('#')[0]}:{step}".encode()))
    return torch.randint(0, VOCAB, (1,), generator=g), torch.randn(1, H, generator=g), torch.randn(1, H, generator=g)


def _run(hooks, reqs: dict[str, int | None], steps: int, shuffle: int | None = None) -> dict[str, list]:
    """Register ``reqs`` (req_id -> tts_local_seed or None), run ``steps`` MTP calls over all of them (rows in
    a new order every step when ``shuffle`` seeds one); returns each request's codes per step."""
    from core.hooks import MTP_SEED_KEY
    from core.hooks.omni_hooks import MtpRow

    hooks.on_new_requests([(r, types.SimpleNamespace(extra_args={} if s is None else {MTP_SEED_KEY: s},
                                                     max_tokens=8)) for r, s in reqs.items()])
    order = list(reqs)
    out: dict[str, list] = {r: [] for r in reqs}
    for step in range(steps):
        if shuffle is not None:
            random.Random(shuffle + step).shuffle(order)
        rows = []
        for j, r in enumerate(order):
            ids, last, text = _row_inputs(r, step)
            rows.append(MtpRow(r, j, ids, torch.zeros(1, H), last, text))
        hooks.run_talker_mtp(rows, torch.zeros(len(order), H))
        for r in order:
            out[r].append(hooks.payloads.get(r)["codes"]["audio"].reshape(-1).tolist())
    return out


@needs_vllm
def test_seeded_rows_replay_the_graph_and_a_seed_gives_its_codes_whatever_the_batch(vllm_config, cpu_selected):
    head = SeededHead()
    steps = 5
    alone, rec1 = _hooks(cpu_selected, vllm_config, head, graph=True)
    solo = _run(alone, {"s": 1234}, steps)["s"]

    mixed: dict[str, int | None] = {f"u{i}": None for i in range(5)}
    mixed.update({f"o{i}": 100 + i for i in range(9)})
    mixed.update({"s": 1234, "s#twin": 1234})
    assert len(mixed) == 16
    batch, rec16 = _hooks(cpu_selected, vllm_config, head, graph=True)
    head.calls.clear()
    got = _run(batch, mixed, steps, shuffle=3)

    # the same graph-capable path for seeded and unseeded rows: every call after capture replays a graph
    for rec, hooks, n in ((rec1, alone, 1), (rec16, batch, 16)):
        sizes = hooks.talker_mtp.sizes
        assert rec.events[: len(sizes)] == [("capture", p) for p in reversed(sizes)]
        assert rec.events[len(sizes):] == [("replay", n)] * steps
        stats = hooks.talker_mtp.graph_stats()
        assert stats["replays"] == steps and stats["seeded"] == steps and stats["eager_seeded"] == 0
    assert head.calls == [(16, True, False)] * steps  # the noise given, no generator reaches the head
    # the same seed, the same codes: alone, in the batch, and its twin in the batch
    assert got["s"] == solo and got["s#twin"] == solo
    other, _ = _hooks(cpu_selected, vllm_config, head, graph=True)
    assert _run(other, {"s": 99}, steps)["s"] != solo  # another seed draws other noise
    # eager (no graphs) draws the same noise: the same codes
    eager, _ = _hooks(cpu_selected, vllm_config, head, graph=False)
    assert _run(eager, {"x": 7, "s": 1234}, steps, shuffle=9)["s"] == solo


def test_a_head_without_sample_uniforms_keeps_the_eager_rule_for_generators():
    """vLLM-Omni's V1 rule where the head draws its own noise (no ``mtp_sample_uniforms``): a call with
    generators runs the unwrapped head on exactly its rows; without them, the (graph) head."""
    from core.hooks import TalkerMTP

    head = SeededHead()
    wrapped = []
    mtp = TalkerMTP(lambda *a, **k: wrapped.append(a[0].shape[0]) or head.talker_mtp(*a, **k), 4, H,
                    torch.float32, torch.device("cpu"), eager=head.talker_mtp, sizes=[1, 2, 4])
    ids, last, text = _row_inputs("a", 0)
    rows = (ids.repeat(3), torch.zeros(3, H), last.repeat(3, 1), text.repeat(3, 1))
    mtp(*rows, generators=[torch.Generator().manual_seed(1), None, None])
    assert wrapped == [] and head.calls[-1] == (3, False, True)
    mtp(*rows)
    assert wrapped == [4] and mtp.graph_stats()["eager_seeded"] == 1


def test_sample_uniforms_are_drawn_per_row_from_its_generator():
    """``TalkerMTP.draw_uniforms``: a seeded row's noise is its generator's first ``[1, STEPS, VOCAB]`` draw
    (what vLLM-Omni's V2 model state draws), wherever the row sits; bad input raises saying what to pass."""
    from core.hooks import TalkerMTP

    mtp = TalkerMTP(SeededHead().talker_mtp, 8, H, torch.float32, torch.device("cpu"), sizes=[1, 2, 4, 8])
    mtp.use_sample_uniforms(STEPS, VOCAB)
    want = torch.empty(1, STEPS, VOCAB).uniform_(1e-20, 1 - 1e-20, generator=torch.Generator().manual_seed(5))
    mtp.draw_uniforms(3, 4, [None, torch.Generator().manual_seed(5), None])
    assert torch.equal(mtp.sample_uniforms[1:2], want)
    assert ((mtp.sample_uniforms[:4] > 0) & (mtp.sample_uniforms[:4] < 1)).all()
    with pytest.raises(ValueError, match="one per row"):
        mtp.draw_uniforms(3, 4, [None, torch.Generator()])
    with pytest.raises(ValueError, match="positive steps"):
        mtp.use_sample_uniforms(0, VOCAB)
    mtp.capture()
    with pytest.raises(ValueError, match="after capture"):
        mtp.use_sample_uniforms(STEPS, VOCAB)
