"""A plain-torch reference sampler: the oracle every driver's sampler is tested against.

It implements the sampling rules of vLLM's V1 ``Sampler`` for the parameters
the omni runner uses (temperature, top-k, top-p, per-request seeded
generators) in the most direct way, with one precise tie rule, so that a
driver's sampler (vLLM ``Sampler``, ``AscendSampler``, ...) can be compared
with it token for token where the outcome is deterministic, and
statistically where it is random.

Rules, per request row, in this order:

1. logits are upcast to float32 (vLLM: "Convert logits to float32").
2. ``temperature < 1e-5`` (vLLM's ``_SAMPLING_EPS``) is greedy: the token
   with the largest logit; **among tied largest logits the lowest token id
   wins**. top-k / top-p do not change a greedy pick.
3. otherwise logits are divided by the temperature; then tokens are ranked
   by (logit descending, token id ascending) -- the same tie rule;
   ``top_k`` keeps the first ``k`` ranks (``k >= vocab`` keeps all);
   ``top_p`` keeps the shortest rank prefix whose softmax mass is
   ``>= top_p`` (always at least the first rank).
4. one token is drawn from the softmax over the kept tokens with the
   exponential race ``argmax(p / q)``, ``q ~ Exp(1)`` drawn from the row's
   ``torch.Generator`` -- the method vLLM uses -- so equal seeds give equal
   tokens on the same device.

Consequences the conformance tests rely on: ``top_k=1`` and a ``top_p``
so small that one token survives both return exactly the greedy token, ties
included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: Temperatures below this are greedy (vLLM ``vllm.v1.sample.sampler._SAMPLING_EPS``).
SAMPLING_EPS = 1e-5


def greedy(logits: "torch.Tensor") -> "torch.Tensor":
    """Greedy token per row of ``logits`` ``[num_reqs, vocab]`` (any float dtype).

    Returns int64 ``[num_reqs]`` on ``logits.device``: the index of the largest
    logit; among ties the lowest index. NaN logits raise ``ValueError``.
    """
    import torch

    _check_logits(logits)
    x = logits.float()
    top = x.max(dim=-1, keepdim=True).values
    ids = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    big = torch.full_like(ids, x.shape[-1])
    return torch.where(x == top, ids, big).min(dim=-1).values


def ranked(logits_row: "torch.Tensor") -> "torch.Tensor":
    """Token ids of one row ``[vocab]`` ordered by (logit descending, id ascending). int64 ``[vocab]``."""
    import torch

    # a stable sort on ids already in ascending order keeps the lower id first among ties
    return torch.sort(logits_row.float(), descending=True, stable=True).indices


def sample(
    logits: "torch.Tensor",
    *,
    temperature: float | Sequence[float] | "torch.Tensor" = 1.0,
    top_k: int | Sequence[int | None] | None = None,
    top_p: float | Sequence[float | None] | None = None,
    generators: "torch.Generator | Mapping[int, torch.Generator] | None" = None,
) -> "torch.Tensor":
    """Sample one token per row of ``logits`` ``[num_reqs, vocab]`` by the module's rules.

    ``temperature``, ``top_k``, ``top_p``: one value for all rows or one per
    row (``None`` entries = off). ``generators``: one ``torch.Generator`` on
    ``logits.device`` used for every random row in order, or ``{row: generator}``
    (rows without one use torch's default generator), or ``None``.

    Returns int64 ``[num_reqs]`` on ``logits.device``. Raises ``ValueError``
    for a non-2-D or NaN input, a negative temperature, ``top_k < 1``,
    ``top_p`` outside ``(0, 1]``, or per-row lists of the wrong length.
    """
    import torch

    _check_logits(logits)
    n, vocab = logits.shape
    temps = _per_row(temperature, n, "temperature")
    ks = _per_row(top_k, n, "top_k")
    ps = _per_row(top_p, n, "top_p")
    out = greedy(logits)
    for i in range(n):
        t, k, p = temps[i], ks[i], ps[i]
        if t is None or t < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {t!r} for row {i}")
        if k is not None and (int(k) != k or k < 1):
            raise ValueError(f"top_k must be an int >= 1 or None, got {k!r} for row {i}")
        if p is not None and not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] or None, got {p!r} for row {i}")
        if t < SAMPLING_EPS:
            continue  # greedy, already in out
        x = logits[i].float() / float(t)
        order = ranked(x)
        keep = vocab if k is None else min(int(k), vocab)
        order = order[:keep]
        probs = torch.softmax(x[order], dim=-1)
        if p is not None and p < 1.0:
            cum = torch.cumsum(probs, dim=-1)
            # shortest prefix with mass >= p: count ranks whose preceding mass is < p
            n_keep = max(1, int((cum - probs < p).sum()))
            order, probs = order[:n_keep], probs[:n_keep]
            probs = probs / probs.sum()
        gen = generators.get(i) if isinstance(generators, Mapping) else generators
        q = torch.empty_like(probs).exponential_(generator=gen)
        out[i] = order[int(torch.argmax(probs / q))]
    return out


def _check_logits(logits: "torch.Tensor") -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a float tensor [num_reqs, vocab], got {tuple(logits.shape)} {logits.dtype}")
    if logits.shape[1] == 0:
        raise ValueError("logits has an empty vocabulary dimension")
    if bool(logits.isnan().any()):
        raise ValueError("logits contain NaN; the model produced invalid output")


def _per_row(value, n: int, name: str) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        value = value.tolist() if value.dim() else value.item()
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} rows")
        return list(value)
    return [value] * n
