"""Patch: vLLM-Omni's ``vllm_omni.platforms._current_omni_platform`` -- set to the selected driver's platform.

- What: :func:`install_omni_platform` sets the private module global ``_current_omni_platform`` of
  ``vllm_omni.platforms`` (loaded bare, ``core.models.vllm_omni``), while it is still ``None``, to the host
  platform the core builds for the selected driver (``core.models.vllm_omni.host_omni_platform``).
- Why: vLLM-Omni's model code asks ``vllm_omni.platforms.current_omni_platform`` (a lazy module ``__getattr__``
  that fills that global on first use) for device facts (inductor support, the talker MTP's graph capture,
  ``synchronize``); left to itself it resolves one of vLLM-Omni's own platform plugins by probing CUDA / ROCm /
  NPU / XPU, not the driver this process selected, so on any other driver (and on cpu) its models would ask the
  wrong platform. Its ``__setattr__`` for ``current_omni_platform`` only works on the package object, which
  the bare loader does not run.
- Versions: vLLM-Omni 0.30 (the global and the lazy ``__getattr__`` reading it).
- Until: vLLM-Omni resolves its platform from vLLM's ``current_platform`` or lets an out-of-tree platform
  register itself (a plugin group for ``OmniPlatform``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from omni_backends.binding import Patch, VendorSymbol

#: the module global the lazy platform lookup fills and returns
OMNI_PLATFORM_GLOBAL = VendorSymbol("vllm_omni.platforms", "_current_omni_platform", kind="attribute",
                                    dist="vllm-omni")
#: the lazy lookup returns the global when it is set (it resolves a plugin only while it is ``None``)
OMNI_PLATFORM_LOOKUP = VendorSymbol("vllm_omni.platforms", "__getattr__", params=("name",), required=("name",),
                                    dist="vllm-omni",
                                    mentions=("current_omni_platform", "_current_omni_platform is None"))

PATCH = Patch.declare(__name__, __doc__, (OMNI_PLATFORM_GLOBAL, OMNI_PLATFORM_LOOKUP))


def install_omni_platform(platforms: ModuleType, make: Callable[[], Any]) -> None:
    """``platforms._current_omni_platform = make()`` on ``vllm_omni.platforms`` unless one is set already
    (a process loads vLLM-Omni's modules for one driver)."""
    if platforms._current_omni_platform is None:
        platforms._current_omni_platform = make()
