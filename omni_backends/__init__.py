"""omni-backends: one Backend interface for omni-modality model runners on vLLM.

Importing this package imports no vendor stack and no torch. In a process
started by one that selected a driver (a vLLM worker), it hides the vendor
packages the parent found raising on import (``OMNI_BACKENDS_HIDDEN_VENDORS``,
see :func:`omni_backends.probing.hide_broken_vendor_packages`) before anything
else can import them.
"""

import os as _os

if _os.environ.get("OMNI_BACKENDS_HIDDEN_VENDORS", "{}") != "{}":
    from omni_backends.probing import apply_hidden_vendor_packages as _apply_hidden

    _apply_hidden()

from omni_backends.backend import INTERFACE_VERSION, Backend, Capabilities, ProbeResult, ProbeState, Verification
from omni_backends.errors import OmniBackendError
from omni_backends.registry import current, get_backend, select

__all__ = [
    "INTERFACE_VERSION",
    "Backend",
    "Capabilities",
    "OmniBackendError",
    "ProbeResult",
    "ProbeState",
    "Verification",
    "current",
    "get_backend",
    "select",
]
__version__ = "0.1.0"
