"""Policy every driver shares, so no driver chooses its own.

- :func:`capture_sizes`: the batch sizes graphs are captured for;
- :func:`check_attn_metadata`: the invariants of a ``CommonAttentionMetadata`` batch.

Both are re-exported by :mod:`omni_backends.backend`. Importing this module
imports no torch (the tensors are passed in) and no vendor stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch


def capture_sizes(max_batch: int, *, min_size: int = 1) -> list[int]:
    """Batch sizes to capture graphs for; the one policy every driver shares.

    Mirrors vLLM's default ladder (``VllmConfig._set_cudagraph_sizes``:
    1, 2, 4, then multiples of 8 up to 256, then multiples of 16), cut at
    ``max_batch`` and always *including* ``max_batch`` itself, so the largest
    configured batch never falls back to eager.

    Returns a strictly increasing list of ints in ``[min_size, max_batch]``.
    Raises ``ValueError`` if ``max_batch < 1`` or ``min_size`` is out of range.
    """
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    if min_size < 1 or min_size > max_batch:
        raise ValueError(f"min_size must be in [1, {max_batch}], got {min_size}")
    ladder = [1, 2, 4, *range(8, 256, 8), *range(256, max_batch + 1, 16)]
    sizes = sorted({s for s in ladder if min_size <= s <= max_batch} | {max_batch})
    return sizes


def check_attn_metadata(
    query_start_loc: "torch.Tensor",
    seq_lens: "torch.Tensor",
    slot_mapping: "torch.Tensor | None" = None,
    *,
    num_reqs: int | None = None,
    num_actual_tokens: int | None = None,
) -> None:
    """Check the invariants of a ``CommonAttentionMetadata`` batch.

    Arguments mirror ``vllm.v1.attention.backend.CommonAttentionMetadata``:
    ``query_start_loc`` int32 ``[num_reqs + 1]``, ``seq_lens`` int32
    ``[num_reqs]``, ``slot_mapping`` int64 ``[num_tokens]`` (negative = padding,
    never written to the KV cache).

    Raises ``ValueError`` naming the broken invariant:
    query_start_loc starts at 0 and is non-decreasing; ``seq_lens >= query_lens``
    per request; ``num_actual_tokens`` equals ``query_start_loc[num_reqs]``;
    padding slots (< 0) appear only at or after ``num_actual_tokens``.
    """
    qsl = query_start_loc.detach().to("cpu").long()
    sl = seq_lens.detach().to("cpu").long()
    n = int(num_reqs) if num_reqs is not None else sl.numel()
    if qsl.numel() < n + 1:
        raise ValueError(f"query_start_loc has {qsl.numel()} entries, need num_reqs + 1 = {n + 1}")
    if int(qsl[0]) != 0:
        raise ValueError(f"query_start_loc must start at 0, starts at {int(qsl[0])}")
    q = qsl[1 : n + 1] - qsl[:n]
    if bool((q < 0).any()):
        raise ValueError(f"query_start_loc must be monotonic non-decreasing: {qsl[: n + 1].tolist()}")
    if bool((sl[:n] < q).any()):
        raise ValueError(f"seq_lens must be >= query_lens per request: seq_lens={sl[:n].tolist()} query_lens={q.tolist()}")
    total = int(qsl[n])
    if num_actual_tokens is not None and int(num_actual_tokens) != total:
        raise ValueError(f"num_actual_tokens={num_actual_tokens} but query_start_loc[num_reqs]={total}")
    if slot_mapping is not None:
        sm = slot_mapping.detach().to("cpu").long()
        if bool((sm[:total] < 0).any()):
            raise ValueError("a real token (index < num_actual_tokens) has a negative (padding) slot id")
