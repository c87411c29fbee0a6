"""Entry points as they are found in the wild: every metadata record, not the first.

``importlib.metadata.entry_points()`` keeps one record per distribution name:
the first on ``sys.path``. A stale ``<dist>.egg-info`` left by an old
``setup.py develop`` (often in a source checkout, which ``python -m`` puts
first on ``sys.path`` as the current directory) therefore shadows the fresh
``<dist>-<version>.dist-info`` pip installed, with old driver names or
targets. :func:`driver_records` reads every record of every distribution
that declares entry points in a group and decides, per distribution:

- all records declare the same entry points: no conflict, the first is used;
- they differ and exactly one is a ``.dist-info`` (what pip installs today):
  that one is used, and a note names each stale record with its path;
- they differ otherwise (two ``.dist-info`` in two directories, or only
  ``.egg-info`` records): a conflict, naming every record, its path, version
  and entry points; the registry refuses those driver names.

Reads metadata only; imports nothing.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
from typing import Any


@dataclasses.dataclass
class Record:
    """One metadata record (a ``.dist-info`` or ``.egg-info``) of a distribution."""

    dist: str
    version: str | None
    path: str
    entry_points: dict[str, Any]  # name -> importlib.metadata.EntryPoint (of one group)

    @property
    def kind(self) -> str:
        return "dist-info" if self.path.rstrip(os.sep).endswith(".dist-info") else (
            "egg-info" if ".egg-info" in os.path.basename(self.path.rstrip(os.sep)) else "metadata")

    def targets(self) -> dict[str, str]:
        return {n: ep.value for n, ep in sorted(self.entry_points.items())}

    def describe(self) -> str:
        eps = ", ".join(f"{n} = {v}" for n, v in self.targets().items()) or "no entry points"
        return f"{self.path} ({self.kind}, version {self.version or '?'}: {eps})"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record(dist: Any, group: str) -> Record | None:
    eps = {ep.name: ep for ep in dist.entry_points if ep.group == group}
    if not eps:
        return None
    path = getattr(dist, "_path", None)
    path = str(path) if path is not None else str(dist.locate_file(""))
    try:
        version = dist.version
    except Exception:  # a record without a Version field
        version = None
    return Record(dist=dist.metadata["Name"] or "?", version=version, path=os.path.abspath(path), entry_points=eps)


@dataclasses.dataclass
class Records:
    """What :func:`driver_records` found: the entry points to use, notes, conflicts."""

    #: name -> [(EntryPoint, distribution)], from the record chosen for each distribution
    entry_points: dict[str, list[tuple[Any, str]]]
    #: stale records ignored, one sentence each
    notes: list[str]
    #: driver name -> one sentence naming every conflicting record of its distribution
    conflicts: dict[str, str]


def driver_records(group: str) -> Records:
    """Every record of every distribution declaring entry points in ``group`` (see module doc)."""
    by_dist: dict[str, list[Record]] = {}
    seen_paths: set[str] = set()
    for dist in importlib.metadata.distributions():
        rec = _record(dist, group)
        if rec is None or rec.path in seen_paths:  # the same directory reached twice through sys.path
            continue
        seen_paths.add(rec.path)
        by_dist.setdefault(_normalize(rec.dist), []).append(rec)
    eps: dict[str, list[tuple[Any, str]]] = {}
    notes: list[str] = []
    conflicts: dict[str, str] = {}
    for records in by_dist.values():
        chosen = records[0]
        if len({tuple(r.targets().items()) for r in records}) > 1:
            fresh = [r for r in records if r.kind == "dist-info"]
            if len(fresh) == 1:
                chosen = fresh[0]
                stale = [r for r in records if r is not chosen]
                notes.append(
                    f"distribution {chosen.dist} has stale metadata on sys.path: "
                    + "; ".join(r.describe() for r in stale)
                    + f". Used the installed record {chosen.describe()}. Delete the stale record(s) (left by an old "
                    f"`setup.py develop` or egg install)."
                )
            else:
                msg = (
                    f"distribution {records[0].dist} has {len(records)} conflicting metadata records on sys.path: "
                    + "; ".join(r.describe() for r in records)
                    + f". Keep one: `pip uninstall {records[0].dist}` until none is left, delete leftover "
                    f".egg-info / .dist-info directories listed here, then reinstall."
                )
                for r in records:
                    for name in r.entry_points:
                        conflicts[name] = msg
                continue
        for name, ep in chosen.entry_points.items():
            eps.setdefault(name, []).append((ep, chosen.dist))
    return Records(entry_points=eps, notes=notes, conflicts=conflicts)
