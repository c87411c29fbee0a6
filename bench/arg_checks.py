"""Checks the benchmark scripts make on their options before anything starts: one ``argparse`` error (exit
status 2) naming the option, never a traceback from an engine or a server that failed later."""

from __future__ import annotations

import argparse
from typing import Any


def require_usable_device(ap: argparse.ArgumentParser, device: str, *, export: bool = False) -> Any:
    """The :class:`~omni_backends.registry.Selection` of the driver ``--device`` names, selected in this process
    (``omni_backends.registry.select``: ``.name``, ``.backend``); an unknown
    or unusable one is ``ap.error`` with the registry's reason and fix. ``export``: the selection is written to
    the environment for the vLLM processes this process starts itself (a script whose engines run in this
    process must pass True: a later ``select`` returns this selection as it is, unexported); without it, the
    script's own children (a server, ``omni-backends run``) select on their own."""
    from omni_backends.errors import OmniBackendError
    from omni_backends.registry import select

    try:
        return select(device, export=export)
    except (OmniBackendError, ValueError) as exc:
        ap.error(f"--device {device}: {exc}")


def require_in_range(ap: argparse.ArgumentParser, option: str, values, low: int, high: int | None = None) -> None:
    """Every value of ``values`` (an int or a list of ints) in ``low..high`` (``high`` None: no upper bound),
    else ``ap.error`` naming ``option`` and the range."""
    for v in values if isinstance(values, (list, tuple)) else [values]:
        if v < low or (high is not None and v > high):
            span = f"{low}..{high}" if high is not None else f">= {low}"
            ap.error(f"{option} must be {span}, got {v}")
