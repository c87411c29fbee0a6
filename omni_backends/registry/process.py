"""The process-global selection: one driver per process, selected once under a lock, bound, and kept.

:func:`select` decides (:func:`omni_backends.registry.decision.decide_among`),
hides the broken vendor packages of the other drivers
(:func:`omni_backends.registry.vendor_modules.hide_other_vendors`), constructs
the driver and, with ``export``, hands the choice to child processes
(:func:`omni_backends.registry.handoff.export_selection`). Later calls from
any thread return the same result and driver instance, a call asking for a
different driver raises, and a call from inside a selection (a driver's probe
or constructor) raises instead of recursing. :func:`current` and
:func:`get_backend` read what was selected.
"""

from __future__ import annotations

import os
import threading

from omni_backends.backend import Backend
from omni_backends.errors import IncompatibleDriverError, OmniBackendError
from omni_backends.registry.decision import (
    decide_among,
    incomplete_class_problem,
    probe_candidates,
    resolve_name,
    selecting,
    selection_in_progress,
)
from omni_backends.registry.discovery import discover
from omni_backends.registry.handoff import export_selection
from omni_backends.registry.results import AUTO, Selection
from omni_backends.registry.vendor_modules import hide_other_vendors

_lock = threading.RLock()
_selected: Selection | None = None


def _instantiate(name: str, cls: type[Backend]) -> Backend:
    """``cls()``, refusing an incomplete (abstract) driver class with the message ``devices`` shows."""
    problem = incomplete_class_problem(name, cls)
    if problem:
        raise IncompatibleDriverError(problem)
    return cls()


def select(device: str | None = None, *, export: bool = True, flag_name: str = "--device") -> Selection:
    """Select and bind the process's driver once; thread-safe, never re-entered.

    The first call decides (see :func:`~omni_backends.registry.decision.decide`) and instantiates the driver;
    later calls (from any thread) return the same :class:`Selection`, whose
    ``backend`` is the one driver instance. A later call that names a
    *different* driver raises :class:`OmniBackendError`; so does a call made
    from inside a selection (a driver's probe or constructor). Before the
    driver is constructed, the vendor packages of the *other* drivers that raise
    on import (``torch_npu`` without CANN) are hidden from this process, so no
    third-party availability check (transformers, accelerate, vLLM) imports them
    on the way (:func:`~omni_backends.registry.vendor_modules.hide_other_vendors`; a
    note and a warning say which). With ``export``
    the choice is written to ``OMNI_BACKENDS_DEVICE`` /
    ``OMNI_BACKENDS_SELECTION`` / ``OMNI_BACKENDS_HIDDEN_VENDORS`` and the
    driver's vLLM platform variables, so vLLM worker processes resolve the same
    driver and hide the same packages. Raises what ``decide`` raises.
    """
    global _selected
    if selecting():
        raise OmniBackendError(
            "omni_backends.select() was re-entered (a driver's probe or constructor called it while a driver was "
            "being selected); drivers must not select. Fix the driver."
        )
    with _lock:
        if _selected is not None:
            key = (device or "").strip().lower()
            same = {_selected.name.lower(), *(a.lower() for a in getattr(_selected.driver_cls, "aliases", ()))}
            if key and key != AUTO and key not in same:  # only an unfamiliar name pays for a discovery
                entries, _ = discover()
                want = resolve_name(device, entries, source=flag_name)
                if want != _selected.name:
                    raise OmniBackendError(
                        f"this process already selected driver {_selected.name!r} ({_selected.rule}); "
                        f"cannot switch to {want!r}. Start a new process to use another device."
                    )
            return _selected
        with selection_in_progress():
            entries, notes = discover()
            sel = decide_among(entries, probe_candidates(entries), notes, device, os.environ, flag_name)
            assert sel.driver_cls is not None
            hide_other_vendors(entries, sel)
            sel.backend = _instantiate(sel.name, sel.driver_cls)
        if export:
            export_selection(sel)
        _selected = sel
        return sel


def current() -> Selection | None:
    """The process's selection, or None before :func:`select` ran."""
    return _selected


def get_backend() -> Backend:
    """The process's bound driver, selecting it on first use (see :func:`select`)."""
    return select().backend


def _reset_for_tests() -> None:
    """Forget the process's selection (tests only)."""
    global _selected
    with _lock:
        _selected = None


__all__ = ["current", "get_backend", "select"]
