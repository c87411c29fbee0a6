"""The plain-torch reference sampler, the oracle of the kit's ``sampler-equivalence`` checks (issue 5),
on the ``--device`` driver's device (the kit's ``backend``). Repository-only: it tests the oracle, not a driver.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_backends.testing import reference_sampler as rs  # noqa: E402

pytestmark = pytest.mark.device_tier

VOCAB = 512


def _tied_logits(dev, dtype):
    """4 rows whose top logits tie at several ids; the lowest tied id differs per row."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, VOCAB, generator=g) * 2
    tied = [(7, 300), (3, 2, 400), (511, 200), (0, 1)]
    for row, ids in enumerate(tied):
        x[row, list(ids)] = 20.0
    return x.to(dtype=dtype).to(dev), [min(ids) for ids in tied]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_greedy_and_top_k_1_agree_on_ties(backend, dtype):
    dev = backend.device()
    logits, lowest = _tied_logits(dev, getattr(torch, dtype))
    # bf16 really ties: the tied values are bit-identical
    assert logits[0, 7] == logits[0, 300]
    assert rs.greedy(logits).tolist() == lowest
    assert rs.sample(logits, temperature=0.0).tolist() == lowest
    for seed in range(10):
        got = rs.sample(logits, temperature=1.0, top_k=1, generators=backend.generator(seed))
        assert got.tolist() == lowest


def test_tiny_top_p_keeps_one_token(backend):
    dev = backend.device()
    logits, lowest = _tied_logits(dev, torch.bfloat16)
    for seed in range(10):
        got = rs.sample(logits, temperature=0.8, top_p=1e-6, generators=backend.generator(seed))
        assert got.tolist() == lowest


def test_top_k_at_or_above_vocab_is_no_op(backend):
    dev = backend.device()
    logits = torch.randn(6, VOCAB, device=dev)
    base = rs.sample(logits, temperature=1.0, generators=backend.generator(3))
    for k in (VOCAB, VOCAB + 1, 10 * VOCAB):
        assert torch.equal(rs.sample(logits, temperature=1.0, top_k=k, generators=backend.generator(3)), base)


def test_same_seed_same_tokens(backend):
    dev = backend.device()
    logits = torch.randn(16, VOCAB, device=dev)
    kw = dict(temperature=1.0, top_k=50, top_p=0.9)
    a = rs.sample(logits, **kw, generators=backend.generator(11))
    b = rs.sample(logits, **kw, generators=backend.generator(11))
    c = rs.sample(logits, **kw, generators=backend.generator(12))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)  # 16 rows x ~50 choices: equal by chance ~never
    # per-request generators: a row's token depends only on its own seed
    gens = {i: backend.generator(100 + i) for i in range(16)}
    d = rs.sample(logits, **kw, generators=gens)
    gens2 = {i: backend.generator(100 + i) for i in range(16)}
    e = rs.sample(logits[8:], **kw, generators={i - 8: gens2[i] for i in range(8, 16)})
    assert torch.equal(d[8:], e)


def test_top_k_top_p_restrict_support(backend):
    dev = backend.device()
    logits = torch.randn(1, VOCAB, device=dev)
    top5 = set(rs.ranked(logits[0])[:5].tolist())
    g = backend.generator(0)
    seen = {int(rs.sample(logits, temperature=2.0, top_k=5, generators=g)) for _ in range(200)}
    assert seen <= top5 and len(seen) >= 3


def test_frequencies_follow_softmax(backend):
    """Sampled frequencies match softmax(logits / T) (chi-square, 4 categories)."""
    dev = backend.device()
    logits = torch.full((1, VOCAB), -30.0, device=dev)
    logits[0, :4] = torch.tensor([2.0, 1.0, 0.5, 0.0], device=dev)
    p = torch.softmax(logits[0, :4].double().cpu(), 0)
    g = backend.generator(7)
    draws = 4000
    batch = logits.expand(draws, VOCAB).contiguous()
    tokens = rs.sample(batch, temperature=1.0, generators=g).cpu()
    counts = torch.bincount(tokens, minlength=VOCAB)
    assert counts[4:].sum() == 0
    expected = p * draws
    chi2 = float(((counts[:4].double() - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (counts[:4].tolist(), expected.tolist())  # p = 0.001 at 3 dof


def test_bad_arguments_raise(backend):
    logits = torch.randn(2, 8, device=backend.device())
    with pytest.raises(ValueError, match="temperature"):
        rs.sample(logits, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        rs.sample(logits, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        rs.sample(logits, top_p=0.0)
    with pytest.raises(ValueError, match="entries for 2 rows"):
        rs.sample(logits, temperature=[1.0])
    with pytest.raises(ValueError, match="NaN"):
        rs.greedy(torch.full((1, 4), float("nan")))
    with pytest.raises(ValueError, match=r"\[num_reqs, vocab\]"):
        rs.greedy(torch.randn(4))
