"""Helpers shared by the suite's modules (import torch; used only inside the suite)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from omni_backends.testing.kit import (IN_FLIGHT, IN_FLIGHT_EVIDENCE, ORDERING_CHECK, ORDERING_CONTRACTS,
                                      ContractViolation)

#: rounds of queued work (:func:`keep_device_busy`) tried in turn on an accelerator before the kit concludes that
#: ``queue_copy`` does not leave its copy in flight (a fast device may finish the shorter ones first)
IN_FLIGHT_ROUNDS = (24, 96, 384)


def host_memory_device(backend) -> bool:
    """True when the driver's tensors live in host memory (the cpu driver, a simulated device)."""
    return backend.device().type == "cpu"


def keep_device_busy(backend, rounds: int = 24) -> torch.Tensor:
    """Queue enough work on the current stream that a copy issued next waits behind it.

    On an accelerator this makes a race between a queued copy and a host write
    show every time; on a host-memory device work runs when issued, so nothing
    is queued. Returns the last result (keep it alive until synchronised).
    """
    if host_memory_device(backend):
        return torch.zeros(1)
    a = torch.rand(2048, 2048, device=backend.device(), generator=backend.generator(7)) / 2048
    for _ in range(rounds):
        a = a @ a + 1e-3
    return a


def pattern(n: int, step: int, dtype=torch.int64) -> torch.Tensor:
    """A recognisable host tensor for step ``step``: ``step * 1_000_000 + arange(n)``."""
    return torch.arange(n, dtype=dtype) + step * 1_000_000


def snapshot(backend, tensor: torch.Tensor) -> torch.Tensor:
    """What device tensor ``tensor`` holds now, read without waiting for the current stream: on a host-memory
    device its storage as it is (a clone); on an accelerator ``backend.to_host(tensor)`` issued on a new side
    stream, which does not wait for work queued on the current one. Returns a CPU tensor of ``tensor``'s shape
    and dtype."""
    if host_memory_device(backend):
        return tensor.detach().clone()
    with backend.stream_context(backend.new_stream()):
        return backend.to_host(tensor)


def ordering_check(backend, record: Callable[[str, Any], None], contract: str) -> None:
    """Start a check of ``contract`` that relies on ``queue_copy`` leaving work in flight: record it for the
    report (``record`` is pytest's ``record_property``) and skip it, with the reason, where the driver declares
    ``Capabilities.synchronous_copies`` (nothing is ever in flight there, so the check could only pass
    vacuously)."""
    record(ORDERING_CHECK, contract)
    if backend.capabilities().synchronous_copies:
        pytest.skip(f"'{contract}' ordering check skipped: driver {backend.name!r} declares "
                    "Capabilities.synchronous_copies (its device completes every copy when issued), so no copy is "
                    "ever in flight for this check to order")


def _defined_by(cls: type, name: str) -> str:
    owner = next((k for k in cls.__mro__ if name in vars(k)), cls)
    return f"{owner.__module__}.{owner.__qualname__}.{name}"


def queue_in_flight(backend, dst: torch.Tensor, src: torch.Tensor, want: torch.Tensor,
                    record: Callable[[str, Any], None], contract: str) -> torch.Tensor:
    """``backend.queue_copy(dst, src)`` on the current stream, behind queued work (:func:`keep_device_busy`),
    proven to be in flight on return: :func:`snapshot` of ``dst`` does not yet hold ``want`` (the CPU tensor
    ``src`` holds), or, on an accelerator, the current stream's ``query()`` taken right after the copy says work
    issued up to it has not finished (a copy on that stream completes only after it). On a host-memory device
    only the destination counts: a copy there may land at once whatever its stream holds. Synchronizes the device
    first, so ``dst`` and ``src`` are settled and only the copy is new. On an accelerator a copy that already
    landed is retried behind longer work (:data:`IN_FLIGHT_ROUNDS`).

    Records ``(IN_FLIGHT, True)`` and ``(IN_FLIGHT_EVIDENCE, "destination" or "stream query")`` through ``record``
    and returns the busy tensor (keep it alive until the copy is synchronised). Raises
    :class:`~omni_backends.testing.kit.ContractViolation` (``kit-ops``), after recording ``(IN_FLIGHT, False)``,
    when the copy landed every time: the check of ``contract`` would then pass whatever the driver does."""
    host = host_memory_device(backend)
    rounds = (0,) if host else IN_FLIGHT_ROUNDS
    for n in rounds:
        backend.synchronize()
        busy = keep_device_busy(backend, rounds=n) if n else torch.zeros(1)
        backend.queue_copy(dst, src)
        query = getattr(backend.current_stream(), "query", None)
        pending = not host and callable(query) and not query()
        evidence = "destination" if not torch.equal(snapshot(backend, dst), want) else "stream query" if pending else ""
        if evidence:
            record(IN_FLIGHT, True)
            record(IN_FLIGHT_EVIDENCE, evidence)
            return busy
        backend.synchronize()
        dst.zero_()
    record(IN_FLIGHT, False)
    behind = f" even behind {rounds[-1]} rounds of queued matmuls on the current stream" if rounds[-1] else ""
    checks = (f"the '{contract}' check, which needs a copy still queued on the stream," if contract != "kit-ops" else
              f"the ordering checks ({', '.join(ORDERING_CONTRACTS)}), which need a copy still queued on the stream,")
    raise ContractViolation(
        "kit-ops",
        f"{type(backend).__qualname__}.queue_copy(dst, src) left nothing in flight: the destination already held "
        f"the copied values when it returned{behind}, so {checks} would pass whatever the driver does. "
        f"queue_copy is {_defined_by(type(backend), 'queue_copy')}."
        " Write queue_copy with your device's own non-blocking copy, enqueued on the current stream (the shared "
        "base's dst.copy_(src, non_blocking=True) copies at once where torch sees host tensors); or, if your "
        "device completes every copy when it is issued, declare Capabilities(synchronous_copies=True) and the "
        "ordering checks are skipped with that reason (docs/vendor-guide.md: the queue_copy rule, and 'Declare "
        "capabilities')")
