"""Checks shared by the drivers' visible-devices parsers.

A visible-devices variable (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``,
``ZE_AFFINITY_MASK``, ...) is a comma-separated list whose syntax and order rules
belong to one device runtime, so each driver parses its own variable
(:meth:`omni_backends.backend.Backend.parse_visible_devices`). The checks every
such list needs are here, each raising
:class:`~omni_backends.errors.PlacementError` with the fix; :func:`parse_generic`
is the default parser (the one a driver gets when it writes none).

Pure functions of their arguments; nothing here imports torch or a vendor stack.
"""

from __future__ import annotations

import re

from omni_backends.errors import PlacementError

#: a non-negative decimal ordinal (``"0"``, ``"12"``; ``"01"`` is ordinal 1)
ORDINAL = re.compile(r"^\d+$")


def split_entries(variable: str, value: str) -> list[str]:
    """The comma-separated entries of ``value``, stripped. Raises
    :class:`PlacementError` for an empty entry (``"0,,1"``, a trailing comma)."""
    entries = [e.strip() for e in value.split(",")]
    if any(not e for e in entries):
        raise PlacementError(f"{variable}={value!r} has an empty entry; list device ids separated by single commas")
    return entries


def refuse_duplicates(variable: str, value: str, keys: list[str]) -> None:
    """Raise :class:`PlacementError` if a device key appears twice (two ranks would share it)."""
    seen: set[str] = set()
    for k in keys:
        if k in seen:
            raise PlacementError(
                f"{variable}={value!r} lists device {k} twice; two ranks would share it (and the runtime may then "
                f"hide every device). List each device once."
            )
        seen.add(k)


def refuse_descending(variable: str, value: str, ordinals: list[int], why: str) -> None:
    """Raise :class:`PlacementError` (with ``why`` and the sorted spelling) unless
    ``ordinals`` is ascending, for runtimes that keep their own device order."""
    if ordinals != sorted(ordinals):
        raise PlacementError(
            f"{variable}={value!r} is not in ascending order; {why} Write it as "
            f"{','.join(str(o) for o in sorted(ordinals))!r} and order ranks with the rank index instead."
        )


def check_range(variable: str, value: str, ordinals: list[int], device_count: int | None) -> None:
    """Raise :class:`PlacementError` for an ordinal ``>= device_count`` (no check when the count is ``None``)."""
    if device_count is None:
        return
    over = [o for o in ordinals if o >= device_count]
    if over:
        raise PlacementError(
            f"{variable}={value!r} names device(s) {', '.join(map(str, over))} but the host has {device_count} "
            f"(ids 0..{device_count - 1}); fix {variable}."
        )


def parse_generic(variable: str, value: str, device_count: int | None = None) -> tuple[str, ...]:
    """The default visible-devices rule: ``""`` hides every device; otherwise
    comma-separated entries in index order, none empty or repeated, and every
    ordinal entry below ``device_count`` when that is known. Returns the entries
    as written (stripped). Raises :class:`PlacementError`."""
    if value.strip() == "":
        return ()
    entries = split_entries(variable, value)
    refuse_duplicates(variable, value, entries)
    check_range(variable, value, [int(e) for e in entries if ORDINAL.match(e)], device_count)
    return tuple(entries)


__all__ = ["ORDINAL", "PlacementError", "check_range", "parse_generic", "refuse_descending", "refuse_duplicates",
           "split_entries"]
