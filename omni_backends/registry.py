"""Driver discovery (stevedore) and device selection.

Drivers are entry points in the group ``omni_backends.drivers`` whose object
is a :class:`~omni_backends.backend.Backend` subclass. Discovery loads them
through ``stevedore.ExtensionManager`` with an ``on_load_failure_callback``
that records every failure (nothing is swallowed: ``devices`` shows it, and
selecting that driver re-raises it with the original traceback).

Selection precedence (first that applies decides):

1. an explicit name (``select(device=...)``, the CLI's ``--device``);
2. ``OMNI_BACKENDS_DEVICE`` in the environment;
3. auto-detect: probe every loaded driver; among the *usable* ones the
   highest ``priority`` wins; equal priorities break by name (alphabetical),
   and the report says a tie was broken.

``auto`` as a name means rule 3. The selection is made once per process
under a lock; a second call returns the same result, and a call asking for
a different driver raises.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import threading
import traceback
from typing import Any

from omni_backends.backend import INTERFACE_VERSION, Backend, ProbeResult
from omni_backends.errors import (
    DeviceNotUsableError,
    DriverLoadError,
    DuplicateDriverError,
    IncompatibleDriverError,
    NoUsableDeviceError,
    OmniBackendError,
    UnknownDeviceError,
)

log = logging.getLogger(__name__)

NAMESPACE = "omni_backends.drivers"
ENV_DEVICE = "OMNI_BACKENDS_DEVICE"
#: JSON of the parent's selection, exported for worker processes.
ENV_SELECTION = "OMNI_BACKENDS_SELECTION"
AUTO = "auto"


@dataclasses.dataclass
class DriverEntry:
    """One entry point in ``omni_backends.drivers`` and what loading it gave."""

    name: str
    value: str
    distribution: str | None
    cls: type[Backend] | None = None
    load_error: BaseException | None = None
    load_traceback: str | None = None
    duplicate_of: list[str] = dataclasses.field(default_factory=list)
    incompatible: str | None = None

    @property
    def loaded(self) -> bool:
        return self.cls is not None and self.load_error is None and not self.duplicate_of and not self.incompatible


@dataclasses.dataclass
class Candidate:
    """One driver's state in a selection report."""

    name: str
    distribution: str | None
    priority: int | None
    probe: ProbeResult | None
    problem: str | None = None  # load failure / duplicate / incompatible
    verification: list[str] = dataclasses.field(default_factory=list)
    capabilities: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "priority": self.priority,
            "probe": self.probe.to_json() if self.probe else None,
            "problem": self.problem,
            "verification": self.verification,
        }


@dataclasses.dataclass
class Selection:
    """The result of selecting a driver: which one, by which rule, and every candidate."""

    name: str
    rule: str
    reason: str
    candidates: list[Candidate]
    notes: list[str]
    versions: dict[str, str | None]
    driver_cls: type[Backend] | None = dataclasses.field(repr=False, compare=False, default=None)
    backend: Backend = dataclasses.field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @property
    def fingerprint(self) -> str:
        """Hash of (driver, vendor versions, interface version): equal in every rank."""
        blob = json.dumps([self.name, sorted(self.versions.items()), INTERFACE_VERSION])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {
            "selected": self.name,
            "rule": self.rule,
            "reason": self.reason,
            "notes": list(self.notes),
            "versions": dict(self.versions),
            "interface_version": INTERFACE_VERSION,
            "fingerprint": self.fingerprint,
            "candidates": [c.to_json() for c in self.candidates],
        }

    def to_text(self) -> str:
        lines = [f"selected: {self.name}  (rule: {self.rule})", f"  why: {self.reason}"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# --------------------------------------------------------------- discovery
def _entry_points_with_dists() -> dict[str, list[tuple[str, str | None]]]:
    """name -> [(entry-point value, distribution name)] straight from importlib.metadata."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    for ep in importlib.metadata.entry_points(group=NAMESPACE):
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
        out.setdefault(ep.name, [])
        if (ep.value, dist) not in out[ep.name]:
            out[ep.name].append((ep.value, dist))
    return out


def _stevedore_extensions(failures: dict[str, tuple[BaseException, str]]) -> tuple[list[Any], str | None]:
    """Load every driver through stevedore; returns (extensions, cache problem or None).

    A corrupt or unusable stevedore entry-point cache (``~/.cache/python-entrypoints``)
    must not break discovery: if the manager itself fails, the entry points are
    read from ``importlib.metadata`` and loaded into a stevedore manager
    built with ``ExtensionManager.make_test_instance``.
    """
    from stevedore import ExtensionManager
    from stevedore.extension import Extension

    def on_failure(_manager: Any, entry_point: Any, exc: BaseException) -> None:
        failures[entry_point.name] = (exc, traceback.format_exc())

    try:
        mgr = ExtensionManager(
            namespace=NAMESPACE,
            invoke_on_load=False,
            on_load_failure_callback=on_failure,
            propagate_map_exceptions=True,
        )
        return list(mgr.extensions), None
    except Exception as exc:  # corrupt cache contents stevedore cannot parse
        problem = f"stevedore entry-point cache unusable ({type(exc).__name__}: {exc}); read entry points directly"
        log.warning(problem)
        exts = []
        for ep in importlib.metadata.entry_points(group=NAMESPACE):
            try:
                exts.append(Extension(ep.name, ep, ep.load(), None))
            except Exception as load_exc:  # recorded, never swallowed
                failures[ep.name] = (load_exc, traceback.format_exc())
        return list(ExtensionManager.make_test_instance(exts, namespace=NAMESPACE).extensions), problem


def discover() -> tuple[dict[str, DriverEntry], list[str]]:
    """Find and load every installed driver.

    Returns ``(entries by name, notes)``. Load failures, duplicate names and
    incompatible interface versions are recorded on the entries, not raised.
    """
    notes: list[str] = []
    declared = _entry_points_with_dists()
    failures: dict[str, tuple[BaseException, str]] = {}
    exts, cache_problem = _stevedore_extensions(failures)
    if cache_problem:
        notes.append(cache_problem)
    loaded = {ext.name: ext.plugin for ext in exts}

    entries: dict[str, DriverEntry] = {}
    for name, targets in declared.items():
        value, dist = targets[0]
        entry = DriverEntry(name=name, value=value, distribution=dist)
        dists = sorted({d or "?" for _, d in targets})
        if len(targets) > 1:
            entry.duplicate_of = [f"{d} ({v})" for v, d in targets]
        if name in failures:
            entry.load_error, entry.load_traceback = failures[name]
        elif name in loaded:
            plugin = loaded[name]
            if not (isinstance(plugin, type) and issubclass(plugin, Backend)):
                entry.incompatible = f"entry point {value!r} is not a Backend subclass (got {plugin!r})"
            elif INTERFACE_VERSION not in tuple(getattr(plugin, "interface_versions", ())):
                entry.incompatible = (
                    f"driver implements Backend interface version(s) {list(plugin.interface_versions)} but this "
                    f"omni-backends speaks version {INTERFACE_VERSION}; upgrade the driver distribution "
                    f"{', '.join(dists)} or install a matching omni-backends"
                )
            else:
                entry.cls = plugin
        entries[name] = entry
    return entries, notes


def problem_of(entry: DriverEntry) -> str | None:
    """One sentence on why a discovered driver cannot be used at all, or None."""
    if entry.duplicate_of:
        return (
            f"driver name {entry.name!r} is registered by more than one distribution: "
            f"{'; '.join(entry.duplicate_of)}. Uninstall all but one of them."
        )
    if entry.load_error is not None:
        return f"driver failed to load: {type(entry.load_error).__name__}: {entry.load_error}"
    if entry.incompatible:
        return entry.incompatible
    return None


def _aliases(entries: dict[str, DriverEntry]) -> dict[str, str]:
    table = {}
    for name, entry in entries.items():
        if entry.cls is not None:
            for alias in entry.cls.aliases:
                table.setdefault(alias, name)
    return table


def resolve_name(name: str, entries: dict[str, DriverEntry]) -> str:
    """Canonical driver name for a typed name or alias (case-insensitive).

    Raises :class:`UnknownDeviceError` listing the installed names.
    """
    key = name.strip().lower()
    if key in entries:
        return key
    aliases = _aliases(entries)
    if key in aliases:
        return aliases[key]
    known = sorted(entries) + sorted(f"{a} (= {t})" for a, t in aliases.items())
    raise UnknownDeviceError(
        f"unknown device {name!r}. Installed drivers: {', '.join(known) or 'none'}; "
        f"or use 'auto'. Check --device / {ENV_DEVICE}."
    )


# --------------------------------------------------------------- selection
def _candidates(entries: dict[str, DriverEntry]) -> list[Candidate]:
    out = []
    for name in sorted(entries):
        e = entries[name]
        probe = e.cls.probe() if e.loaded else None
        out.append(
            Candidate(
                name=name,
                distribution=e.distribution,
                priority=e.cls.priority if e.cls is not None else None,
                probe=probe,
                problem=problem_of(e),
                verification=[v.value for v in e.cls.verification] if e.cls is not None else [],
            )
        )
    return out


def _raise_for_entry(entry: DriverEntry) -> None:
    if entry.duplicate_of:
        raise DuplicateDriverError(problem_of(entry))
    if entry.load_error is not None:
        raise DriverLoadError(
            f"driver {entry.name!r} ({entry.value}, from {entry.distribution}) failed to import: "
            f"{type(entry.load_error).__name__}: {entry.load_error}. Fix or uninstall that distribution."
        ) from entry.load_error
    if entry.incompatible:
        raise IncompatibleDriverError(f"driver {entry.name!r}: {entry.incompatible}")


def decide(device: str | None = None, *, env: dict[str, str] | None = None, flag_name: str = "--device") -> Selection:
    """Pick a driver without binding it. Pure apart from probing; raises on bad input.

    ``device``: explicit name (or ``"auto"``/``None``). ``env`` defaults to
    ``os.environ``. Raises :class:`UnknownDeviceError`,
    :class:`DeviceNotUsableError`, :class:`DriverLoadError`,
    :class:`DuplicateDriverError`, :class:`IncompatibleDriverError`,
    :class:`NoUsableDeviceError`.
    """
    env = os.environ if env is None else env
    entries, notes = discover()
    env_value = (env.get(ENV_DEVICE) or "").strip()
    if device is not None and device.strip().lower() != AUTO:
        rule, requested = f"explicit {flag_name}", device
        if env_value and env_value.lower() not in (AUTO, device.strip().lower()):
            notes.append(f"{flag_name}={device} overrides {ENV_DEVICE}={env_value}")
    elif device is None and env_value and env_value.lower() != AUTO:
        rule, requested = f"environment {ENV_DEVICE}", env_value
    else:
        rule, requested = "auto-detect", None

    candidates = _candidates(entries)
    by_name = {c.name: c for c in candidates}

    if requested is not None:
        name = resolve_name(requested, entries)
        _raise_for_entry(entries[name])
        probe = by_name[name].probe
        assert probe is not None
        if not probe.usable:
            raise DeviceNotUsableError(
                f"device {name!r} was requested ({rule}) but is not usable here: {probe.reason.rstrip('.')}."
                + (f" To fix: {probe.fix}." if probe.fix else "")
                + (f" Error: {probe.error}" if probe.error else ""),
                probe=probe,
            )
        reason = f"{name} was requested ({rule}) and probes usable: {probe.reason}"
    else:
        usable = [c for c in candidates if c.probe is not None and c.probe.usable]
        if not usable:
            lines = "; ".join(f"{c.name}: {c.problem or (c.probe.reason if c.probe else '?')}" for c in candidates)
            raise NoUsableDeviceError(
                f"no usable device driver found ({lines}). Install a vendor stack, e.g. "
                f"`pip install 'omni-backends[cpu]'`, or pick one with --device."
            )
        usable.sort(key=lambda c: (-(c.priority or 0), c.name))
        best = usable[0]
        name = best.name
        ties = [c.name for c in usable if c.priority == best.priority]
        reason = f"{name} has the highest priority ({best.priority}) among usable drivers ({', '.join(c.name for c in usable)})"
        if len(ties) > 1:
            notes.append(f"priority tie between {', '.join(ties)} broken by name: {name}")
        for c in candidates:
            if c.name != name and (c.priority or 0) > (best.priority or 0):
                why = c.problem or (c.probe.reason if c.probe else "not loaded")
                notes.append(f"{c.name} (priority {c.priority}) skipped: {why}")

    cls = entries[name].cls
    assert cls is not None
    versions = dict(by_name[name].probe.versions) if by_name[name].probe else {}
    return Selection(
        name=name, rule=rule, reason=reason, candidates=candidates, notes=notes, versions=versions, driver_cls=cls
    )


_lock = threading.RLock()
_selected: Selection | None = None
_selecting = threading.local()


def select(device: str | None = None, *, export: bool = True, flag_name: str = "--device") -> Selection:
    """Select and bind the process's driver once; thread-safe, never re-entered.

    The first call decides (see :func:`decide`) and instantiates the driver;
    later calls return the same :class:`Selection`. A later call that names a
    *different* driver raises :class:`OmniBackendError`. With ``export`` the
    choice is written to ``OMNI_BACKENDS_DEVICE`` / ``OMNI_BACKENDS_SELECTION``
    and the driver's vLLM platform variables, so vLLM worker processes resolve
    the same driver.
    """
    global _selected
    if getattr(_selecting, "active", False):
        raise OmniBackendError("omni_backends.select() was re-entered (a driver's probe or constructor called it)")
    with _lock:
        if _selected is not None:
            if device is not None and device.strip().lower() != AUTO:
                entries, _ = discover()
                want = resolve_name(device, entries)
                if want != _selected.name:
                    raise OmniBackendError(
                        f"this process already selected driver {_selected.name!r} ({_selected.rule}); "
                        f"cannot switch to {want!r}. Start a new process to use another device."
                    )
            return _selected
        _selecting.active = True
        try:
            sel = decide(device, flag_name=flag_name)
            sel.backend = sel.driver_cls()  # type: ignore[misc]
            if export:
                export_selection(sel)
            _selected = sel
            return sel
        finally:
            _selecting.active = False


def export_selection(sel: Selection, env: dict[str, str] | None = None) -> dict[str, str]:
    """Write the selection into ``env`` (default ``os.environ``) for child processes.

    Sets ``OMNI_BACKENDS_DEVICE``, ``OMNI_BACKENDS_SELECTION`` (name, versions,
    fingerprint) and the driver's ``vllm_platform_env()``. Returns what was set.
    """
    env = os.environ if env is None else env
    values = {
        ENV_DEVICE: sel.name,
        ENV_SELECTION: json.dumps({"name": sel.name, "versions": sel.versions, "fingerprint": sel.fingerprint}),
    }
    if sel.backend is not None:
        values.update(sel.backend.vllm_platform_env())
    env.update(values)
    return values


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


def devices_report(device: str | None = None) -> dict[str, Any]:
    """Every installed driver's state plus which would be selected and why (JSON-able)."""
    entries, notes = discover()
    candidates = _candidates(entries)
    out: dict[str, Any] = {
        "interface_version": INTERFACE_VERSION,
        "notes": notes,
        "drivers": [],
    }
    for c in candidates:
        d = c.to_json()
        e = entries[c.name]
        if e.cls is not None:
            d["identity"] = e.cls.identity()
        if e.load_traceback:
            d["traceback"] = e.load_traceback
        out["drivers"].append(d)
    try:
        sel = decide(device)
        out["selection"] = sel.to_json()
    except OmniBackendError as exc:
        out["selection"] = {"selected": None, "error": f"{type(exc).__name__}: {exc}"}
    return out


def verify_worker_selection(env: dict[str, str] | None = None) -> Selection:
    """In a vLLM worker process: select the parent's driver and check it matches.

    Reads ``OMNI_BACKENDS_SELECTION`` written by the parent. Raises
    :class:`OmniBackendError` naming both sides if this process resolves a
    different driver or different vendor versions.
    """
    env = os.environ if env is None else env
    raw = env.get(ENV_SELECTION)
    parent = json.loads(raw) if raw else None
    sel = select(parent["name"] if parent else None, export=False, flag_name=ENV_SELECTION)
    if parent and (parent["name"] != sel.name or parent["fingerprint"] != sel.fingerprint):
        raise OmniBackendError(
            f"worker process resolved driver {sel.name!r} (versions {sel.versions}, fingerprint {sel.fingerprint}) "
            f"but the parent selected {parent['name']!r} (versions {parent['versions']}, fingerprint "
            f"{parent['fingerprint']}). Every rank must see the same vendor stack: check the worker's environment."
        )
    return sel


__all__ = [
    "AUTO",
    "ENV_DEVICE",
    "ENV_SELECTION",
    "NAMESPACE",
    "Candidate",
    "DriverEntry",
    "Selection",
    "current",
    "decide",
    "devices_report",
    "discover",
    "export_selection",
    "get_backend",
    "resolve_name",
    "select",
    "verify_worker_selection",
]
