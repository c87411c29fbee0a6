"""Driver discovery (stevedore) and device selection.

Drivers are entry points in the group ``omni_backends.drivers`` whose object
is a :class:`~omni_backends.backend.Backend` subclass. Discovery loads them
through ``stevedore.ExtensionManager`` with an ``on_load_failure_callback``
that records every failure (nothing is swallowed: ``devices`` shows it, and
selecting that driver re-raises it as :class:`DriverLoadError` with the
original exception and traceback chained). ``importlib.metadata`` is the
source of truth for what is installed: a corrupt or stale stevedore
entry-point cache is detected, bypassed and reported in the notes. A name
claimed by two distributions, an object that is not a ``Backend`` subclass,
or a driver without :data:`~omni_backends.backend.INTERFACE_VERSION` is
recorded as the driver's problem and refused.

Selection precedence (first that applies decides):

1. an explicit name (``select(device=...)``, the CLI's ``--device``);
   if ``OMNI_BACKENDS_DEVICE`` names another driver, the report notes that
   the flag overrides it;
2. ``OMNI_BACKENDS_DEVICE`` in the environment;
3. auto-detect: probe every loaded driver; among the *usable* ones the
   highest ``priority`` wins; equal priorities break by name (alphabetical),
   and the report says a tie was broken. A driver whose vendor package
   imports but sees no device is not usable.

Names and aliases are case-insensitive (``ascend`` = ``npu``). ``auto`` as
an explicit name means rule 3 (and overrides the variable); so does an empty
or blank explicit name (``--device ""``), and an empty or blank variable is
the same as an unset one: empty means auto everywhere.

Packaging metadata is read as it is found in the wild
(:mod:`omni_backends.entry_points`): every ``.dist-info`` / ``.egg-info``
record on ``sys.path``, so a stale egg-info never shadows the installed
dist-info and records that disagree are refused naming each path; a
stevedore cache whose targets differ from the installed metadata is
bypassed; an entry point whose class's ``name`` differs from it is refused
naming both. The selection is
made once per process under a lock; later calls from any thread return the
same result and driver instance, a call asking for a different driver
raises, and a call from inside a selection (a driver's probe or constructor)
raises instead of recursing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import threading
import traceback
from typing import Any, Iterator, Mapping

from omni_backends.backend import INTERFACE_VERSION, Backend, ProbeResult, ProbeState
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
    #: the distribution's metadata records on sys.path disagree (see omni_backends.entry_points)
    conflict: str | None = None

    @property
    def loaded(self) -> bool:
        return (self.cls is not None and self.load_error is None and not self.duplicate_of and not self.incompatible
                and not self.conflict)


@dataclasses.dataclass
class Candidate:
    """One driver's state in a selection report."""

    name: str
    distribution: str | None
    priority: int | None
    probe: ProbeResult | None
    problem: str | None = None  # load failure / duplicate / incompatible
    verification: list[str] = dataclasses.field(default_factory=list)

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
        import hashlib  # lazily: loading OpenSSL costs ~10 ms of every `devices` start-up

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
        """The selection as text: the choice, the rule and reason, notes, then every candidate
        (name, state or problem, priority, reason)."""
        lines = [f"selected: {self.name}  (rule: {self.rule})", f"  why: {self.reason}"]
        lines += [f"  note: {n}" for n in self.notes]
        width = max((len(c.name) for c in self.candidates), default=0)
        lines.append("  candidates:")
        for c in self.candidates:
            state = "error" if c.problem else (c.probe.state.value if c.probe else "not loaded")
            why = c.problem or (c.probe.reason if c.probe else "")
            prio = "-" if c.priority is None else str(c.priority)
            mark = "*" if c.name == self.name else " "
            lines.append(f"  {mark} {c.name:<{width}}  {state:<13}  priority {prio:>4}  {why}")
        return "\n".join(lines)


# --------------------------------------------------------------- discovery
def _entry_points_with_dists(records: Any = None) -> dict[str, list[tuple[str, str | None]]]:
    """name -> [(entry-point value, distribution name)] from every metadata record
    (:func:`omni_backends.entry_points.driver_records`: a stale ``.egg-info`` never
    shadows the installed ``.dist-info``)."""
    from omni_backends.entry_points import driver_records

    records = records if records is not None else driver_records(NAMESPACE)
    out: dict[str, list[tuple[str, str | None]]] = {}
    for name, found in records.entry_points.items():
        targets = out.setdefault(name, [])
        for ep, dist in found:
            if (ep.value, dist) not in targets:
                targets.append((ep.value, dist))
    return out


def _load_direct(eps: Any, failures: dict[str, tuple[BaseException, str]],
                 values: dict[str, str] | None = None) -> dict[str, Any]:
    """Load entry points with ``EntryPoint.load()``; failures are recorded, never swallowed."""
    plugins: dict[str, Any] = {}
    for ep in eps:
        if values is not None:
            values[ep.name] = ep.value
        try:
            plugins[ep.name] = ep.load()
        except Exception as exc:  # recorded with its traceback
            failures[ep.name] = (exc, traceback.format_exc())
    return plugins


def load_plugins(
    failures: dict[str, tuple[BaseException, str]], namespace: str = NAMESPACE, values: dict[str, str] | None = None
) -> tuple[dict[str, Any], str | None]:
    """Load every entry point of ``namespace`` through stevedore; returns ``({name: plugin}, problem or None)``.

    Load failures go into ``failures`` (name -> (exception, formatted traceback));
    ``values``, if given, receives the target (``module:attr``) each name was loaded from.

    stevedore reads entry points through its on-disk cache
    (``$XDG_CACHE_HOME/python-entrypoints``; never written for interpreters
    under ``/tmp``). Garbage JSON there stevedore rebuilds itself; undecodable
    bytes or valid JSON of the wrong shape make ``ExtensionManager`` raise. A
    corrupt or unusable cache must not break discovery, so then the entry
    points are read from ``importlib.metadata`` and loaded directly.
    """
    from stevedore import ExtensionManager

    def on_failure(_manager: Any, entry_point: Any, exc: BaseException) -> None:
        failures[entry_point.name] = (exc, traceback.format_exc())
        if values is not None:
            values[entry_point.name] = entry_point.value

    try:
        mgr = ExtensionManager(
            namespace=namespace,
            invoke_on_load=False,
            on_load_failure_callback=on_failure,
            propagate_map_exceptions=True,
        )
        if values is not None:
            values.update({ext.name: ext.entry_point.value for ext in mgr.extensions})
        return {ext.name: ext.plugin for ext in mgr.extensions}, None
    except Exception as exc:  # corrupt cache contents stevedore cannot parse, or a driver raising AssertionError
        problem = (
            f"stevedore could not list the {namespace} entry points ({type(exc).__name__}: {exc}); its "
            f"entry-point cache in {_stevedore_cache_dir()} is probably corrupt (delete it). Entry points were "
            f"read directly."
        )
        log.warning(problem)
        failures.clear()
        return _load_direct(importlib.metadata.entry_points(group=namespace), failures, values), problem


def _stevedore_cache_dir() -> str:
    try:
        from stevedore import _cache

        return str(_cache._c._dir)
    except Exception:  # private API moved: say where it usually is
        return "~/.cache/python-entrypoints"


def _interface_problem(plugin: Any, value: str, dists: list[str], name: str | None = None) -> str | None:
    """Why a loaded entry-point object is not a usable driver class, or None.

    With ``name`` (the entry point's name) a class whose ``name`` differs
    (case-insensitively) is refused naming both: ``--device`` values, reports
    and worker processes all use one name per driver."""
    if not (isinstance(plugin, type) and issubclass(plugin, Backend)):
        return f"entry point {value!r} is not a Backend subclass (got {plugin!r}); fix the distribution {', '.join(dists)}"
    identity = {"name": str, "device_type": str, "dist_backend": str, "priority": int, "vllm_device_type": str}
    bad = [f"{attr} (got {getattr(plugin, attr, 'nothing')!r})" for attr, kind in identity.items()
           if not isinstance(getattr(plugin, attr, None), kind) or isinstance(getattr(plugin, attr, None), bool)]
    if not hasattr(plugin, "visible_devices_env"):
        bad.append("visible_devices_env (got nothing)")
    if bad:
        return (
            f"driver class {plugin.__qualname__} lacks a valid identity: {', '.join(bad)}; see "
            f"omni_backends.backend.Backend for the required class attributes. Fix the distribution {', '.join(dists)}"
        )
    if name is not None and plugin.name.strip().lower() != name.strip().lower():
        return (
            f"entry point {name!r} ({value}) loads driver class {plugin.__qualname__} whose name is {plugin.name!r}; "
            f"a driver's entry-point name must equal its class's name. Fix the distribution {', '.join(dists)} "
            f"(register it as {plugin.name} = {value}), or delete {_stevedore_cache_dir()} if its cache is stale"
        )
    versions = getattr(plugin, "interface_versions", ())
    if not (isinstance(versions, (tuple, list)) and all(isinstance(v, int) for v in versions)):
        return (
            f"driver class {plugin.__qualname__} declares interface_versions={versions!r}; it must be a tuple "
            f"of ints such as ({INTERFACE_VERSION},). Fix the distribution {', '.join(dists)}"
        )
    if INTERFACE_VERSION not in versions:
        return (
            f"driver implements Backend interface version(s) {list(versions)} but this omni-backends speaks "
            f"version {INTERFACE_VERSION}; install a release of {', '.join(dists)} built for interface "
            f"version {INTERFACE_VERSION}, or an omni-backends that speaks {list(versions)}"
        )
    return None


def discover() -> tuple[dict[str, DriverEntry], list[str]]:
    """Find and load every installed driver.

    Returns ``(entries by name, notes)``. Load failures, duplicate names and
    incompatible interface versions are recorded on the entries, not raised.
    ``importlib.metadata`` is the source of truth for which drivers are
    installed: a driver stevedore's (stale) cache does not list, or maps to
    another target than the installed metadata, is loaded directly, a cached
    one no distribution declares is ignored, and a note says so. Every
    metadata record on ``sys.path`` is read (:mod:`omni_backends.entry_points`):
    a stale ``.egg-info`` next to the installed ``.dist-info`` is ignored with
    a note; records that disagree otherwise are refused, naming each path.
    """
    from omni_backends.entry_points import driver_records

    records = driver_records(NAMESPACE)
    notes: list[str] = list(records.notes)
    declared = _entry_points_with_dists(records)
    failures: dict[str, tuple[BaseException, str]] = {}
    values: dict[str, str] = {}
    loaded, cache_problem = load_plugins(failures, values=values)
    if cache_problem:
        notes.append(cache_problem)
    missing = [n for n in declared if n not in loaded and n not in failures]
    phantom = sorted(n for n in {*loaded, *failures} if n not in declared and n not in records.conflicts)
    # loaded from another target than the one metadata record chosen declares: stevedore's cache with wrong or
    # swapped targets, or stevedore reading the stale record
    retarget = sorted(n for n, targets in declared.items()
                      if len(targets) == 1 and n in values and values[n] != targets[0][0])
    if retarget:
        notes.append(
            "stevedore's entry-point cache (or a stale metadata record) points driver(s) elsewhere than the installed "
            "metadata: " + "; ".join(f"{n} = {values[n]} (installed: {declared[n][0][0]})" for n in retarget)
            + f"; loaded the installed targets. Delete {_stevedore_cache_dir()} to refresh the cache."
        )
        for name in retarget:
            loaded.pop(name, None)
            failures.pop(name, None)
        loaded.update(_load_direct([ep for n in retarget for ep, _ in records.entry_points[n]], failures))
    if missing or phantom:
        notes.append(
            "stevedore's entry-point cache is stale ("
            + "; ".join(
                part
                for part in (
                    f"missing installed driver(s) {', '.join(sorted(missing))}" if missing else "",
                    f"lists driver(s) no installed distribution declares: {', '.join(phantom)}" if phantom else "",
                )
                if part
            )
            + f"); used the installed metadata instead. Delete {_stevedore_cache_dir()} to refresh it."
        )
        for name in phantom:
            loaded.pop(name, None)
            failures.pop(name, None)
        eps = [ep for n in missing for ep, _ in records.entry_points[n]]
        loaded.update(_load_direct(eps, failures))

    entries: dict[str, DriverEntry] = {}
    for name, conflict in records.conflicts.items():
        if name not in declared:
            entries[name] = DriverEntry(name=name, value="?", distribution=conflict.split(" has ")[0].removeprefix(
                "distribution "), conflict=conflict)
    for name, targets in declared.items():
        value, dist = targets[0]
        dists = sorted({d or "?" for _, d in targets})
        entry = DriverEntry(name=name, value=value, distribution=", ".join(dists))
        if len(targets) > 1:  # ambiguous: neither class is trusted (which one loaded is arbitrary)
            entry.duplicate_of = [f"{d} ({v})" for v, d in targets]
            entries[name] = entry
            continue
        if name in failures:
            entry.load_error, entry.load_traceback = failures[name]
        elif name in loaded:
            plugin = loaded[name]
            entry.incompatible = _interface_problem(plugin, value, dists, name)
            if entry.incompatible is None:
                entry.cls = plugin
        entries[name] = entry
    return entries, notes


def problem_of(entry: DriverEntry) -> str | None:
    """One sentence on why a discovered driver cannot be used at all, or None."""
    if entry.conflict:
        return entry.conflict
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
    table: dict[str, str] = {}
    for name, entry in entries.items():
        if entry.cls is not None:
            for alias in entry.cls.aliases:
                table.setdefault(alias.strip().lower(), name)
    return table


def resolve_name(name: str, entries: dict[str, DriverEntry], *, source: str = "--device") -> str:
    """Canonical driver name for a typed name or alias (case-insensitive, surrounding blanks ignored).

    ``source`` names where the value came from, for the error message.
    Raises :class:`UnknownDeviceError` listing the installed names and aliases.
    """
    key = name.strip().lower()
    by_lower = {n.lower(): n for n in entries}
    if key in by_lower:
        return by_lower[key]
    aliases = _aliases(entries)
    if key in aliases:
        return aliases[key]
    known = sorted(entries) + sorted(f"{a} (= {t})" for a, t in aliases.items())
    raise UnknownDeviceError(
        f"unknown device {name!r} (from {source}). Installed drivers: {', '.join(known) or 'none'}. "
        f"Use one of them or 'auto' in {source}, or install the driver's distribution."
    )


# --------------------------------------------------------------- selection
_lock = threading.RLock()
_selected: Selection | None = None
_selecting = threading.local()


@contextlib.contextmanager
def _selection_in_progress() -> Iterator[None]:
    """Mark this thread as selecting: driver code run meanwhile (probes,
    constructors) that calls :func:`select` gets an error, not a recursion."""
    previous = getattr(_selecting, "active", False)
    _selecting.active = True
    try:
        yield
    finally:
        _selecting.active = previous


def safe_probe(cls: type[Backend]) -> ProbeResult:
    """``cls.probe()``, turning a probe that breaks its never-raise promise into a
    not-usable :class:`ProbeResult` carrying the traceback."""
    try:
        with _selection_in_progress():
            result = cls.probe()
        if isinstance(result, ProbeResult):
            return result
        problem, error = f"probe() returned {type(result).__name__}, not a ProbeResult", None
    except Exception as exc:  # a third-party probe that raises must not break discovery
        problem, error = f"probe() raised {type(exc).__name__}: {exc}", traceback.format_exc()
    return ProbeResult(
        ProbeState.INSTALLED,
        f"the driver's {problem}",
        {},
        fix="report this to the driver's distribution (a probe must never raise); or uninstall it",
        error=error,
    )


def _candidates(entries: dict[str, DriverEntry]) -> list[Candidate]:
    out = []
    for name in sorted(entries):
        e = entries[name]
        out.append(
            Candidate(
                name=name,
                distribution=e.distribution,
                priority=e.cls.priority if e.cls is not None else None,
                probe=safe_probe(e.cls) if e.loaded and e.cls is not None else None,
                problem=problem_of(e),
                verification=[v.value for v in e.cls.verification] if e.cls is not None else [],
            )
        )
    return out


def _raise_for_entry(entry: DriverEntry) -> None:
    if entry.conflict:
        raise DuplicateDriverError(f"driver {entry.name!r}: {entry.conflict}")
    if entry.duplicate_of:
        raise DuplicateDriverError(problem_of(entry))
    if entry.load_error is not None:
        raise DriverLoadError(
            f"driver {entry.name!r} ({entry.value}, from {entry.distribution}) failed to import: "
            f"{type(entry.load_error).__name__}: {entry.load_error}. Fix or uninstall that distribution."
        ) from entry.load_error
    if entry.incompatible:
        raise IncompatibleDriverError(f"driver {entry.name!r}: {entry.incompatible}")


def _requested(device: str | None, env: Mapping[str, str], entries: dict[str, DriverEntry], flag_name: str,
               notes: list[str]) -> tuple[str, str | None, str]:
    """Apply the precedence; returns ``(rule, requested name or None for auto, source)``."""
    env_value = (env.get(ENV_DEVICE) or "").strip()
    env_set = bool(env_value) and env_value.lower() != AUTO  # empty or blank = auto, like unset
    if device is not None:
        if not device.strip():  # an empty --device "" means auto, like --device auto
            device = AUTO
        if env_set and not _same_driver(device, env_value, entries):
            notes.append(f"{flag_name}={device.strip()} overrides {ENV_DEVICE}={env_value}")
        if device.strip().lower() == AUTO:
            return "auto-detect", None, flag_name
        return f"explicit {flag_name}", device, flag_name
    if env_set:
        return f"environment {ENV_DEVICE}", env_value, ENV_DEVICE
    return "auto-detect", None, "auto-detect"


def _same_driver(a: str, b: str, entries: dict[str, DriverEntry]) -> bool:
    try:
        return resolve_name(a, entries) == resolve_name(b, entries)
    except UnknownDeviceError:
        return a.strip().lower() == b.strip().lower()


def _decide(
    entries: dict[str, DriverEntry],
    candidates: list[Candidate],
    notes: list[str],
    device: str | None,
    env: Mapping[str, str],
    flag_name: str,
) -> Selection:
    notes = list(notes)
    rule, requested, source = _requested(device, env, entries, flag_name, notes)
    by_name = {c.name: c for c in candidates}

    if requested is not None:
        name = resolve_name(requested, entries, source=source)
        _raise_for_entry(entries[name])
        probe = by_name[name].probe
        assert probe is not None
        typed = requested.strip().lower()
        shown = f"{name!r} (given as {typed!r})" if typed != name else repr(name)
        if not probe.usable:
            from omni_backends.probing import describe_import_failure, vendor_import_failures

            cls = entries[name].cls
            broken = vendor_import_failures({name: cls.vendor_requirements}, {name: cls.vendor_modules}).get(name, [])
            raise DeviceNotUsableError(
                f"device {shown} was requested ({rule}) but is not usable here: {probe.reason.rstrip('.')}."
                + (f" To fix: {probe.fix}." if probe.fix else "")
                + (f" Error: {probe.error.strip().splitlines()[-1]}" if probe.error else "")
                + "".join(f" Its vendor stack fails to import: {describe_import_failure(b)}." for b in broken)
                + f" Or choose another device (`omni-backends devices` lists them).",
                probe=probe,
            )
        reason = f"{name} was requested ({rule}) and probes usable: {probe.reason}"
    else:
        usable = [c for c in candidates if c.probe is not None and c.probe.usable]
        if not usable:
            lines = "; ".join(f"{c.name}: {c.problem or (c.probe.reason if c.probe else '?')}" for c in candidates)
            raise NoUsableDeviceError(
                f"no usable device driver found ({lines or 'no driver is installed'}). Install a vendor stack, "
                f"e.g. `pip install 'omni-backends[cpu]'`, or pick one with --device."
            )
        usable.sort(key=lambda c: (-(c.priority or 0), c.name))
        best = usable[0]
        name = best.name
        ties = [c.name for c in usable if c.priority == best.priority]
        reason = (
            f"{name} has the highest priority ({best.priority}) among usable drivers "
            f"({', '.join(f'{c.name} {c.priority}' for c in usable)})"
        )
        if len(ties) > 1:
            notes.append(f"priority tie between {', '.join(ties)} (all {best.priority}) broken by name: {name}")
        for c in candidates:
            if c.name != name and (c.priority is None or c.priority > (best.priority or 0)):
                why = c.problem or (c.probe.reason if c.probe else "not loaded")
                prio = "" if c.priority is None else f" (priority {c.priority})"
                notes.append(f"{c.name}{prio} skipped: {why}")

    cls = entries[name].cls
    assert cls is not None
    versions = dict(by_name[name].probe.versions) if by_name[name].probe else {}
    return Selection(
        name=name, rule=rule, reason=reason, candidates=candidates, notes=notes, versions=versions, driver_cls=cls
    )


def decide(device: str | None = None, *, env: Mapping[str, str] | None = None, flag_name: str = "--device") -> Selection:
    """Pick a driver without binding it. Pure apart from discovery and probing; raises on bad input.

    ``device``: explicit name or alias (case-insensitive), ``"auto"`` (auto-detect
    even if ``OMNI_BACKENDS_DEVICE`` is set) or ``None`` (fall through to the
    variable, then auto-detect). ``env`` defaults to ``os.environ``;
    ``flag_name`` is how the explicit value is named in reports. Raises
    :class:`UnknownDeviceError`, :class:`DeviceNotUsableError`,
    :class:`DriverLoadError` (the import error chained as ``__cause__``),
    :class:`DuplicateDriverError`, :class:`IncompatibleDriverError`,
    :class:`NoUsableDeviceError`.
    """
    entries, notes = discover()
    return _decide(entries, _candidates(entries), notes, device, os.environ if env is None else env, flag_name)


def _instantiate(name: str, cls: type[Backend]) -> Backend:
    """``cls()``, refusing an incomplete (abstract) driver class with a clear message."""
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise IncompatibleDriverError(
            f"driver {name!r} ({cls.__module__}.{cls.__qualname__}) does not implement the Backend interface "
            f"yet (missing: {missing}); it can be probed but not run. Choose another device with --device."
        )
    return cls()


def select(device: str | None = None, *, export: bool = True, flag_name: str = "--device") -> Selection:
    """Select and bind the process's driver once; thread-safe, never re-entered.

    The first call decides (see :func:`decide`) and instantiates the driver;
    later calls (from any thread) return the same :class:`Selection`, whose
    ``backend`` is the one driver instance. A later call that names a
    *different* driver raises :class:`OmniBackendError`; so does a call made
    from inside a selection (a driver's probe or constructor). Before the
    driver is constructed, the vendor packages of the *other* drivers that raise
    on import (``torch_npu`` without CANN) are hidden from this process, so no
    third-party availability check (transformers, accelerate, vLLM) imports them
    on the way (:func:`omni_backends.probing.hide_broken_vendor_packages`; a
    note and a warning say which). With ``export``
    the choice is written to ``OMNI_BACKENDS_DEVICE`` /
    ``OMNI_BACKENDS_SELECTION`` / ``OMNI_BACKENDS_HIDDEN_VENDORS`` and the
    driver's vLLM platform variables, so vLLM worker processes resolve the same
    driver and hide the same packages. Raises what :func:`decide` raises.
    """
    global _selected
    if getattr(_selecting, "active", False):
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
        with _selection_in_progress():
            entries, notes = discover()
            sel = _decide(entries, _candidates(entries), notes, device, os.environ, flag_name)
            assert sel.driver_cls is not None
            _hide_broken_vendors(entries, sel)
            sel.backend = _instantiate(sel.name, sel.driver_cls)
        if export:
            export_selection(sel)
        _selected = sel
        return sel


def vendor_modules_of(entries: dict[str, DriverEntry], exclude: str | None = None) -> dict[str, str | None]:
    """``{top-level vendor module: repair hint or None}`` of every loaded driver but ``exclude``:
    its ``vendor_modules``, the modules of its installed vendor distributions (not the
    base stacks), then :data:`~omni_backends.probing.KNOWN_VENDOR_MODULES` no driver
    claims. The ``exclude`` driver's own modules are left out. Metadata only."""
    from omni_backends.probing import BASE_DISTRIBUTIONS, KNOWN_VENDOR_MODULES, dist_version, top_level_modules

    def own(cls: type[Backend]) -> dict[str, str | None]:
        mods: dict[str, str | None] = dict(cls.vendor_modules)
        for dist in cls.vendor_requirements:
            if dist not in BASE_DISTRIBUTIONS and dist_version(dist) is not None:
                for m in top_level_modules(dist):
                    mods.setdefault(m, None)
        return mods

    out: dict[str, str | None] = {}
    keep_out: set[str] = set()
    for name, entry in sorted(entries.items()):
        if entry.cls is None:
            continue
        if name == exclude:
            keep_out |= set(own(entry.cls))
            continue
        for m, hint in own(entry.cls).items():
            if out.get(m) is None:
                out[m] = hint
    for m in KNOWN_VENDOR_MODULES:
        out.setdefault(m, None)
    return {m: h for m, h in out.items() if m not in keep_out}


def _hide_broken_vendors(entries: dict[str, DriverEntry], sel: Selection) -> None:
    """Hide from this process the vendor packages of the drivers not selected that raise
    on import (:func:`omni_backends.probing.hide_broken_vendor_packages`), so that no
    third-party availability check imports them; a worker process applies its parent's
    record (``OMNI_BACKENDS_HIDDEN_VENDORS``) instead of checking again. Each hidden
    package is a note on the selection and one warning."""
    from omni_backends.probing import (
        ENV_HIDDEN,
        apply_hidden_vendor_packages,
        describe_import_failure,
        hide_broken_vendor_packages,
    )

    if ENV_HIDDEN in os.environ:
        hidden = apply_hidden_vendor_packages()
    else:
        hidden = hide_broken_vendor_packages(vendor_modules_of(entries, exclude=sel.name))
        for module, failure in hidden.items():
            if failure.get("package", module) != module:
                continue  # said once, for the package that raised
            note = (f"{module} is hidden from this process (third-party availability checks such as transformers' "
                    f"is_torch_npu_available() see it as not installed) so that the {sel.name} driver runs: "
                    f"{describe_import_failure(failure)}")
            log.warning("omni-backends: warning: %s", note)
    for module, failure in hidden.items():
        sel.notes.append(f"{module} hidden from this process: importable: no — {failure.get('error')}")


def export_selection(sel: Selection, env: dict[str, str] | None = None) -> dict[str, str]:
    """Write the selection into ``env`` (default ``os.environ``) for child processes.

    Sets ``OMNI_BACKENDS_DEVICE``, ``OMNI_BACKENDS_SELECTION`` (name, versions,
    fingerprint), ``OMNI_BACKENDS_HIDDEN_VENDORS`` (the vendor packages this process
    hid because they raise on import, so workers hide them too; when there are
    any, ``omni_backends/hide_site`` goes first on ``PYTHONPATH``: its
    ``sitecustomize`` hides them in fresh interpreters that do not import
    omni_backends first) and the driver's ``vllm_platform_env()``. Returns what
    was set.
    """
    from omni_backends.probing import ENV_HIDDEN, hidden_vendor_packages

    env = os.environ if env is None else env
    values = {
        ENV_DEVICE: sel.name,
        ENV_SELECTION: json.dumps({"name": sel.name, "versions": sel.versions, "fingerprint": sel.fingerprint}),
        ENV_HIDDEN: json.dumps(hidden_vendor_packages()),
    }
    if hidden_vendor_packages():  # fresh interpreters vLLM starts itself hide them at start-up too
        shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hide_site")
        path = [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p and p != shim]
        values["PYTHONPATH"] = os.pathsep.join([shim, *path])
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


#: Top-level modules a report must never import (vendor stacks, and torch itself).
HEAVY_MODULES = ("torch", "vllm", "vllm_ascend", "torch_npu", "intel_extension_for_pytorch", "triton")


class _RefuseImports(importlib.abc.MetaPathFinder):
    """Refuses *new* imports of ``HEAVY_MODULES`` in one thread (other threads are unaffected)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.refused: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if threading.get_ident() == self.thread and fullname.partition(".")[0] in HEAVY_MODULES:
            self.refused.append(fullname)
            raise ImportError(f"{fullname} is not imported while reporting", name=fullname)
        return None


def cheap_capabilities(cls: type[Backend]) -> tuple[dict[str, Any] | None, str | None]:
    """``(cls().capabilities().to_json(), None)`` if that is cheap, else ``(None, why not)``.

    Cheap means: the class is complete (not abstract), and constructing it and
    asking for its capabilities imports none of :data:`HEAVY_MODULES` that is
    not already imported (such imports are refused while it runs, in this
    thread only) and calls no :func:`select`. Never raises.
    """
    if inspect.isabstract(cls):
        return None, "driver class is incomplete (identity and probe only)"
    guard = _RefuseImports()
    sys.meta_path.insert(0, guard)
    try:
        with _selection_in_progress():
            caps = cls().capabilities()
        return caps.to_json(), None
    except ImportError as exc:
        if guard.refused:
            return None, f"needs {guard.refused[0]} (not imported for a report)"
        return None, f"ImportError: {exc}"
    except Exception as exc:  # a driver's constructor is not cheap or is broken: report, do not fail
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        sys.meta_path.remove(guard)


def devices_report(device: str | None = None, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every installed driver's state plus which would be selected and why (JSON-able).

    Discovers and probes once. Per driver: name, distribution, priority, probe
    (state, reason, versions, fix, error), problem (load failure / duplicate /
    incompatible), verification, identity, capabilities (when
    :func:`cheap_capabilities` can get them, else ``capabilities_skipped``)
    and the load traceback. ``selection`` is :meth:`Selection.to_json` without
    the candidates (they are ``drivers``), or ``{"selected": None, "error": ...}``.
    Never binds a driver and imports no vendor stack.
    """
    from omni_backends.probing import KNOWN_VENDOR_MODULES, describe_import_failure, vendor_import_failures

    entries, notes = discover()
    candidates = _candidates(entries)
    # the vendor's own error for the vendor packages (installed, or findable on sys.path) of drivers that are
    # not usable, and for known accelerator extensions no driver claims (one subprocess, only when there are
    # such packages): a broken torch_npu is shown as what it is
    unusable = [c.name for c in candidates if c.probe is not None and not c.probe.usable and entries[c.name].cls]
    claimed = {m for e in entries.values() if e.cls is not None for m in e.cls.vendor_modules}
    other = "(no driver)"
    broken = vendor_import_failures(
        {**{n: entries[n].cls.vendor_requirements for n in unusable}, other: ()},
        {**{n: entries[n].cls.vendor_modules for n in unusable},
         other: {m: None for m in KNOWN_VENDOR_MODULES if m not in claimed}})
    unclaimed = broken.pop(other, [])
    for failure in {b.get("package"): b for fails in broken.values() for b in fails if b.get("autoload")}.values():
        notes = [*notes, f"`import torch` fails for every driver: {describe_import_failure(failure)}"]
    for failure in {b.get("package"): b for fails in [*broken.values(), unclaimed] for b in fails
                    if not b.get("autoload") and not b.get("check_failed")}.values():
        notes = [*notes, f"{failure.get('package')} raises when imported ({failure.get('error')}): a run on another "
                         f"device hides it from that process, so third-party availability checks (transformers, "
                         f"accelerate, vLLM) see it as not installed"]
    out: dict[str, Any] = {"interface_version": INTERFACE_VERSION, "notes": notes, "drivers": []}
    for c in candidates:
        d = c.to_json()
        e = entries[c.name]
        d["vendor_import_errors"] = broken.get(c.name, [])
        if e.cls is not None:
            d["identity"] = e.cls.identity()
            d["capabilities"], d["capabilities_skipped"] = cheap_capabilities(e.cls)
        if e.load_traceback:
            d["traceback"] = e.load_traceback
        out["drivers"].append(d)
    try:
        sel = _decide(entries, candidates, notes, device, os.environ if env is None else env, "--device")
        out["selection"] = sel.to_json()
        del out["selection"]["candidates"]
    except OmniBackendError as exc:
        out["selection"] = {"selected": None, "error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__}
        if isinstance(exc, DriverLoadError) and exc.__cause__ is not None:
            out["selection"]["traceback"] = "".join(traceback.format_exception(exc.__cause__))
    return out


def verify_worker_selection(env: dict[str, str] | None = None) -> Selection:
    """In a vLLM worker process: select the parent's driver and check it matches.

    Reads ``OMNI_BACKENDS_SELECTION`` written by the parent. Raises
    :class:`OmniBackendError` naming both sides if this process resolves a
    different driver or different vendor versions.
    """
    env = os.environ if env is None else env
    raw = env.get(ENV_SELECTION)
    try:
        parent = json.loads(raw) if raw else None
        if parent is not None and not (isinstance(parent, dict) and {"name", "fingerprint"} <= parent.keys()):
            raise ValueError("expected an object with name, versions and fingerprint")
    except ValueError as exc:
        raise OmniBackendError(
            f"{ENV_SELECTION} holds no valid selection from the parent process ({exc}): {raw[:200]!r}. It is "
            f"written by omni_backends.select() in the parent; unset it to let this process select on its own."
        ) from exc
    try:
        sel = select(parent["name"] if parent else None, export=False, flag_name=ENV_SELECTION)
    except OmniBackendError as exc:  # this rank cannot run the parent's driver: say both sides
        if not parent:
            raise
        raise OmniBackendError(
            f"worker process cannot use the driver the parent selected, {parent['name']!r} (versions "
            f"{parent.get('versions')}, fingerprint {parent['fingerprint']}); in this worker: {exc}"
        ) from exc
    if parent and (parent["name"] != sel.name or parent["fingerprint"] != sel.fingerprint):
        raise OmniBackendError(
            f"worker process resolved driver {sel.name!r} (versions {sel.versions}, fingerprint {sel.fingerprint}) "
            f"but the parent selected {parent['name']!r} (versions {parent.get('versions')}, fingerprint "
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
    "cheap_capabilities",
    "devices_report",
    "discover",
    "export_selection",
    "load_plugins",
    "get_backend",
    "resolve_name",
    "safe_probe",
    "select",
    "verify_worker_selection",
]
