"""Results of the drift check: findings, per-driver reports, declarations."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from omni_backends.binding import VendorSymbol

#: finding kinds that are drift (non-zero exit).
DRIFT_KINDS = (
    "missing-module",
    "missing-symbol",
    "removed-param",
    "renamed-param",
    "new-required-param",
    "changed-default",
    "import-error",
    "missing-behaviour",
    "changed-layout",
)
#: finding kinds that are reported but are not drift.
NOTE_KINDS = ("not-checked", "unverifiable", "kwargs-only", "guarded-import", "alternative")

VAR_KINDS = ("var_positional", "var_keyword")


# ------------------------------------------------------------------ results
@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a vendor signature (``kind`` as ``inspect.Parameter.kind``, lower-case)."""

    name: str
    kind: str
    default: str | None  # source text of the default; None = required


@dataclasses.dataclass
class Finding:
    """One problem (or note) about one declared symbol."""

    driver: str
    symbol: str  # the driver's variable name, e.g. SET_FORWARD_CONTEXT
    target: str  # module.attr
    kind: str
    message: str
    declared_at: str
    used_at: list[str] = dataclasses.field(default_factory=list)
    vendor_at: str | None = None

    @property
    def drift(self) -> bool:
        return self.kind in DRIFT_KINDS

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["drift"] = self.drift
        return d


@dataclasses.dataclass
class DriverReport:
    driver: str
    symbols: int
    checked: int
    findings: list[Finding]
    #: every declaration with its status, clean ones too (see ``check_declarations``).
    statuses: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def drift(self) -> list[Finding]:
        return [f for f in self.findings if f.drift]

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "symbols": self.symbols,
            "checked": self.checked,
            "drift": len(self.drift),
            "findings": [f.to_json() for f in self.findings],
            "checked_symbols": list(self.statuses),
        }


# ------------------------------------------------- declared symbols per driver
@dataclasses.dataclass(frozen=True)
class Declared:
    """A declaration plus where the driver uses it."""

    name: str
    symbol: VendorSymbol
    used_at: tuple[str, ...]


def rel_path(path: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = os.path.abspath(path)
    return os.path.relpath(ap, root) if ap.startswith(root + os.sep) else ap


def rel_defined_at(defined_at: str) -> str:
    path, _, line = defined_at.rpartition(":")
    return f"{rel_path(path)}:{line}" if path else defined_at
