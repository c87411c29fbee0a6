"""The vendor modules of the installed drivers, and hiding those of the drivers not selected that raise on import.

A vendor package that is installed but raises on import (``torch_npu``
without CANN) stops a run on another device when third-party code imports
it (transformers' ``is_torch_npu_available()``, reached by ``import vllm``).
``select()`` therefore hides those of the *other* drivers from the process
(:func:`hide_other_vendors`, through
:func:`omni_backends.probing.hide_broken_vendor_packages`). Metadata and one
subprocess only; nothing here imports a vendor stack.
"""

from __future__ import annotations

import logging
import os

from omni_backends.backend import Backend
from omni_backends.registry.results import DriverEntry, Selection

log = logging.getLogger("omni_backends.registry")


def vendor_modules_of(entries: dict[str, DriverEntry], exclude: str | None = None) -> dict[str, str | None]:
    """``{top-level vendor module: repair hint or None}`` of every loaded driver but ``exclude``:
    its ``vendor_modules``, the modules of its installed vendor distributions (not the
    base stacks), then :data:`~omni_backends.probing.KNOWN_VENDOR_MODULES` no driver
    claims. The ``exclude`` driver's own modules are left out. Metadata only."""
    from omni_backends.probing import BASE_DISTRIBUTIONS, KNOWN_VENDOR_MODULES, dist_version, top_level_modules

    def own(cls: type[Backend]) -> dict[str, str | None]:
        mods: dict[str, str | None] = dict(cls.vendor_modules)
        for dist in cls.vendor_requirements:
            if dist not in BASE_DISTRIBUTIONS and dist_version(dist) is not None:
                for m in top_level_modules(dist):
                    mods.setdefault(m, None)
        return mods

    out: dict[str, str | None] = {}
    keep_out: set[str] = set()
    for name, entry in sorted(entries.items()):
        if entry.cls is None:
            continue
        if name == exclude:
            keep_out |= set(own(entry.cls))
            continue
        for m, hint in own(entry.cls).items():
            if out.get(m) is None:
                out[m] = hint
    for m in KNOWN_VENDOR_MODULES:
        out.setdefault(m, None)
    return {m: h for m, h in out.items() if m not in keep_out}


def hide_other_vendors(entries: dict[str, DriverEntry], sel: Selection) -> None:
    """Hide from this process the vendor packages of the drivers not selected that raise
    on import (:func:`omni_backends.probing.hide_broken_vendor_packages`), so that no
    third-party availability check imports them; a worker process applies its parent's
    record (``OMNI_BACKENDS_HIDDEN_VENDORS``) instead of checking again. Each hidden
    package is a note on the selection and one warning."""
    from omni_backends.probing import (
        ENV_HIDDEN,
        apply_hidden_vendor_packages,
        describe_import_failure,
        hide_broken_vendor_packages,
    )

    if ENV_HIDDEN in os.environ:
        hidden = apply_hidden_vendor_packages()
    else:
        hidden = hide_broken_vendor_packages(vendor_modules_of(entries, exclude=sel.name))
        for module, failure in hidden.items():
            if failure.get("package", module) != module:
                continue  # said once, for the package that raised
            note = (f"{module} is hidden from this process (third-party availability checks such as transformers' "
                    f"is_torch_npu_available() see it as not installed) so that the {sel.name} driver runs: "
                    f"{describe_import_failure(failure)}")
            log.warning("omni-backends: warning: %s", note)
    for module, failure in hidden.items():
        sel.notes.append(f"{module} hidden from this process: importable: no — {failure.get('error')}")


__all__ = ["hide_other_vendors", "vendor_modules_of"]
