"""The ``devices`` report: every installed driver's state and which one would be selected, without binding one.

:func:`devices_report` discovers and probes once, asks each complete driver
for its capabilities only when that is cheap (:func:`cheap_capabilities`:
no vendor stack nor torch is imported for a report), and names the vendor
packages that raise on import. It never binds a driver.
"""

from __future__ import annotations

import importlib.abc
import inspect
import os
import sys
import threading
import traceback
from typing import Any, Mapping

from omni_backends.backend import INTERFACE_VERSION, Backend
from omni_backends.errors import DriverLoadError, OmniBackendError
from omni_backends.registry.decision import decide_among, probe_candidates, selection_in_progress
from omni_backends.registry.discovery import discover

#: the distribution whose drivers' verification levels this project's CI backs (the README's driver table)
PROJECT_DISTRIBUTION = "omni-backends"

#: Top-level modules a report must never import (vendor stacks, and torch itself).
HEAVY_MODULES = ("torch", "vllm", "vllm_ascend", "torch_npu", "intel_extension_for_pytorch", "triton")


class _RefuseImports(importlib.abc.MetaPathFinder):
    """Refuses *new* imports of ``HEAVY_MODULES`` in one thread (other threads are unaffected)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.refused: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if threading.get_ident() == self.thread and fullname.partition(".")[0] in HEAVY_MODULES:
            self.refused.append(fullname)
            raise ImportError(f"{fullname} is not imported while reporting", name=fullname)
        return None


def cheap_capabilities(cls: type[Backend]) -> tuple[dict[str, Any] | None, str | None]:
    """``(cls().capabilities().to_json(), None)`` if that is cheap, else ``(None, why not)``.

    Cheap means: the class is complete (not abstract), and constructing it and
    asking for its capabilities imports none of :data:`HEAVY_MODULES` that is
    not already imported (such imports are refused while it runs, in this
    thread only) and calls no :func:`select`. Never raises.
    """
    if inspect.isabstract(cls):
        return None, "driver class is incomplete (identity and probe only)"
    guard = _RefuseImports()
    sys.meta_path.insert(0, guard)
    try:
        with selection_in_progress():
            caps = cls().capabilities()
        return caps.to_json(), None
    except ImportError as exc:
        if guard.refused:
            return None, f"needs {guard.refused[0]} (not imported for a report)"
        return None, f"ImportError: {exc}"
    except Exception as exc:  # a driver's constructor is not cheap or is broken: report, do not fail
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        sys.meta_path.remove(guard)


def devices_report(device: str | None = None, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every installed driver's state plus which would be selected and why (JSON-able).

    Discovers and probes once. Per driver: name, distribution, priority, probe
    (state, reason, versions, fix, error), problem (load failure / duplicate /
    incompatible / abstract methods left), verification and ``verification_declared_by`` (``None`` for this
    project's drivers, whose levels its CI backs; else the out-of-tree distribution that declares them), identity, capabilities (when
    :func:`cheap_capabilities` can get them, else ``capabilities_skipped``)
    and the load traceback. ``selection`` is :meth:`~omni_backends.registry.results.Selection.to_json` without
    the candidates (they are ``drivers``), or ``{"selected": None, "error": ...}``.
    Never binds a driver and imports no vendor stack.
    """
    from omni_backends.probing import KNOWN_VENDOR_MODULES, describe_import_failure, vendor_import_failures

    entries, notes = discover()
    candidates = probe_candidates(entries)
    # the vendor's own error for the vendor packages (installed, or findable on sys.path) of drivers that are
    # not usable, and for known accelerator extensions no driver claims (one subprocess, only when there are
    # such packages): a broken torch_npu is shown as what it is
    unusable = [c.name for c in candidates if c.probe is not None and not c.probe.usable and entries[c.name].cls]
    claimed = {m for e in entries.values() if e.cls is not None for m in e.cls.vendor_modules}
    other = "(no driver)"
    broken = vendor_import_failures(
        {**{n: entries[n].cls.vendor_requirements for n in unusable}, other: ()},
        {**{n: entries[n].cls.vendor_modules for n in unusable},
         other: {m: None for m in KNOWN_VENDOR_MODULES if m not in claimed}})
    unclaimed = broken.pop(other, [])
    for failure in {b.get("package"): b for fails in broken.values() for b in fails if b.get("autoload")}.values():
        notes = [*notes, f"`import torch` fails for every driver: {describe_import_failure(failure)}"]
    for failure in {b.get("package"): b for fails in [*broken.values(), unclaimed] for b in fails
                    if not b.get("autoload") and not b.get("check_failed")}.values():
        notes = [*notes, f"{failure.get('package')} raises when imported ({failure.get('error')}): a run on another "
                         f"device hides it from that process, so third-party availability checks (transformers, "
                         f"accelerate, vLLM) see it as not installed"]
    out: dict[str, Any] = {"interface_version": INTERFACE_VERSION, "notes": notes, "drivers": []}
    for c in candidates:
        d = c.to_json()
        e = entries[c.name]
        d["vendor_import_errors"] = broken.get(c.name, [])
        # who stands behind ``verification``: this project's CI for its own drivers; an out-of-tree driver's
        # distribution declares its own levels, which nothing here checks
        d["verification_declared_by"] = None if e.distribution == PROJECT_DISTRIBUTION else e.distribution
        if e.cls is not None:
            d["identity"] = e.cls.identity()
            d["capabilities"], d["capabilities_skipped"] = cheap_capabilities(e.cls)
        if e.load_traceback:
            d["traceback"] = e.load_traceback
        out["drivers"].append(d)
    try:
        sel = decide_among(entries, candidates, notes, device, os.environ if env is None else env, "--device")
        out["selection"] = sel.to_json()
        del out["selection"]["candidates"]
    except OmniBackendError as exc:
        out["selection"] = {"selected": None, "error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__}
        if isinstance(exc, DriverLoadError) and exc.__cause__ is not None:
            out["selection"]["traceback"] = "".join(traceback.format_exception(exc.__cause__))
    return out


__all__ = ["HEAVY_MODULES", "PROJECT_DISTRIBUTION", "cheap_capabilities", "devices_report"]
