"""core.payloads without an engine: exact pack/unpack round trip through vLLM's
own msgspec transport of ``SamplingParams.extra_args``, and the worker-side
:class:`~core.payloads.PayloadStore` (placement of device-resident keys, free)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from core.payloads import EXTRA_ARGS_KEY, PayloadStore, pack, unpack  # noqa: E402


def _payload() -> dict:
    g = torch.Generator().manual_seed(7)
    return {
        "f32": torch.randn(5, 3, generator=g),
        # values that do not survive a float32 detour: bfloat16's own bit patterns
        "bf16": (torch.randn(4, 6, generator=g) * 1e3).to(torch.bfloat16),
        "i64": torch.tensor([[0, -1, 2**40], [7, 2**62, -(2**63)]], dtype=torch.int64),
        "f16_scalar": torch.tensor(0.1, dtype=torch.float16),
        "bf16_scalar": torch.tensor(-3.140625, dtype=torch.bfloat16),
        "bf16_empty": torch.zeros(0, 3, dtype=torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "non_contiguous": torch.arange(12, dtype=torch.float32).reshape(3, 4).t()[:, 1:],
        "voice": 3,
        "name": "narrator",
        "spans": [[0, 4], [4, 9]],
        "nested": {"a": 1.5, "b": None},
    }


def _assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            out = got[key]
            assert isinstance(out, torch.Tensor), key
            assert out.dtype == value.dtype and out.shape == value.shape, (key, out.dtype, out.shape)
            assert out.device.type == "cpu"
            # bit-exact, not allclose
            assert torch.equal(out, value), key
        else:
            assert got[key] == value, key


def _through_vllm_transport(extra_args: dict, max_tokens: int = 4):
    """Encode an ``EngineCoreRequest`` carrying ``extra_args`` with vLLM's
    ``MsgpackEncoder`` and decode it with ``MsgpackDecoder`` -- what happens
    between the front end and the engine core in multiprocess mode."""
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    params = SamplingParams(max_tokens=max_tokens, extra_args=extra_args)
    req = EngineCoreRequest(
        request_id="req-0", prompt_token_ids=[1, 2, 3], mm_features=None, sampling_params=params,
        pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
    )
    frames = MsgpackEncoder().encode(req)
    return MsgpackDecoder(EngineCoreRequest).decode(frames).sampling_params


def test_pack_unpack_round_trip_is_exact_through_vllm_msgpack():
    payload = _payload()
    packed = pack(payload)
    # the packed form holds no tensor: it is plain msgspec data
    assert not any(isinstance(v, torch.Tensor) for v in packed.values())
    params = _through_vllm_transport({EXTRA_ARGS_KEY: packed, "other": 1})
    assert params.extra_args["other"] == 1
    _assert_same(unpack(params.extra_args[EXTRA_ARGS_KEY]), payload)


def test_pack_does_not_touch_the_callers_tensors():
    t = torch.randn(3, requires_grad=True)
    before = t.detach().clone()
    out = unpack(pack({"t": t}))["t"]
    out += 1
    assert torch.equal(t.detach(), before)
    assert not out.requires_grad


def test_unpack_of_nothing_is_an_empty_payload():
    assert unpack(None) == {}
    assert unpack({}) == {}


# ------------------------------------------------------------- PayloadStore
def _to_meta(t: "torch.Tensor") -> "torch.Tensor":
    return t.to("meta")


def test_store_puts_device_resident_pairs_on_the_device_and_the_rest_on_cpu():
    store = PayloadStore({("embed", "prefill"), ("prompt_embeds", None)}, _to_meta)
    embeds = torch.randn(4, 8)
    store.put("a", {"prompt_embeds": embeds, "thinker_hidden": torch.randn(4, 8), "voice": 2,
                    "embed": {"prefill": embeds, "other": embeds}})
    entry = store.get("a")
    assert entry["prompt_embeds"].device.type == "meta" and entry["prompt_embeds"].shape == (4, 8)
    assert entry["embed"]["prefill"].device.type == "meta"
    assert entry["embed"]["other"].device.type == "cpu"  # residency is per (category, qualifier)
    assert entry["thinker_hidden"].device.type == "cpu"
    assert entry["voice"] == 2


def test_store_merges_updates_per_category_like_vllm_omni():
    store = PayloadStore({("hidden_states", "last")}, lambda t: t)
    last = torch.ones(1, 3)
    live = store.put("a", {"meta": {"offset": 0, "flag": True}, "hidden_states": {"last": last}})
    store.put("a", {"meta": {"offset": 5}, "text": ["hi"]})
    entry = store.get("a")
    assert entry is live  # the live dict the model's kwargs hold
    assert entry["meta"] == {"offset": 5, "flag": True}  # merged, not replaced
    assert entry["text"] == ["hi"]
    assert entry["hidden_states"]["last"] is not last and torch.equal(entry["hidden_states"]["last"], last)
    last.add_(1)  # a device-resident value is a copy: the producer may reuse its buffer
    assert torch.equal(entry["hidden_states"]["last"], torch.ones(1, 3))
    assert store.put("a", None) is entry


def test_nested_state_round_trips_through_vllms_transport():
    state = {"text": ["hello"], "speaker": ["alice"], "codes": {"audio": torch.arange(6).reshape(3, 2)},
             "voice_clone_prompt": [{"ref_code": torch.ones(2, 2, dtype=torch.int64)}]}
    got = unpack(_through_vllm_transport({EXTRA_ARGS_KEY: pack(state)}).extra_args[EXTRA_ARGS_KEY])
    assert got["text"] == ["hello"] and got["speaker"] == ["alice"]
    assert torch.equal(got["codes"]["audio"], state["codes"]["audio"])
    assert torch.equal(got["voice_clone_prompt"][0]["ref_code"], state["voice_clone_prompt"][0]["ref_code"])


def test_store_uses_the_drivers_device_through_hooks():
    from core.hooks import OmniHooks
    from omni_backends.cpu.driver import CpuBackend

    hooks = OmniHooks(CpuBackend())

    class Model:
        gpu_resident_buffer_keys = {("hidden_states", "last")}

    hooks.bind_model(Model())
    assert hooks.payloads.device_resident_keys == frozenset({("hidden_states", "last")})
    hooks.payloads.put("r", {"hidden_states": {"last": torch.ones(2, 2)}})
    assert hooks.backend.is_device_tensor(hooks.payloads.get("r")["hidden_states"]["last"])


def test_store_free_releases_entries_and_ignores_unknown_ids():
    store = PayloadStore(("k",), _to_meta)
    for r in ("a", "b", "c"):
        store.put(r, {"k": torch.zeros(1), "v": torch.zeros(2)})
    assert len(store) == 3 and store.request_ids() == ["a", "b", "c"]
    store.free(["b", "never-seen"])
    assert "b" not in store and "a" in store and "c" in store
    assert store.get("b") == {}
    store.free(iter(["a", "c"]))
    assert len(store) == 0 and store.request_ids() == []
