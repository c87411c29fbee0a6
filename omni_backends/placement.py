"""Rank -> device mapping per driver, as values handed to each rank.

A multi-process run (vLLM's multiprocess or Ray executor, tensor/pipeline
parallel) starts one worker per rank. Every rank must bind a distinct device
among those the driver's visible-devices variable
(:attr:`~omni_backends.backend.Backend.visible_devices_env`) lists, in the
order the device runtime numbers them, and must talk through the driver's
distributed backend (:meth:`~omni_backends.backend.Backend.distributed_backend`).

Everything here is a pure function of its arguments: the environment is
passed in as a mapping and read, never written (``os.environ`` of the parent
is not touched), and no module state is kept, so engines started
concurrently in threads each get their own answer.

How a variable's value is read is the driver's rule, not this module's:
:meth:`~omni_backends.backend.Backend.parse_visible_devices` turns the value
into device ids in index order (``CUDA_VISIBLE_DEVICES`` in the cuda driver,
``ASCEND_RT_VISIBLE_DEVICES`` in the npu driver, ``ZE_AFFINITY_MASK`` in the
xpu driver, a generic comma list for any other driver), and
:meth:`~omni_backends.backend.Backend.child_env_for_device` says what a child
process that should see one device gets.

An unset variable means "all devices of the host"; then the caller passes
the device count (the probe's ``device_count`` in a parent that must not
initialise the runtime, ``Backend.device_count()`` inside a worker).
A driver without a variable (``cpu``) has one device that every rank shares.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from omni_backends.backend import Backend
from omni_backends.errors import PlacementError


@dataclasses.dataclass(frozen=True)
class VisibleDevices:
    """The devices one process may use, in the runtime's index order.

    ``ids``: one entry per device index (a physical ordinal, a UUID, or for
    composite Level Zero devices the mask entries of one card joined by
    ``","``). ``variable`` / ``value``: where they came from (``value`` is
    ``None`` when the variable is unset). ``exclusive``: False when every rank
    shares the one device (drivers without a visible-devices variable).
    """

    ids: tuple[str, ...]
    variable: str | None
    value: str | None
    exclusive: bool = True

    def describe(self) -> str:
        if self.variable is None:
            return "the driver has no visible-devices variable; all ranks share its one device"
        if self.value is None:
            return f"{self.variable} is unset: all {len(self.ids)} device(s) of the host"
        return f"{self.variable}={self.value!r}"


@dataclasses.dataclass(frozen=True)
class RankDevice:
    """What one local rank binds.

    - ``local_rank``: the rank's index on this host (vLLM's ``local_rank``).
    - ``index``: the device index in a process that keeps the parent's
      visible list, i.e. ``torch.device(device_type, index)``.
    - ``device_id``: the visible-list entry behind ``index`` (physical id,
      UUID or ``card.tile`` entries); ``"0"`` on a shared device.
    - ``env``: variables for a child that should see *only* this device
      (then its index is 0); empty for a shared device. Merge it into the
      child's environment; the parent's is not changed.
    - ``device_type`` / ``dist_backend``: from the driver
      (``Backend.device_type``, ``Backend.distributed_backend()``).
    """

    local_rank: int
    index: int
    device_id: str
    env: Mapping[str, str]
    device_type: str
    dist_backend: str

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["env"] = dict(self.env)
        return d


# ------------------------------------------------------------------ mapping
def visible_devices(backend: "Backend | type[Backend]", env: Mapping[str, str],
                    device_count: int | None = None) -> VisibleDevices:
    """The devices ``backend``'s variable makes visible in ``env`` (read only).

    ``device_count``: devices on the host, needed when the variable is unset
    (and used to refuse ids past the end when given). Raises
    :class:`PlacementError` for a malformed, duplicated or (Ascend, Level
    Zero) descending list, or an unset variable without ``device_count``.
    """
    variable = backend.visible_devices_env
    if variable is None:
        return VisibleDevices(("0",), None, None, exclusive=False)
    value = env.get(variable)
    if value is None:
        if device_count is None:
            raise PlacementError(
                f"{variable} is unset and the number of {backend.name} devices is unknown; pass device_count "
                f"(the probe's device_count) or set {variable}."
            )
        return VisibleDevices(tuple(str(i) for i in range(device_count)), variable, None)
    return VisibleDevices(backend.parse_visible_devices(value, env, device_count), variable, value)


def _need(backend: "Backend | type[Backend]", world_size: int, visible: VisibleDevices) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise PlacementError(f"world_size must be a positive int, got {world_size!r}")
    if visible.exclusive and world_size > len(visible.ids):
        raise PlacementError(
            f"needs {world_size} {backend.name} devices (one per rank), only {len(visible.ids)} visible "
            f"({visible.describe()}). Lower tensor_parallel_size x pipeline_parallel_size to "
            f"{len(visible.ids) or 'a count of visible devices'}, or make more devices visible in {visible.variable}."
        )


def _dist_backend(backend: "Backend | type[Backend]") -> str:
    """The instance's :meth:`~omni_backends.backend.Backend.distributed_backend`
    (it may depend on the installed stack); a class's ``dist_backend`` attribute."""
    return backend.dist_backend if isinstance(backend, type) else backend.distributed_backend()


def device_for_rank(backend: "Backend | type[Backend]", local_rank: int, world_size: int,
                    env: Mapping[str, str], device_count: int | None = None) -> RankDevice:
    """The device local rank ``local_rank`` of ``world_size`` binds, given ``env``.

    Rank ``r`` gets visible index ``r``: the ``r``-th entry of the driver's
    visible list, so the list's order is the rank order. Pure: reads ``env``,
    keeps no state. Raises :class:`PlacementError` "needs K devices, only M
    visible" when ``world_size`` exceeds the visible devices of an exclusive
    driver, for a rank outside ``[0, world_size)``, and for a bad list (see
    :func:`visible_devices`).
    """
    visible = visible_devices(backend, env, device_count)
    _need(backend, world_size, visible)
    if not isinstance(local_rank, int) or not 0 <= local_rank < world_size:
        raise PlacementError(f"local_rank must be in [0, {world_size}), got {local_rank!r}")
    if not visible.exclusive:
        return RankDevice(local_rank, 0, visible.ids[0], {}, backend.device_type, _dist_backend(backend))
    device_id = visible.ids[local_rank]
    child_env = backend.child_env_for_device(device_id, env)
    return RankDevice(local_rank, local_rank, device_id, child_env, backend.device_type, _dist_backend(backend))


def plan(backend: "Backend | type[Backend]", world_size: int, env: Mapping[str, str],
         device_count: int | None = None) -> tuple[RankDevice, ...]:
    """:func:`device_for_rank` for every local rank ``0..world_size-1``: distinct
    devices on an exclusive driver. Raises :class:`PlacementError` when short."""
    visible = visible_devices(backend, env, device_count)
    _need(backend, world_size, visible)
    return tuple(device_for_rank(backend, r, world_size, env, device_count) for r in range(world_size))


def engine_world_size(engine_kwargs: Mapping[str, Any]) -> int | None:
    """Devices one host needs for ``vllm.LLM(**engine_kwargs)``:
    ``tensor_parallel_size x pipeline_parallel_size x data_parallel_size``
    (defaults 1), or None when the ranks may spread over several hosts
    (``distributed_executor_backend="ray"`` or ``"external_launcher"``, ``nnodes`` > 1),
    where each host's workers check their own share."""
    if engine_kwargs.get("distributed_executor_backend") in ("ray", "external_launcher"):
        return None
    if int(engine_kwargs.get("nnodes") or 1) > 1:
        return None
    sizes = (engine_kwargs.get(k) or 1 for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                                  "data_parallel_size"))
    world = 1
    for n in sizes:
        world *= int(n)
    return world


def check_engine_fits(selection: Any, engine_kwargs: Mapping[str, Any], env: Mapping[str, str]) -> tuple[RankDevice, ...]:
    """In the parent, before vLLM starts any worker: :func:`plan` the ranks of
    ``vllm.LLM(**engine_kwargs)`` over the selected driver (``selection``, a
    registry ``Selection``), so a short visible list fails fast with "needs K
    devices, only M visible". The host's device count is the selection's probe
    count (no device runtime is initialised). Returns ``()`` when the ranks may
    span hosts (see :func:`engine_world_size`)."""
    world = engine_world_size(engine_kwargs)
    if world is None:
        return ()
    probe = next((c.probe for c in selection.candidates if c.name == selection.name and c.probe), None)
    return plan(selection.backend, world, env, device_count=probe.device_count if probe else None)


# -------------------------------------------------------- worker-side checks
def check_worker_binding(backend: "Backend", local_rank: int, world_size: int, bound_device: Any,
                         env: Mapping[str, str], *, check_index: bool = True) -> RankDevice:
    """In a worker, after vLLM's ``init_device``: check that the device vLLM bound
    (``bound_device``, a ``torch.device``) is the one the mapping gives this
    rank, and that the default process group uses the driver's distributed
    backend (``torch.distributed.get_backend()``, when initialised).

    ``check_index=False`` checks the device type only: for executors that
    assign devices themselves (Ray hands each node's workers their GPU ids).
    Returns the rank's :class:`RankDevice`. Raises :class:`PlacementError`
    naming both sides on a mismatch.
    """
    expected = device_for_rank(backend, local_rank, world_size, env, device_count=backend.device_count())
    got_type = getattr(bound_device, "type", None)
    got_index = getattr(bound_device, "index", None) or 0
    if got_type != expected.device_type or (check_index and expected.env and got_index != expected.index):
        raise PlacementError(
            f"local rank {local_rank} is bound to {bound_device} but driver {backend.name!r} maps it to "
            f"{expected.device_type}:{expected.index} (visible id {expected.device_id}); check that every rank "
            f"sees the same {backend.visible_devices_env} as the parent."
        )
    got_dist = distributed_backend_in_use()
    if got_dist is not None and got_dist != expected.dist_backend:
        raise PlacementError(
            f"vLLM initialised torch.distributed with backend {got_dist!r} but driver {backend.name!r} uses "
            f"{expected.dist_backend!r}; vLLM resolved another platform than the driver (check VLLM_TARGET_DEVICE "
            f"/ VLLM_PLUGINS in the worker's environment)."
        )
    return expected


def distributed_backend_in_use() -> str | None:
    """``torch.distributed.get_backend()`` of the default group, or None when
    torch.distributed is not initialised in this process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return str(dist.get_backend())


__all__ = [
    "PlacementError",
    "RankDevice",
    "VisibleDevices",
    "check_engine_fits",
    "check_worker_binding",
    "device_for_rank",
    "engine_world_size",
    "distributed_backend_in_use",
    "plan",
    "visible_devices",
]
