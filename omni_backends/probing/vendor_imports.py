"""Importing vendor packages in a fresh interpreter: which raise, and hiding those from this process.

:func:`import_check` imports modules in a subprocess and diagnoses each
failure (:func:`~omni_backends.probing.import_failures.find_import_failure`);
:func:`vendor_import_failures` runs it for the vendor packages of each
driver (the ``devices`` report, a not-usable device's error).

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

import json
import os
import sys
from typing import Any, Iterable, Mapping

from omni_backends.probing.host import (
    BASE_DISTRIBUTIONS,
    dist_version,
    module_findable,
    top_level_modules,
    torch_autoload_enabled,
    torch_backend_extensions,
)
from omni_backends.probing.import_failures import KNOWN_VENDOR_MODULES

#: JSON ``{module: ImportFailure.to_json()}`` of the vendor packages the parent process hid, exported
#: by ``omni_backends.registry.export_selection`` so vLLM's worker processes hide the same ones.
ENV_HIDDEN = "OMNI_BACKENDS_HIDDEN_VENDORS"

_HIDDEN: dict[str, dict[str, Any]] = {}


_IMPORT_CHECK = """
import importlib.util, json, os, sys
from omni_backends.probing.import_failures import find_import_failure
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


__all__ = [
    "ENV_HIDDEN",
    "apply_hidden_vendor_packages",
    "hidden_vendor_packages",
    "hide_broken_vendor_packages",
    "hide_vendor_module",
    "import_check",
    "vendor_import_failures",
    "vendor_modules_to_check",
]
