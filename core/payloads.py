"""Per-request payloads (``additional_information``): transport and lifecycle.

Transport: a request's payload travels from the caller to the worker inside
``SamplingParams.extra_args["omni_payload"]`` (vLLM serialises ``extra_args``
with msgspec; tensors are packed as ``{"__tensor__": [dtype, shape], "data": bytes}``
so they survive it exactly).

Lifecycle (:class:`PayloadStore`): on the worker, tensors are kept on the CPU
except the keys the model declares device-resident
(``model.device_resident_payload_keys``), which are moved to the driver's
device; an entry is dropped when its request finishes or is aborted.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

EXTRA_ARGS_KEY = "omni_payload"
_TENSOR = "__tensor__"


def pack(payload: dict[str, Any]) -> dict[str, Any]:
    """Make a payload msgspec-safe: tensors -> tagged bytes (exact round trip)."""
    out: dict[str, Any] = {}
    for key, value in payload.items():
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8) if t.dtype == torch.bfloat16 else t  # numpy has no bfloat16
            out[key] = {_TENSOR: [str(t.dtype).removeprefix("torch."), list(t.shape)], "data": raw.numpy().tobytes()}
        else:
            out[key] = value
    return out


def unpack(packed: dict[str, Any] | None) -> dict[str, Any]:
    """Inverse of :func:`pack`. Tensors come back on the CPU."""
    out: dict[str, Any] = {}
    for key, value in (packed or {}).items():
        if isinstance(value, dict) and _TENSOR in value:
            dtype_name, shape = value[_TENSOR]
            dtype = getattr(torch, dtype_name)
            data = bytearray(value["data"])  # an owned, writable copy
            t = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            out[key] = t.reshape(shape)
        else:
            out[key] = value
    return out


class PayloadStore:
    """req_id -> payload dict, CPU-resident except device-resident keys.

    ``to_device`` moves a tensor to the driver's device (``Backend.device()``).
    """

    def __init__(self, device_resident_keys: Iterable[str], to_device: Callable[[torch.Tensor], torch.Tensor]):
        self.device_resident_keys = frozenset(device_resident_keys)
        self._to_device = to_device
        self._data: dict[str, dict[str, Any]] = {}

    def _place(self, key: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return self._to_device(value) if key in self.device_resident_keys else value.to("cpu")

    def put(self, req_id: str, payload: dict[str, Any]) -> None:
        """Store (or merge into) a request's payload."""
        entry = self._data.setdefault(req_id, {})
        for key, value in payload.items():
            entry[key] = self._place(key, value)

    def get(self, req_id: str) -> dict[str, Any]:
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
