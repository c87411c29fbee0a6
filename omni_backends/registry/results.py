"""What discovery and selection produce: :class:`DriverEntry`, :class:`Candidate`, :class:`Selection`,
and the names the registry reads from the environment.

Plain data, JSON-able (``to_json``); importing this module imports no vendor stack.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from omni_backends.backend import INTERFACE_VERSION, Backend, ProbeResult

#: entry-point group of the drivers (``[project.entry-points."omni_backends.drivers"]``)
NAMESPACE = "omni_backends.drivers"
#: the device to select when no explicit name is given (empty or blank = auto)
ENV_DEVICE = "OMNI_BACKENDS_DEVICE"
#: JSON of the parent's selection, exported for worker processes.
ENV_SELECTION = "OMNI_BACKENDS_SELECTION"
#: the explicit name that means auto-detect
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
    #: the distribution's metadata records on sys.path disagree (see omni_backends.registry.metadata)
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


__all__ = ["AUTO", "ENV_DEVICE", "ENV_SELECTION", "NAMESPACE", "Candidate", "DriverEntry", "Selection"]
