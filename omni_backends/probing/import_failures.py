"""Diagnosing an exception caused by a package that raised while being imported.

A vendor package that is installed but raises on import (``torch_npu``
without CANN: ``OSError: libhccl.so ...``) is reached by code that is not
ours: torch imports every ``torch.backends`` entry point at ``import torch``
(unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), and transformers'
``is_torch_npu_available()`` (called while ``import vllm`` imports
transformers) imports ``torch_npu`` whenever it is findable. The resulting
exception surfaces far from its cause (e.g. as an unreadable weight file):
:func:`find_import_failure` finds the package in the exception chain,
:func:`vendor_import_error` turns it into one
:class:`~omni_backends.errors.VendorImportError` naming it, and
:func:`blame_import_failures` re-raises inside its block that way.
Reads tracebacks and distribution metadata only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import traceback
from typing import Any, Iterator, Mapping

from omni_backends.probing.host import dist_version, distribution_of

#: Accelerator extensions that third-party code imports whenever they are *findable*: transformers'
#: ``is_torch_npu_available`` / ``is_torch_mlu_available`` / ``is_torch_musa_available`` /
#: ``is_torch_xla_available`` / ``is_torch_hpu_available`` (``import vllm`` calls the npu one), its
#: ``_is_package_available(..., return_version=True)`` (imports a package that has no metadata),
#: accelerate's twins, vLLM's platform probes. Drivers add theirs through ``Backend.vendor_modules``.
KNOWN_VENDOR_MODULES: tuple[str, ...] = (
    "torch_npu", "vllm_ascend", "intel_extension_for_pytorch", "oneccl_bindings_for_pytorch",
    "torch_mlu", "torch_musa", "torch_xla", "habana_frameworks",
)
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


def describe_import_failure(found: Mapping[str, Any]) -> str:
    """One sentence for an :meth:`ImportFailure.to_json` dict (or ``{"package", "error"}``)."""
    if "path" not in found:
        return f"{found.get('package')}: {found.get('error')}"
    return ImportFailure(**{k: found.get(k) for k in ImportFailure.__dataclass_fields__}).message()


__all__ = [
    "KNOWN_VENDOR_MODULES",
    "ImportFailure",
    "blame_import_failures",
    "describe_import_failure",
    "find_import_failure",
    "vendor_import_error",
]
