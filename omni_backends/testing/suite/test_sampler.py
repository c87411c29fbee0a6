"""Sampler equivalence with the reference sampler (device tier; needs the vendor's vLLM sampler).

The oracle is :mod:`omni_backends.reference_sampler`. Where the outcome is
deterministic (greedy, ties included; ``top_k=1`` or a tiny ``top_p`` without
ties) the driver's sampler must return the same tokens. Where the top-k/top-p
boundary falls inside a group of tied logits, vLLM keeps every tied token, so
the driver may return any token of the tie-closed kept set, never one outside
it. Where sampling is random, the token distributions must agree.
"""

from __future__ import annotations

import pytest
import torch

from omni_backends import reference_sampler as rs
from omni_backends.testing.kit import expect, vllm_missing_reason

pytestmark = pytest.mark.device_tier

VOCAB = 512
TIES = [(7, 300), (3, 2, 400), (511, 200), (0, 1)]


@pytest.fixture(scope="module")
def sampler(backend):
    missing = vllm_missing_reason()
    if missing:
        pytest.skip(f"{missing}; make_sampler() returns the vendor's vLLM sampler")
    return backend.make_sampler()


def _metadata(n, dev, temperature, top_k=None, top_p=None, generators=None):
    """A ``vllm.v1.sample.metadata.SamplingMetadata`` with penalties and processors off."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    temp = torch.as_tensor(temperature, dtype=torch.float32).expand(n).clone().to(dev)
    greedy = temp < rs.SAMPLING_EPS
    return SamplingMetadata(
        temperature=temp, all_greedy=bool(greedy.all()), all_random=bool((~greedy).all()),
        top_p=None if top_p is None else torch.full((n,), float(top_p), device=dev),
        top_k=None if top_k is None else torch.full((n,), int(top_k), dtype=torch.int32, device=dev),
        generators=generators or {}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(n, device=dev), presence_penalties=torch.zeros(n, device=dev),
        repetition_penalties=torch.ones(n, device=dev), output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )


def _run(backend, sampler, logits, **kw):
    n = logits.shape[0]
    md = _metadata(n, logits.device, **kw)
    out = sampler(logits=logits.clone(), sampling_metadata=md).sampled_token_ids
    return backend.to_host(out).view(-1).long()


def _tied(dev, dtype):
    x = torch.randn(len(TIES), VOCAB, generator=torch.Generator().manual_seed(5)) * 2
    for row, ids in enumerate(TIES):
        x[row, list(ids)] = 20.0
    return x.to(dtype).to(dev)


def _gens(backend, n, base=0):
    return {i: backend.generator(base + i) for i in range(n)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_ties(backend, sampler, dtype):
    logits = _tied(backend.device(), dtype)
    got = _run(backend, sampler, logits, temperature=0.0).tolist()
    want = backend.to_host(rs.greedy(logits)).tolist()
    expect(got == want, "sampler-equivalence",
           f"greedy sampling on tied logits ({dtype}) picked {got}; the reference sampler picks {want} "
           "(the lowest token id among tied maxima)")


@pytest.mark.parametrize("edge", [dict(top_k=1), dict(top_p=1e-6), dict(top_k=1, top_p=1e-6)])
def test_edges_that_leave_one_token(backend, sampler, edge):
    n = 32
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(9)).to(backend.device())
    got = _run(backend, sampler, logits, temperature=0.7, generators=_gens(backend, n), **edge)
    want = backend.to_host(rs.sample(logits, temperature=0.7, generators=_gens(backend, n), **edge)).long()
    expect(torch.equal(got, want), "sampler-equivalence",
           f"random sampling with {edge} must return the greedy token; rows differ at "
           f"{(got != want).nonzero().view(-1).tolist()[:8]}")


@pytest.mark.parametrize("edge", [dict(top_k=VOCAB), dict(top_p=1.0), dict(top_k=VOCAB, top_p=1.0)])
def test_no_op_edges(backend, sampler, edge):
    n = 32
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(3)).to(backend.device())
    plain = _run(backend, sampler, logits, temperature=1.0, generators=_gens(backend, n))
    got = _run(backend, sampler, logits, temperature=1.0, generators=_gens(backend, n), **edge)
    expect(torch.equal(got, plain), "sampler-equivalence",
           f"{edge} must not change sampling (same seeds gave different tokens in "
           f"{int((got != plain).sum())} of {n} rows)")


def _tie_closed_support(row: torch.Tensor, top_k=None, top_p=None) -> set[int]:
    """The reference's kept set for one row, plus every token tied with its last kept logit."""
    x = row.float()
    order = rs.ranked(x)
    keep = len(order) if top_k is None else min(top_k, len(order))
    if top_p is not None:
        probs = torch.softmax(x[order], -1)
        keep = min(keep, max(1, int((torch.cumsum(probs, -1) - probs < top_p).sum())))
    floor = x[order[keep - 1]]
    return set((x >= floor).nonzero().view(-1).tolist())


@pytest.mark.parametrize("edge", [dict(top_k=1), dict(top_k=2), dict(top_p=1e-6)])
def test_boundary_ties_stay_in_support(backend, sampler, edge):
    n = 64
    row = _tied(torch.device("cpu"), torch.float32)[1]  # ties at ids 2, 3, 400
    logits = row.repeat(n, 1).to(backend.device())
    got = _run(backend, sampler, logits, temperature=1.0, generators=_gens(backend, n), **edge)
    support = _tie_closed_support(row, **edge)
    ref = backend.to_host(rs.sample(logits, temperature=1.0, generators=_gens(backend, n), **edge)).tolist()
    outside = sorted(set(got.tolist()) - support)
    expect(set(ref) <= support, "sampler-equivalence", f"reference tokens {sorted(set(ref))} outside {sorted(support)}")
    expect(not outside, "sampler-equivalence",
           f"with {edge} on tied logits the sampler returned token(s) {outside}, outside the kept set "
           f"{sorted(support)} (the reference's kept tokens plus those tied with the boundary)")


@pytest.mark.parametrize("edge", [dict(top_k=3), dict(top_p=0.6), dict(top_k=5, top_p=0.8)])
def test_distribution_matches_reference(backend, sampler, edge):
    n, vocab = 3000, 8
    row = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.5, 0.0, -0.5, -1.0])
    logits = row.repeat(n, 1).to(backend.device())
    gen = backend.generator(17)
    got = _run(backend, sampler, logits, temperature=1.0, generators={i: gen for i in range(n)}, **edge)
    ref = backend.to_host(rs.sample(logits, temperature=1.0, generators=backend.generator(18), **edge)).long()
    p_got = torch.bincount(got, minlength=vocab).double() / n
    p_ref = torch.bincount(ref, minlength=vocab).double() / n
    tv = float((p_got - p_ref).abs().sum() / 2)
    expect(tv < 0.06, "sampler-equivalence",
           f"with {edge} the token distribution differs from the reference sampler's: total variation {tv:.3f} "
           f"(sampler {p_got.tolist()}, reference {p_ref.tolist()})")
