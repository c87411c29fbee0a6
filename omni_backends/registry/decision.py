"""Deciding which driver a process would use: names and aliases, the precedence rules, probing the candidates.

Precedence (first that applies decides):

1. an explicit name (``decide(device=...)``, the CLI's ``--device``);
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

Nothing here binds a driver (that is :mod:`omni_backends.registry.process`).
Driver code run while probing that calls ``select()`` gets an error, not a
recursion (:func:`selection_in_progress`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from typing import Iterator, Mapping

from omni_backends.backend import Backend, ProbeResult, ProbeState
from omni_backends.errors import (
    DeviceNotUsableError,
    DriverLoadError,
    DuplicateDriverError,
    IncompatibleDriverError,
    NoUsableDeviceError,
    UnknownDeviceError,
)
from omni_backends.registry.discovery import discover, problem_of
from omni_backends.registry.results import AUTO, ENV_DEVICE, Candidate, DriverEntry, Selection

_selecting = threading.local()


@contextlib.contextmanager
def selection_in_progress() -> Iterator[None]:
    """Mark this thread as selecting: driver code run meanwhile (probes,
    constructors) that calls ``select()`` gets an error, not a recursion."""
    previous = getattr(_selecting, "active", False)
    _selecting.active = True
    try:
        yield
    finally:
        _selecting.active = previous


def selecting() -> bool:
    """True while this thread runs a selection (a driver's probe or constructor is running)."""
    return getattr(_selecting, "active", False)


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


def safe_probe(cls: type[Backend]) -> ProbeResult:
    """``cls.probe()``, turning a probe that breaks its never-raise promise into a
    not-usable :class:`ProbeResult` carrying the traceback."""
    try:
        with selection_in_progress():
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


def incomplete_class_problem(name: str, cls: type[Backend]) -> str | None:
    """Why ``cls`` cannot run (abstract methods of :class:`Backend` left unimplemented), or None: the one
    sentence ``devices`` reports and ``run`` / ``select`` raise, so both say the same."""
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if not missing:
        return None
    return (f"driver {name!r} ({cls.__module__}.{cls.__qualname__}) does not implement the Backend interface "
            f"yet (missing: {', '.join(missing)}); it can be probed but `run` refuses it. Implement the "
            f"missing method(s), or choose another device with --device.")


def probe_candidates(entries: dict[str, DriverEntry]) -> list[Candidate]:
    """One :class:`Candidate` per discovered driver (by name), each loaded one probed (:func:`safe_probe`).
    A loaded class with abstract methods left gets ``problem`` (:func:`incomplete_class_problem`): probed
    and listed, never selected."""
    out = []
    for name in sorted(entries):
        e = entries[name]
        out.append(
            Candidate(
                name=name,
                distribution=e.distribution,
                priority=e.cls.priority if e.cls is not None else None,
                probe=safe_probe(e.cls) if e.loaded and e.cls is not None else None,
                problem=problem_of(e) or (incomplete_class_problem(name, e.cls) if e.cls is not None else None),
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


def decide_among(
    entries: dict[str, DriverEntry],
    candidates: list[Candidate],
    notes: list[str],
    device: str | None,
    env: Mapping[str, str],
    flag_name: str,
) -> Selection:
    """:func:`decide` over drivers already discovered (``entries``, ``notes``) and probed
    (``candidates``, from :func:`probe_candidates`), so a report and a selection reuse one
    discovery. Raises what :func:`decide` raises."""
    notes = list(notes)
    rule, requested, source = _requested(device, env, entries, flag_name, notes)
    by_name = {c.name: c for c in candidates}

    if requested is not None:
        name = resolve_name(requested, entries, source=source)
        _raise_for_entry(entries[name])
        if by_name[name].problem:  # a class with abstract methods left: what `run` refuses, `devices` says
            raise IncompatibleDriverError(by_name[name].problem)
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
                + " Or choose another device (`omni-backends devices` lists them).",
                probe=probe,
            )
        reason = f"{name} was requested ({rule}) and probes usable: {probe.reason}"
    else:
        usable = [c for c in candidates if c.probe is not None and c.probe.usable and not c.problem]
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
    return decide_among(entries, probe_candidates(entries), notes, device, os.environ if env is None else env, flag_name)


__all__ = ["decide", "decide_among", "incomplete_class_problem", "probe_candidates", "resolve_name", "safe_probe", "selecting",
           "selection_in_progress"]
