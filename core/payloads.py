"""Per-request state (vLLM-Omni's ``model_intermediate_buffer``): transport and lifecycle.

A request's state is a nested dict ``{category: {qualifier: value}}`` (the
layout of ``vllm_omni/data_entry_keys.py``: e.g. ``{"codes": {"audio": t}}``;
a top-level value that is not a dict is kept as is, e.g. ``"text": ["hi"]``).

Transport: the caller's initial state travels to the worker inside
``SamplingParams.extra_args["omni_payload"]`` (vLLM serialises ``extra_args``
with msgspec; tensors, at any depth of dicts and lists, are packed as
``{"__tensor__": [dtype, shape], "data": bytes}`` so they survive it exactly).

Lifecycle (:class:`PayloadStore`): on the worker, updates are *merged* into a
request's state per category (vLLM-Omni's ``_update_intermediate_buffer``):
tensors are kept on the CPU except the ``(category, qualifier)`` pairs the model
declares in ``gpu_resident_buffer_keys``, which are kept on the driver's
device; an entry is dropped when its request finishes or is aborted.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

EXTRA_ARGS_KEY = "omni_payload"
#: ``SamplingParams.extra_args`` key of a request's talker-MTP seed (vLLM-Omni's ``tts_local_seed``): the
#: declaration that builds a request sets it, the worker's hooks seed the request's MTP generator from it
MTP_SEED_KEY = "tts_local_seed"
_TENSOR = "__tensor__"


def _pack_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8) if t.dtype == torch.bfloat16 else t  # numpy has no bfloat16
        return {_TENSOR: [str(t.dtype).removeprefix("torch."), list(t.shape)], "data": raw.numpy().tobytes()}
    if isinstance(value, dict):
        return {k: _pack_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_pack_value(v) for v in value]
    return value


def _unpack_value(value: Any) -> Any:
    if isinstance(value, dict):
        if _TENSOR in value:
            dtype_name, shape = value[_TENSOR]
            dtype = getattr(torch, dtype_name)
            data = bytearray(value["data"])  # an owned, writable copy
            t = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            return t.reshape(shape)
        return {k: _unpack_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpack_value(v) for v in value]
    return value


def pack(payload: dict[str, Any] | None) -> dict[str, Any]:
    """Make a payload msgspec-safe: tensors at any depth -> tagged bytes (exact
    round trip; tuples come back as lists)."""
    return {k: _pack_value(v) for k, v in (payload or {}).items()}


def unpack(packed: dict[str, Any] | None) -> dict[str, Any]:
    """Inverse of :func:`pack`. Tensors come back on the CPU."""
    return {k: _unpack_value(v) for k, v in (packed or {}).items()}


def with_state_key(params: Any, key: str) -> Any:
    """``params`` (a ``SamplingParams``) whose request names ``key`` as the id its model keeps its state under
    (``meta.request_id`` of its payload, vLLM-Omni's ``MetaStruct.request_id``; read on the worker by
    ``core.hooks.omni_hooks.state_key``), merged into the payload it already carries. Returns ``params``."""
    extra = dict(params.extra_args or {})
    payload = unpack(extra.get(EXTRA_ARGS_KEY))
    meta = payload.get("meta")
    payload["meta"] = {**(meta if isinstance(meta, dict) else {}), "request_id": str(key)}
    extra[EXTRA_ARGS_KEY] = pack(payload)
    params.extra_args = extra
    return params


class PayloadStore:
    """req_id -> per-request state, merged per category (vLLM-Omni's
    ``model_intermediate_buffer``).

    ``device_resident_keys``: ``(category, qualifier)`` pairs kept on the
    device (the model's ``gpu_resident_buffer_keys``; a top-level tensor key is
    named ``(key, None)``); every other tensor is stored on the CPU. Tensors
    are stored detached; a device-resident one is cloned (the producer may
    reuse its buffer, e.g. a graph output). ``to_device`` moves a tensor to
    the driver's device (``Backend.device()``); ``to_host`` copies one to the
    CPU (``Backend.to_host``).
    """

    def __init__(self, device_resident_keys: Iterable[tuple[str, str | None]],
                 to_device: Callable[[torch.Tensor], torch.Tensor],
                 to_host: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.device_resident_keys = frozenset(device_resident_keys)
        self._to_device = to_device
        self._to_host = to_host or (lambda t: t.to("cpu"))
        self._data: dict[str, dict[str, Any]] = {}

    def _place(self, key: tuple[str, str | None], value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if key in self.device_resident_keys:
                moved = self._to_device(t)
                return moved.clone() if moved is t else moved
            return self._to_host(t).contiguous() if t.device.type != "cpu" else t.contiguous()
        if isinstance(value, list):
            return [self._place(("", None), v) if isinstance(v, torch.Tensor) else v for v in value]
        return value

    def put(self, req_id: str, update: dict[str, Any] | None) -> dict[str, Any]:
        """Merge ``update`` into a request's state (created when absent): a dict
        value is merged qualifier by qualifier into that category, any other
        value replaces the key. Returns the (live) state dict."""
        entry = self._data.setdefault(req_id, {})
        for key, value in (update or {}).items():
            if isinstance(value, dict):
                sub = entry.get(key)
                if not isinstance(sub, dict):
                    sub = entry[key] = {}
                for qual, v in value.items():
                    sub[qual] = self._place((key, qual), v)
            else:
                entry[key] = self._place((key, None), value)
        return entry

    def entries(self, req_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The live state dicts of ``req_ids``, in order (an empty one created and stored for an unknown
        id, as ``put(req_id, None)`` does)."""
        data = self._data
        req_ids = list(req_ids)
        out = list(map(data.get, req_ids))
        if None in out:  # (a dict is never None: the identity test settles each comparison)
            out = [e if e is not None else data.setdefault(r, {}) for r, e in zip(req_ids, out)]
        return out

    def get(self, req_id: str) -> dict[str, Any]:
        """A request's live state dict (an empty dict, not stored, when unknown)."""
        return self._data.get(req_id, {})

    def free(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._data.pop(req_id, None)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._data

    def __len__(self) -> int:
        return len(self._data)

    def request_ids(self) -> list[str]:
        return list(self._data)
