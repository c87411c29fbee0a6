"""Cheap helpers for ``Backend.probe()``, and the diagnosis and hiding of vendor packages that raise on import.

One package, one module per job (each only imports the ones above it):

- :mod:`~omni_backends.probing.host`: package metadata, version gates,
  module specs, device nodes, shared libraries, PCI vendors (what a driver's
  ``probe()`` reads);
- :mod:`~omni_backends.probing.import_failures`: which package an exception
  comes from when a vendor package raised while being imported, and the one
  error naming it (:func:`blame_import_failures`);
- :mod:`~omni_backends.probing.vendor_imports`: importing vendor packages in
  a subprocess (:func:`import_check`, :func:`vendor_import_failures`) and
  hiding the ones that raise from this process
  (:func:`hide_broken_vendor_packages`, :data:`ENV_HIDDEN`).

Nothing here imports a vendor stack or torch in this process. Every name is
importable from ``omni_backends.probing`` as before the split.
"""

from omni_backends.probing.host import (
    BASE_DISTRIBUTIONS,
    device_nodes,
    dist_version,
    distribution_of,
    find_shared_library,
    install_hint,
    module_findable,
    pci_vendor_devices,
    top_level_modules,
    torch_autoload_enabled,
    torch_backend_extensions,
    version_mismatches,
    versions_of,
)
from omni_backends.probing.import_failures import (
    KNOWN_VENDOR_MODULES,
    ImportFailure,
    blame_import_failures,
    describe_import_failure,
    find_import_failure,
    vendor_import_error,
)
from omni_backends.probing.vendor_imports import (
    ENV_HIDDEN,
    apply_hidden_vendor_packages,
    hidden_vendor_packages,
    hide_broken_vendor_packages,
    hide_vendor_module,
    import_check,
    vendor_import_failures,
    vendor_modules_to_check,
)

__all__ = [
    "BASE_DISTRIBUTIONS",
    "ENV_HIDDEN",
    "KNOWN_VENDOR_MODULES",
    "ImportFailure",
    "apply_hidden_vendor_packages",
    "blame_import_failures",
    "describe_import_failure",
    "device_nodes",
    "dist_version",
    "distribution_of",
    "find_import_failure",
    "find_shared_library",
    "hidden_vendor_packages",
    "hide_broken_vendor_packages",
    "hide_vendor_module",
    "import_check",
    "install_hint",
    "module_findable",
    "pci_vendor_devices",
    "top_level_modules",
    "torch_autoload_enabled",
    "torch_backend_extensions",
    "vendor_import_error",
    "vendor_import_failures",
    "vendor_modules_to_check",
    "version_mismatches",
    "versions_of",
]
