"""Discovery: the installed drivers, loaded through stevedore and checked against the installed metadata.

Drivers are entry points in the group ``omni_backends.drivers`` whose object
is a :class:`~omni_backends.backend.Backend` subclass. :func:`load_plugins`
loads them through ``stevedore.ExtensionManager`` with an
``on_load_failure_callback`` that records every failure (nothing is
swallowed: ``devices`` shows it, and selecting that driver re-raises it as
:class:`~omni_backends.errors.DriverLoadError` with the original exception
and traceback chained). ``importlib.metadata`` is the source of truth for
what is installed (:mod:`omni_backends.registry.metadata` reads every
record on ``sys.path``): a corrupt or stale stevedore entry-point cache is
detected, bypassed and reported in the notes. A name claimed by two
distributions, an object that is not a ``Backend`` subclass, an entry point
whose class's ``name`` differs from it, or a driver without
:data:`~omni_backends.backend.INTERFACE_VERSION` is recorded as the driver's
problem (:func:`problem_of`) and refused.
"""

from __future__ import annotations

import importlib.metadata
import logging
import traceback
from typing import Any

from omni_backends.backend import INTERFACE_VERSION, Backend
from omni_backends.registry.metadata import driver_records
from omni_backends.registry.results import NAMESPACE, DriverEntry

log = logging.getLogger("omni_backends.registry")


def _entry_points_with_dists(records: Any = None) -> dict[str, list[tuple[str, str | None]]]:
    """name -> [(entry-point value, distribution name)] from every metadata record
    (:func:`omni_backends.registry.metadata.driver_records`: a stale ``.egg-info`` never
    shadows the installed ``.dist-info``)."""
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


def load_declared(namespace: str, records: Any = None) -> tuple[dict[str, Any], dict[str, tuple[BaseException, str]],
                                                                 list[str]]:
    """Load the entry points of ``namespace`` that the installed metadata declares; returns
    ``(plugins by name, load failures by name, notes)``.

    ``importlib.metadata`` is the source of truth (``records``: :func:`omni_backends.registry.metadata.driver_records`
    of ``namespace``, read if not given; a stale ``.egg-info`` never shadows the installed ``.dist-info``):
    stevedore loads first (its cache is fast), then an entry point its (stale) cache does not list, or maps to
    another target than the metadata, is loaded directly, one it lists that no distribution declares is dropped,
    and a note says so. Failures are ``(exception, formatted traceback)``; nothing is raised."""
    records = records if records is not None else driver_records(namespace)
    notes: list[str] = list(records.notes)
    declared = _entry_points_with_dists(records)
    failures: dict[str, tuple[BaseException, str]] = {}
    values: dict[str, str] = {}
    loaded, cache_problem = load_plugins(failures, namespace, values=values)
    if cache_problem:
        notes.append(cache_problem)
    missing = [n for n in declared if n not in loaded and n not in failures]
    phantom = sorted(n for n in {*loaded, *failures} if n not in declared and n not in records.conflicts)
    # loaded from another target than the one metadata record chosen declares: stevedore's cache with wrong or
    # swapped targets, or stevedore reading the stale record
    retarget = sorted(n for n, targets in declared.items()
                      if len(targets) == 1 and n in values and values[n] != targets[0][0])
    what = "driver(s)" if namespace == NAMESPACE else "entry point(s)"
    if retarget:
        notes.append(
            f"stevedore's entry-point cache (or a stale metadata record) points {what} elsewhere than the installed "
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
                    f"missing installed {what} {', '.join(sorted(missing))}" if missing else "",
                    f"lists {what} no installed distribution declares: {', '.join(phantom)}" if phantom else "",
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
    return loaded, failures, notes


def discover() -> tuple[dict[str, DriverEntry], list[str]]:
    """Find and load every installed driver.

    Returns ``(entries by name, notes)``. Load failures, duplicate names and
    incompatible interface versions are recorded on the entries, not raised.
    ``importlib.metadata`` is the source of truth for which drivers are
    installed (:func:`load_declared`): a driver stevedore's (stale) cache does not list, or maps to
    another target than the installed metadata, is loaded directly, a cached
    one no distribution declares is ignored, and a note says so. Every
    metadata record on ``sys.path`` is read (:mod:`omni_backends.registry.metadata`):
    a stale ``.egg-info`` next to the installed ``.dist-info`` is ignored with
    a note; records that disagree otherwise are refused, naming each path.
    """
    records = driver_records(NAMESPACE)
    declared = _entry_points_with_dists(records)
    loaded, failures, notes = load_declared(NAMESPACE, records)

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


__all__ = ["discover", "load_declared", "load_plugins", "problem_of"]
