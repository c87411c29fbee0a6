"""Cheap helpers for ``Backend.probe()``: package metadata, version gates, device files.

Nothing here imports a vendor stack or torch: probing reads distribution
metadata (``importlib.metadata``), module specs (``importlib.util.find_spec``
on top-level names only) and device nodes in ``/dev`` and ``/sys``.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
from typing import Iterable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version


def dist_version(name: str) -> str | None:
    """Installed version of distribution ``name`` or ``None`` if absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions_of(names: Iterable[str]) -> dict[str, str | None]:
    """``{dist: version or None}`` for every name."""
    return {n: dist_version(n) for n in names}


def _release_only(version: str) -> Version:
    """``2.13.0+cpu`` -> ``2.13.0``: drop only the local label, so a local build never
    fails a range check while pre/post/dev parts still count (``0.23.0.post1``)."""
    return Version(Version(version).public)


def version_mismatches(requirements: Mapping[str, str], versions: Mapping[str, str | None]) -> list[str]:
    """Human-readable mismatches between installed ``versions`` and ``requirements``.

    ``requirements`` maps distribution -> PEP 440 specifier (``">=2.13,<2.14"``).
    A missing distribution is a mismatch; an empty list means all satisfied.
    """
    problems: list[str] = []
    for dist, spec in requirements.items():
        got = versions.get(dist)
        if got is None:
            problems.append(f"{dist} is not installed (need {dist}{spec})")
            continue
        try:
            ok = SpecifierSet(spec).contains(_release_only(got), prereleases=True)
        except (InvalidSpecifier, InvalidVersion) as exc:
            problems.append(f"{dist} {got}: cannot check against {spec!r} ({exc})")
            continue
        if not ok:
            problems.append(f"{dist} {got} is installed but {dist}{spec} is required")
    return problems


def module_findable(top_level: str) -> bool:
    """True if a top-level module can be found without importing it."""
    if "." in top_level:
        raise ValueError("module_findable takes a top-level module name only (submodules would import the parent)")
    try:
        return importlib.util.find_spec(top_level) is not None
    except (ImportError, ValueError):
        return False


def device_nodes(pattern: str) -> list[str]:
    """Sorted device nodes matching a glob, e.g. ``/dev/nvidia[0-9]*``."""
    return sorted(glob.glob(pattern))


def find_shared_library(name: str, search_dirs: Iterable[str] = ()) -> str | None:
    """Path of ``lib<name>.so`` in ``search_dirs`` or on the loader path, else ``None``.

    Uses ``ctypes.util.find_library`` (ldconfig cache) as the fallback; loads nothing.
    """
    for d in search_dirs:
        for cand in glob.glob(os.path.join(d, "**", f"lib{name}.so*"), recursive=True):
            return cand
    import ctypes.util

    return ctypes.util.find_library(name)


def pci_vendor_devices(vendor_id: str) -> list[str]:
    """DRM cards whose PCI vendor id is ``vendor_id`` (e.g. ``"0x8086"`` Intel)."""
    found = []
    for path in sorted(glob.glob("/sys/class/drm/card[0-9]*/device/vendor")):
        try:
            with open(path) as f:
                if f.read().strip().lower() == vendor_id.lower():
                    found.append(os.path.dirname(os.path.dirname(path)))
        except OSError:
            continue
    return found


def install_hint(requirements: Mapping[str, str], versions: Mapping[str, str | None]) -> str:
    """``pip install '<dist><spec>' ...`` for every requirement ``versions`` does not meet ("" if none)."""
    bad = [f"'{d}{s}'" for d, s in requirements.items() if version_mismatches({d: s}, versions)]
    return f"pip install {' '.join(bad)}" if bad else ""
