"""omni-backends: one Backend interface for omni-modality model runners on vLLM.

Importing this package imports no vendor stack and no torch.
"""

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
