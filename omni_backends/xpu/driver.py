"""Intel XPU driver on vLLM's XPU platform (vLLM 0.33), native ``torch.xpu``.

What differs on XPU, each delegated to the vendor symbol declared below:

- forward context, sampler, ``CpuGpuBuffer`` (pinned), ``CommonAttentionMetadata``:
  upstream vLLM (:class:`~omni_backends.vllm_upstream.VllmUpstreamBackend`);
- graphs: vLLM's ``CUDAGraphWrapper`` over ``torch.xpu.XPUGraph``, only when
  the installed torch supports XPU graphs (vLLM's ``supports_xpu_graph()``,
  torch >= 2.11, and ``torch.xpu.XPUGraph`` present); otherwise
  ``capabilities().static_graph_modes == ()`` and :meth:`XpuBackend.wrap_graph`
  returns the runnable (eager);
- device ops: ``torch.accelerator`` / ``torch.Stream`` / ``torch.Event`` and
  ``torch.xpu`` (:class:`~omni_backends.torch_device.TorchAcceleratorBackend`).
  This driver never rebinds ``torch.cuda``. Note: vLLM's own
  ``XPUModelRunner.__init__`` (the base this driver hands out) does rebind
  ``torch.cuda.Stream/Event/graph/CUDAGraph/...`` to ``torch.xpu`` and never
  restores them; that is vendor code, reported in docs/vendor-drivers.md;
- device-to-host copies are not trusted to be ordered
  (``d2h_stream_ordered=False``): :meth:`to_host` copies blocking;
- distributed: ``xccl`` (torch's built-in), falling back to ``ccl`` when
  only the oneCCL bindings (``oneccl_bindings_for_pytorch``) provide it;
  ``ZE_AFFINITY_MASK`` restricts visible devices;
- Intel Extension for PyTorch is optional: imported only when installed *and*
  built for the running torch's major.minor (2.8 is its last release).

Verified statically (``omni-backends check-drift --source <vllm 0.33 wheel>``)
and on simulated devices (``tests/simulated/``); never on an Intel GPU.
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, ContextManager, Mapping

from omni_backends.backend import Capabilities, ProbeResult, ProbeState, Verification
from omni_backends.binding import VendorSymbol, runner_symbol, worker_symbol
from omni_backends.device_lists import check_range, refuse_descending, refuse_duplicates, split_entries
from omni_backends.errors import OmniBackendError, PlacementError
from omni_backends.probing import (
    device_nodes,
    dist_version,
    install_hint,
    module_findable,
    pci_vendor_devices,
    version_mismatches,
    versions_of,
)
from omni_backends.torch_device import TorchAcceleratorBackend
from omni_backends.vllm_upstream import VllmUpstreamBackend

# ------------------------------------------------------------ vendor symbols
XPU_MODEL_RUNNER = runner_symbol("vllm.v1.worker.xpu_model_runner", "XPUModelRunner")
XPU_MODEL_RUNNER_V2 = runner_symbol("vllm.v1.worker.xpu_model_runner", "XPUModelRunnerV2")
XPU_WORKER = worker_symbol("vllm.v1.worker.xpu_worker", "XPUWorker")
SUPPORTS_XPU_GRAPH = VendorSymbol("vllm.utils.torch_utils", "supports_xpu_graph", required=())
XPU_GRAPH = VendorSymbol("torch.xpu", "XPUGraph", dist="torch", kind="class")
XPU_GRAPH_CAPTURE = VendorSymbol(
    "torch.xpu", "graph", params=("xpu_graph", "pool", "stream"), required=("xpu_graph",), dist="torch", kind="class"
)
XPU_GRAPH_POOL_HANDLE = VendorSymbol("torch.xpu", "graph_pool_handle", required=(), dist="torch")
XCCL_AVAILABLE = VendorSymbol("torch.distributed", "is_xccl_available", required=(), dist="torch")
ONECCL_BINDINGS = VendorSymbol("oneccl_bindings_for_pytorch", "", dist="oneccl_bind_pt", kind="module")
IPEX = VendorSymbol("intel_extension_for_pytorch", "", dist="intel-extension-for-pytorch", kind="module")


#: one ``ZE_AFFINITY_MASK`` entry: ``device`` or ``device.sub-device`` (``card.tile``)
ZE_MASK_ENTRY = re.compile(r"^(\d+)(?:\.(\d+))?$")
#: Level Zero's device-hierarchy variable (``FLAT`` by default, ``COMPOSITE``, ``COMBINED``)
ZE_HIERARCHY = "ZE_FLAT_DEVICE_HIERARCHY"


def xpu_graphs_supported() -> bool:
    """True when this torch can capture XPU graphs: ``torch.xpu.XPUGraph`` exists,
    ``torch.xpu.is_available()`` (a torch without an XPU build still has
    ``torch.xpu.XPUGraph``, as a stub that raises when instantiated), and vLLM's
    ``supports_xpu_graph()`` (torch >= 2.11).

    Imports no vLLM (``capabilities()`` must not): vLLM's gate is asked only
    when vLLM is already imported; otherwise the same comparison it makes
    (``is_torch_equal_or_newer("2.11.0.dev")``) is made on ``torch.__version__``.
    """
    import sys

    import torch
    from packaging.version import Version

    txpu = getattr(torch, "xpu", None)
    if not (hasattr(txpu, "XPUGraph") and bool(txpu.is_available())):
        return False
    if "vllm" in sys.modules:
        return bool(SUPPORTS_XPU_GRAPH.resolve()())
    return Version(torch.__version__) >= Version("2.11.0.dev")


def ipex_status(versions: dict[str, str | None] | None = None) -> tuple[bool, str]:
    """(usable, why) for Intel Extension for PyTorch: usable only when installed
    and built for the installed torch's major.minor. Reads metadata only."""
    from packaging.version import InvalidVersion, Version

    ipex = (versions or {}).get("intel-extension-for-pytorch") or dist_version("intel-extension-for-pytorch")
    torch_v = (versions or {}).get("torch") or dist_version("torch")
    if ipex is None:
        return False, "intel-extension-for-pytorch not installed (optional)"
    try:
        match = torch_v is not None and Version(ipex).release[:2] == Version(torch_v).release[:2]
    except InvalidVersion:
        match = False
    if not match:
        return False, f"intel-extension-for-pytorch {ipex} is built for torch {ipex.rsplit('.', 1)[0]}, not torch {torch_v}; unused"
    return True, f"intel-extension-for-pytorch {ipex} matches torch {torch_v}"


class XpuBackend(TorchAcceleratorBackend, VllmUpstreamBackend):
    """Intel XPU driver (see the module docstring for what each group delegates to)."""

    name: ClassVar[str] = "xpu"
    device_type: ClassVar[str] = "xpu"
    dist_backend: ClassVar[str] = "xccl"
    visible_devices_env: ClassVar[str | None] = "ZE_AFFINITY_MASK"
    priority: ClassVar[int] = 80
    #: vLLM 0.33.0 pins torch 2.14.0; XPU graphs need torch >= 2.11 (checked at run time).
    vendor_requirements: ClassVar[dict[str, str]] = {"vllm": ">=0.33,<0.34", "torch": ">=2.14,<2.15"}
    #: optional Intel extensions; they raise on import without the oneAPI runtime they were built for
    vendor_modules: ClassVar[dict[str, str]] = {
        m: "install the Intel GPU driver and the oneAPI runtime it was built for and load its environment "
           "(`source /opt/intel/oneapi/setvars.sh`)" for m in ("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch")}
    verification = (Verification.STATIC, Verification.SIMULATED)
    vllm_device_type: ClassVar[str] = "xpu"

    def __init__(self, *, load_vendor: bool = True) -> None:
        """``load_vendor`` imports IPEX when :func:`ipex_status` says it matches
        torch; tests of pure logic pass ``load_vendor=False``."""
        self.ipex: Any = None
        if load_vendor and ipex_status()[0]:
            self.ipex = IPEX.resolve()

    # ---------------------------------------------------------------- probe
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
                return ProbeResult(ProbeState.INSTALLED, "; ".join(problems), versions,
                                   fix=install_hint(cls.vendor_requirements, versions), device_count=count)
            if count == 0:
                return ProbeResult(ProbeState.IMPORTABLE,
                                   "vLLM is installed but no Intel GPU (PCI vendor 0x8086 with a /dev/dri render node)",
                                   versions, fix="run on a machine with an Intel GPU and the Level Zero driver")
            mask = os.environ.get(cls.visible_devices_env or "")
            if mask is not None and mask.strip() == "":
                return ProbeResult(ProbeState.IMPORTABLE, "ZE_AFFINITY_MASK is set but empty: it hides every GPU",
                                   versions, fix="unset ZE_AFFINITY_MASK or list device indices (e.g. 0,1)")
            _ok, ipex = ipex_status(versions)
            return ProbeResult(ProbeState.USABLE, f"{count} Intel GPU(s); vLLM {versions['vllm']}; {ipex}", versions,
                               device_count=count)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, error=repr(exc))

    @classmethod
    def parse_visible_devices(cls, value: str, env: Mapping[str, str], device_count: int | None = None) -> tuple[str, ...]:
        """``ZE_AFFINITY_MASK``: comma-separated ``device`` or ``device.sub-device``
        (``card.tile``) entries; ``""`` hides every device. Level Zero filters
        devices with the mask but keeps its own enumeration order, so entries
        must be ascending. With ``ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE`` (read from
        ``env``) tiles of one card are one device: ``"0.0,0.1"`` is one device,
        returned as the id ``"0.0,0.1"`` (the exact mask a child for that device
        gets); in ``FLAT`` (the default) and ``COMBINED`` mode every tile already
        is a device with its own flat id and the ``card.tile`` form is refused.

        Raises :class:`~omni_backends.errors.PlacementError` for a malformed,
        empty or repeated entry, ``card.tile`` outside COMPOSITE, a card listed
        both whole and by tile, a descending mask, or a card ``>= device_count``."""
        variable = cls.visible_devices_env or "ZE_AFFINITY_MASK"
        if value.strip() == "":
            return ()
        hierarchy = (env.get(ZE_HIERARCHY) or "FLAT").strip().upper()
        entries = split_entries(variable, value)
        parsed: list[tuple[int, int | None]] = []
        for e in entries:
            m = ZE_MASK_ENTRY.match(e)
            if not m:
                raise PlacementError(
                    f"{variable}={value!r}: entry {e!r} is not 'device' or 'device.sub-device' (e.g. 0 or 0.1); "
                    f"fix {variable}."
                )
            parsed.append((int(m.group(1)), None if m.group(2) is None else int(m.group(2))))
        if any(tile is not None for _, tile in parsed) and hierarchy != "COMPOSITE":
            raise PlacementError(
                f"{variable}={value!r} uses the card.tile form, which names a tile of a composite device; with "
                f"{ZE_HIERARCHY}={hierarchy} every tile is a device of its own. List flat device ids "
                f"(e.g. 0,1), or set {ZE_HIERARCHY}=COMPOSITE."
            )
        refuse_duplicates(variable, value, entries)
        cards = [card for card, _ in parsed]
        refuse_descending(
            variable, value, cards, "Level Zero keeps its own device order whatever the mask's order, so a "
            "descending mask would not map ranks the way it reads."
        )
        # tiles of one card: the card listed whole and by tile, or one tile twice, is a clash
        by_card: dict[int, list[int | None]] = {}
        for card, tile in parsed:
            tiles = by_card.setdefault(card, [])
            if tiles and (tile is None or None in tiles):
                raise PlacementError(
                    f"{variable}={value!r} lists card {card} both whole and by tile; list either the card or its tiles."
                )
            tiles.append(tile)
        check_range(variable, value, sorted(by_card), device_count)
        # one device per card: its entries, re-joined (the exact mask to hand a child for that device)
        return tuple(",".join(str(card) if tile is None else f"{card}.{tile}" for tile in tiles)
                     for card, tiles in by_card.items())

    @classmethod
    def child_env_for_device(cls, device_id: str, env: Mapping[str, str]) -> dict[str, str]:
        """``{"ZE_AFFINITY_MASK": device_id}``, plus the parent's
        ``ZE_FLAT_DEVICE_HIERARCHY`` when set (the mask's meaning depends on it)."""
        out = {cls.visible_devices_env or "ZE_AFFINITY_MASK": device_id}
        if ZE_HIERARCHY in env:
            out[ZE_HIERARCHY] = env[ZE_HIERARCHY]
        return out

    def capabilities(self) -> Capabilities:
        graphs = xpu_graphs_supported()
        return Capabilities(
            static_graph_modes=("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE") if graphs else (),
            h2d_stream_ordered=True,
            d2h_stream_ordered=False,
            pinned_memory=True,
            v1_runner=True,
            v2_runner=True,
            talker_mtp_graph=graphs,
            events=True,  # torch.Event
        )

    # ------------------------------------------------- torch graph primitive
    def _require_graphs(self) -> None:
        if not self.capabilities().static_graphs:
            raise NotImplementedError(
                "this torch cannot capture XPU graphs (needs torch >= 2.11 with torch.xpu.XPUGraph); the xpu driver "
                "runs eager. Upgrade torch for graph mode."
            )

    def new_graph(self) -> Any:
        """``torch.xpu.XPUGraph()``; ``NotImplementedError`` without XPU graph support."""
        self._require_graphs()
        return XPU_GRAPH.resolve()()

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]:
        """``torch.xpu.graph(graph, pool=pool, stream=stream)``."""
        self._require_graphs()
        return XPU_GRAPH_CAPTURE.resolve()(graph, pool=pool, stream=stream)

    def graph_pool_handle(self) -> Any:
        """``torch.xpu.graph_pool_handle()``."""
        self._require_graphs()
        return XPU_GRAPH_POOL_HANDLE.resolve()()

    # ------------------------------------------------------- graph wrapping
    # wrap_graph: VllmUpstreamBackend.wrap_graph -- vLLM's CUDAGraphWrapper when
    # capabilities().static_graphs (XPU graphs supported), the runnable otherwise.

    # ------------------------------------------------------------ distributed
    def distributed_backend(self) -> str:
        """``"xccl"`` when torch has it (``torch.distributed.is_xccl_available()``),
        else ``"ccl"`` when ``oneccl_bindings_for_pytorch`` is installed (importing
        it registers ``ccl``). Raises :class:`OmniBackendError` when neither is."""
        if XCCL_AVAILABLE.resolve()():
            return "xccl"
        if module_findable(ONECCL_BINDINGS.module):
            ONECCL_BINDINGS.resolve()
            return "ccl"
        raise OmniBackendError(
            "no XPU collective backend: this torch has no xccl and oneccl_bindings_for_pytorch is not installed. "
            "Install a torch built with XCCL (torch >= 2.8 XPU wheels) or `pip install oneccl_bind_pt`."
        )

    # ------------------------------------------------------------ bases
    def model_runner_base(self, v2: bool = False) -> type:
        """``vllm.v1.worker.xpu_model_runner.XPUModelRunnerV2`` (V2) or ``XPUModelRunner`` (V1)."""
        return XPU_MODEL_RUNNER_V2.resolve() if v2 else XPU_MODEL_RUNNER.resolve()

    def worker_base(self) -> type:
        """``vllm.v1.worker.xpu_worker.XPUWorker``."""
        return XPU_WORKER.resolve()
