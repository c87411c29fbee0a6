"""The one in-place change of a live vLLM object made on the driver side: the V1 sampler's one-token rule.

Every other patch of a vLLM object lives in the core's ``core/patches/`` folder; this one stays under
``omni_backends`` because the drivers make it (``Backend.prepare_sampler`` / ``KitOps.make_sampler``) and
``omni_backends`` never imports ``core`` (``tests/test_layering.py``). ``core.patches.PATCHES`` lists it too.

- What: :func:`install_one_token_greedy` replaces ``sampler.topk_topp_sampler`` (the ``TopKTopPSampler``
  module of vLLM's V1 ``Sampler``, or of a vendor subclass such as vllm-ascend's ``AscendSampler``) with a
  wrapper (:func:`one_token_greedy_cls`) that returns the greedy token, ties towards the lowest token id, for
  every random row whose ``top_k`` / ``top_p`` keep one token (:func:`one_token_rows`); every other row is
  vLLM's.
- Why: vLLM's ``TopKTopPSampler`` keeps every token tied at the boundary and draws among them, so ``top_k=1``
  on tied maxima is random there; the reference sampler's rule (``omni_backends.testing.reference_sampler``)
  is greedy, and the kit's sampler contract checks it.
- Versions: vLLM 0.26 through 0.33 (``Sampler.sample`` applies the temperature, then calls
  ``self.topk_topp_sampler(logits, generators, k, p)``), vllm-ascend 0.23 / 0.26 (``AscendSampler``).
- Until: a deterministic tie rule in vLLM's top-k / top-p sampling (one-token rows sampled greedily).

Each symbol is declared once as a :class:`~omni_backends.binding.VendorSymbol`; importing this module imports
no vLLM.
"""

from __future__ import annotations

import functools
from typing import Any

from omni_backends.binding import Patch, VendorSymbol

SAMPLER = VendorSymbol("vllm.v1.sample.sampler", "Sampler", params=("logprobs_mode",), required=(), kind="class")
# The seam of the one-token rule (:func:`install_one_token_greedy`): vLLM's V1 ``Sampler.sample`` applies the
# temperature and then calls its ``topk_topp_sampler`` module as ``(logits, generators, k, p)``; the driver wraps
# that module. Declared so check-drift proves the attribute, the call and its parameters per vLLM version
# (``required=None``: an unbound method's ``self`` reads as required when installed, not in a source tree).
SAMPLER_SAMPLE = VendorSymbol(
    "vllm.v1.sample.sampler", "Sampler.sample", params=("logits", "sampling_metadata"), required=None,
    mentions=("apply_temperature", "self.topk_topp_sampler("),
)
SAMPLER_TOPK_TOPP = VendorSymbol("vllm.v1.sample.sampler", "Sampler.topk_topp_sampler", kind="attribute")
TOPK_TOPP_FORWARD = VendorSymbol(
    "vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler.forward_native",
    params=("logits", "generators", "k", "p"), required=None,
)


PATCH = Patch.declare(__name__, __doc__, (SAMPLER, SAMPLER_SAMPLE, SAMPLER_TOPK_TOPP, TOPK_TOPP_FORWARD),
                      name="sampler_one_token_greedy")


# ------------------------------------------------------------------ the one-token sampling rule
def one_token_rows(logits: Any, k: Any, p: Any) -> Any:
    """Rows whose top-k / top-p keep exactly one token by the reference sampler's
    rules (:mod:`omni_backends.testing.reference_sampler`): ``k == 1``, or the top token's
    probability after top-k (renormalised over the first ``k`` ranks) is ``>= p``.

    ``logits``: float ``[num_rows, vocab]`` as ``TopKTopPSampler`` receives them
    (after temperature); ``k``: int ``[num_rows]`` (``vocab`` = off) or ``None``;
    ``p``: float ``[num_rows]`` (``1.0`` = off) or ``None``. Returns bool
    ``[num_rows]`` on ``logits.device``, or ``None`` when ``k`` and ``p`` are both
    ``None``. Vectorised, no host sync; a full-row sort only when both ``k`` and
    ``p`` are given (as vLLM's own PyTorch top-p path does). Rows with NaN or
    all ``-inf`` logits are never one-token rows by ``p``.
    """
    import torch

    if k is None and p is None:
        return None
    n, vocab = logits.shape
    one = torch.zeros(n, dtype=torch.bool, device=logits.device)
    if k is not None:
        one |= k.view(-1) == 1
    if p is not None:
        x = logits.float()
        top = x.amax(dim=-1, keepdim=True)
        if k is None:
            mass = torch.exp(x - top).sum(dim=-1)  # softmax mass relative to the top token's
        else:
            ranks = torch.sort(x, dim=-1, descending=True).values
            kk = k.view(-1).long().clamp(1, vocab)
            mass = torch.exp(ranks - top).cumsum(dim=-1).gather(-1, (kk - 1).unsqueeze(-1)).squeeze(-1)
        one |= p.view(-1).float() * mass <= 1.0  # the top token's probability 1/mass >= p
    return one


@functools.lru_cache(maxsize=None)
def one_token_greedy_cls() -> type:
    import torch

    class OneTokenGreedy(torch.nn.Module):
        """vLLM's ``TopKTopPSampler`` (``self.inner``) where rows whose top-k / top-p
        keep one token (:func:`one_token_rows`) return the greedy token of the
        logits it receives, the lowest token id among tied maxima; every other row
        is ``inner``'s. ``forward(logits [num_rows, vocab] float32, generators,
        k, p) -> (sampled [num_rows] int, processed logits/logprobs or None)``.
        Other attributes are ``inner``'s (vendor subclasses' methods included)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, logits: Any, generators: Any, k: Any, p: Any) -> Any:
            one = one_token_rows(logits, k, p)
            if one is None:
                return self.inner(logits, generators, k, p)
            greedy = logits.argmax(dim=-1)  # taken first: inner may update logits in place
            sampled, processed = self.inner(logits, generators, k, p)
            sampled = sampled.view(-1)
            return torch.where(one, greedy.to(sampled.dtype), sampled), processed

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                inner = self.__dict__.get("_modules", {}).get("inner", self.__dict__.get("inner"))
                if inner is None:
                    raise
                return getattr(inner, name)

    return OneTokenGreedy


def install_one_token_greedy(sampler: Any, attr: str | None = None) -> Any:
    """Make ``sampler`` (a ``vllm.v1.sample.sampler.Sampler`` or subclass, e.g.
    ``vllm_ascend.sample.sampler.AscendSampler``) return the greedy token, ties
    towards the lowest token id, for every random row whose ``top_k`` / ``top_p``
    keep one token. vLLM's own ``TopKTopPSampler`` keeps every token tied at the
    boundary and draws among them, so ``top_k=1`` on tied maxima is random there.

    Wraps ``sampler.topk_topp_sampler`` in place (idempotent) and returns
    ``sampler``; everything else stays vLLM's. ``attr``: the attribute's name
    where a vendor declares its own (default vLLM's ``topk_topp_sampler``).
    Raises ``TypeError`` for an object without it.
    """
    attr = attr or SAMPLER_TOPK_TOPP.attr_name
    inner = getattr(sampler, attr, None)
    if inner is None:
        raise TypeError(f"{type(sampler).__qualname__} has no {attr!r}: not a {SAMPLER.qualname} (the one-token "
                        f"sampling rule wraps {SAMPLER_TOPK_TOPP.qualname}, which {SAMPLER_SAMPLE.qualname} calls "
                        f"like {TOPK_TOPP_FORWARD.qualname}{TOPK_TOPP_FORWARD.params})")
    cls = one_token_greedy_cls()
    if not isinstance(inner, cls):
        setattr(sampler, attr, cls(inner))
    return sampler
