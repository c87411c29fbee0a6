"""Attention-metadata invariants and KV padding slots (device tier)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omni_backends.backend import check_attn_metadata
from omni_backends.testing.kit import expect, vllm_missing_reason

pytestmark = pytest.mark.device_tier

BLOCKS, BLOCK_SIZE, HEADS, HEAD = 6, 4, 2, 8


def reference_kv_write(key, value, key_cache, value_cache, slot_mapping) -> None:
    """The oracle: one token at a time, padding slots (< 0) skipped."""
    for t in range(key.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        block, offset = divmod(slot, key_cache.shape[1])
        key_cache[block, offset] = key[t]
        value_cache[block, offset] = value[t]


def _batch(dev):
    # 3 requests: a prefill of 5, a decode of 1, a chunk of 3 after 4 computed; 3 padding tokens at the end.
    qsl = torch.tensor([0, 5, 6, 9], dtype=torch.int32, device=dev)
    seq_lens = torch.tensor([5, 9, 7], dtype=torch.int32, device=dev)
    slots = torch.tensor([0, 1, 2, 3, 4, 13, 20, 21, 22, -1, -1, -1], dtype=torch.int64, device=dev)
    return qsl, seq_lens, slots


def test_valid_batch_passes(backend):
    qsl, seq_lens, slots = _batch(backend.device())
    check_attn_metadata(qsl, seq_lens, slots, num_reqs=3, num_actual_tokens=9)


@pytest.mark.parametrize(
    "case, qsl, seq_lens, slots, words",
    [
        ("not monotonic", [0, 5, 4, 9], [5, 9, 7], None, "monotonic"),
        ("not from 0", [1, 5, 6, 9], [5, 9, 7], None, "start at 0"),
        ("seq_lens < query_lens", [0, 5, 6, 9], [5, 9, 2], None, "seq_lens"),
        ("padding slot on a real token", [0, 5, 6, 9], [5, 9, 7], [0, 1, 2, 3, -1, 13, 20, 21, 22], "padding"),
    ],
)
def test_broken_batch_names_the_invariant(backend, case, qsl, seq_lens, slots, words):
    dev = backend.device()
    args = [torch.tensor(qsl, dtype=torch.int32, device=dev), torch.tensor(seq_lens, dtype=torch.int32, device=dev)]
    args.append(torch.tensor(slots, dtype=torch.int64, device=dev) if slots else None)
    with pytest.raises(ValueError, match=words):
        check_attn_metadata(*args, num_reqs=3)


def test_common_attn_metadata_class(backend):
    missing = vllm_missing_reason()
    if missing:
        pytest.skip(f"{missing}; common_attn_metadata_cls() resolves a vLLM class")
    cls = backend.common_attn_metadata_cls()
    fields = {f.name for f in dataclasses.fields(cls)}
    need = {"query_start_loc", "query_start_loc_cpu", "seq_lens", "num_reqs", "num_actual_tokens", "slot_mapping"}
    expect(need <= fields, "attn-metadata", f"{cls.__qualname__} lacks field(s) {sorted(need - fields)}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_slots_never_written(backend, dtype):
    dev = backend.device()
    qsl, seq_lens, slots = _batch(dev)
    check_attn_metadata(qsl, seq_lens, slots, num_reqs=3, num_actual_tokens=9)
    gen = backend.generator(11)
    key = torch.randn(slots.numel(), HEADS, HEAD, device=dev, generator=gen).to(dtype)
    value = torch.randn(slots.numel(), HEADS, HEAD, device=dev, generator=gen).to(dtype)
    sentinel = -7.0
    caches = [torch.full((BLOCKS, BLOCK_SIZE, HEADS, HEAD), sentinel, dtype=dtype, device=dev) for _ in range(4)]
    reference_kv_write(key, value, caches[0], caches[1], slots)
    backend.write_kv_cache(key, value, caches[2], caches[3], slots)
    backend.synchronize()
    for name, ref, got in (("key", caches[0], caches[2]), ("value", caches[1], caches[3])):
        ref, got = backend.to_host(ref), backend.to_host(got)
        last = got.view(-1, HEADS, HEAD)[-1]
        expect(bool((last == sentinel).all()), "kv-padding-slots",
               f"write_kv_cache() wrote the {name} cache's last slot: a slot id of -1 was used as an index")
        wrong = int((ref != got).any(-1).any(-1).sum())
        expect(wrong == 0, "kv-padding-slots",
               f"write_kv_cache() differs from the reference write in {wrong} {name}-cache slot(s)")
