"""Ascend NPU driver on vllm-ascend (``npu``, alias ``ascend``).

Probing never imports ``torch_npu`` unless an NPU device node exists and the
CANN collective library is found: on a host without CANN, importing
``torch_npu`` raises ``OSError`` (missing ``libhccl.so``), and with torch's
device-backend autoload even ``import torch`` fails while torch_npu is
installed (``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` avoids that).
"""

from __future__ import annotations

import os
from typing import ClassVar

from omni_backends.backend import Backend, ProbeResult, ProbeState, Verification
from omni_backends.probing import device_nodes, find_shared_library, version_mismatches, versions_of


def cann_dirs() -> list[str]:
    """CANN install roots from the environment variables its set_env.sh exports."""
    roots = [os.environ.get(k) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")]
    return [r for r in roots if r and os.path.isdir(r)]


class AscendBackend(Backend):
    name: ClassVar[str] = "npu"
    aliases: ClassVar[tuple[str, ...]] = ("ascend",)
    device_type: ClassVar[str] = "npu"
    dist_backend: ClassVar[str] = "hccl"
    visible_devices_env: ClassVar[str | None] = "ASCEND_RT_VISIBLE_DEVICES"
    priority: ClassVar[int] = 90
    vendor_requirements: ClassVar[dict[str, str]] = {
        "vllm-ascend": ">=0.23,<0.24",
        "torch-npu": ">=2.10,<2.11",
        "torch": ">=2.10,<2.11",
    }
    verification = (Verification.STATIC, Verification.SIMULATED)
    vllm_device_type: ClassVar[str] = "npu"

    @classmethod
    def probe(cls) -> ProbeResult:
        try:
            versions = versions_of(cls.vendor_requirements)
            nodes = device_nodes("/dev/davinci[0-9]*")
            missing = [d for d in ("vllm-ascend", "torch-npu") if versions.get(d) is None]
            if missing:
                return ProbeResult(
                    ProbeState.NOT_INSTALLED,
                    f"{' and '.join(missing)} not installed; {len(nodes)} Ascend device node(s) in /dev",
                    versions,
                    fix="install Huawei CANN, then pip install 'omni-backends[ascend]'",
                    device_count=len(nodes),
                )
            hccl = find_shared_library("hccl", cann_dirs())
            if hccl is None:
                return ProbeResult(
                    ProbeState.INSTALLED,
                    "torch-npu is installed but CANN's libhccl.so is not found, so importing torch_npu raises "
                    "OSError (and `import torch` fails through backend autoload)",
                    versions,
                    fix="install CANN and `source /usr/local/Ascend/ascend-toolkit/set_env.sh`, or set "
                    "TORCH_DEVICE_BACKEND_AUTOLOAD=0 to keep torch importable",
                )
            problems = version_mismatches(cls.vendor_requirements, versions)
            if problems:
                return ProbeResult(ProbeState.IMPORTABLE, "; ".join(problems), versions,
                                   fix="pip install 'omni-backends[ascend]'")
            if not nodes:
                return ProbeResult(ProbeState.IMPORTABLE, "CANN and torch-npu found but no /dev/davinci* device",
                                   versions, fix="run on an Ascend host with the NPU driver loaded")
            try:
                import torch_npu  # noqa: F401  (the selected vendor stack; only reached on an NPU host)
                import torch

                count = torch.npu.device_count()
            except (OSError, RuntimeError, ImportError) as exc:
                return ProbeResult(ProbeState.INSTALLED, f"importing torch_npu failed: {type(exc).__name__}: {exc}",
                                   versions, fix="check the CANN installation matches torch-npu", error=repr(exc))
            if count == 0:
                return ProbeResult(ProbeState.IMPORTABLE, "torch_npu imports but reports 0 NPUs", versions,
                                   fix="check ASCEND_RT_VISIBLE_DEVICES and the NPU driver")
            return ProbeResult(ProbeState.USABLE, f"{count} Ascend NPU(s); vllm-ascend {versions['vllm-ascend']}",
                               versions, device_count=count)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, error=repr(exc))
