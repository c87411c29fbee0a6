"""Intel XPU driver on vLLM's XPU platform, native ``torch.xpu``.

Probing reads PCI vendor ids in sysfs (Intel = 0x8086) and ``/dev/dri``
render nodes; it imports neither torch nor IPEX.
"""

from __future__ import annotations

from typing import ClassVar

from omni_backends.backend import Backend, ProbeResult, ProbeState, Verification
from omni_backends.probing import device_nodes, dist_version, pci_vendor_devices, version_mismatches, versions_of


class XpuBackend(Backend):
    name: ClassVar[str] = "xpu"
    device_type: ClassVar[str] = "xpu"
    dist_backend: ClassVar[str] = "xccl"
    visible_devices_env: ClassVar[str | None] = "ZE_AFFINITY_MASK"
    priority: ClassVar[int] = 80
    vendor_requirements: ClassVar[dict[str, str]] = {"vllm": ">=0.33,<0.34", "torch": ">=2.10"}
    verification = (Verification.STATIC, Verification.SIMULATED)
    vllm_device_type: ClassVar[str] = "xpu"

    @classmethod
    def probe(cls) -> ProbeResult:
        try:
            versions = versions_of(cls.vendor_requirements)
            versions["intel-extension-for-pytorch"] = dist_version("intel-extension-for-pytorch")
            cards = pci_vendor_devices("0x8086")
            render = device_nodes("/dev/dri/renderD*")
            count = len(cards) if render else 0
            if versions["vllm"] is None:
                return ProbeResult(
                    ProbeState.NOT_INSTALLED,
                    f"vLLM's XPU build is not installed; {count} Intel GPU(s) seen in sysfs",
                    versions,
                    fix="pip install 'omni-backends[xpu]' (vLLM built for XPU) on a machine with an Intel GPU",
                    device_count=count,
                )
            problems = version_mismatches(cls.vendor_requirements, versions)
            if problems:
                return ProbeResult(ProbeState.IMPORTABLE, "; ".join(problems), versions,
                                   fix="pip install 'omni-backends[xpu]'", device_count=count)
            if count == 0:
                return ProbeResult(ProbeState.IMPORTABLE,
                                   "vLLM is installed but no Intel GPU (PCI vendor 0x8086 with a /dev/dri render node)",
                                   versions, fix="run on a machine with an Intel GPU and the Level Zero driver")
            return ProbeResult(ProbeState.USABLE, f"{count} Intel GPU(s); vLLM {versions['vllm']}", versions,
                               device_count=count)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, error=repr(exc))
