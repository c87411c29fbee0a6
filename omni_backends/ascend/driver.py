"""Ascend NPU driver on vllm-ascend 0.23.0.post1 (vLLM 0.23) and 0.26.0rc1 (vLLM 0.26) (``npu``, alias ``ascend``).

What differs on Ascend, each delegated to the vendor symbol declared below:

- forward context: ``vllm_ascend.ascend_forward_context.set_ascend_forward_context``
  (vLLM's ``cudagraph_runtime_mode`` -> ``aclgraph_runtime_mode``,
  ``is_profile`` -> ``in_profile_run``, ``model`` -> ``model_instance``;
  ``slot_mapping``/``is_padding`` dropped, ``ubatch_slices`` refused);
- graphs: ``vllm_ascend.compilation.acl_graph.ACLGraphWrapper`` and the capture
  context ``vllm_ascend.worker.model_runner_v1.graph_capture``;
- sampler: ``vllm_ascend.sample.sampler.AscendSampler``;
- buffers: vLLM's ``CpuGpuBuffer`` pinned per ``NPUPlatform.is_pin_memory_available``;
  host-to-device copies are *not* ordered with the next kernel
  (``Capabilities.h2d_stream_ordered=False``), so :meth:`AscendBackend.copy_to_device`
  copies blocking: the data is on the device and the pinned source may be
  rewritten when it returns;
- attention metadata: ``AscendCommonAttentionMetadata``;
- bases: vllm-ascend's V1 / V2 ``NPUModelRunner`` and ``NPUWorker``;
- V2 model state: vllm-ascend's own ``AscendModelState(DefaultModelState)``
  (its ``prepare_attn`` builds the NPU attention metadata), which its patch
  ``patch/worker/patch_v2/patch_model_state.py`` installs by replacing vLLM's
  ``model_runner.init_model_state`` (applied by ``NPUWorker.__init__``); the omni
  V2 runner composes the omni hooks with it (``core.runner.model_state``).
  :meth:`AscendBackend.model_runner_base` refuses V2 when that patch is not in
  place. ``capabilities().v2_runner`` is True only on a stack of
  :data:`STACKS` whose V2 runner calls every state seam the omni hooks run in
  (see :data:`STACKS` for why not on 0.23);
- device ops: ``torch.accelerator`` once ``torch_npu`` registered the ``npu``
  device (:class:`~omni_backends.torch_device.TorchAcceleratorBackend`), graphs on
  ``torch.npu.NPUGraph`` (``torch_npu.npu``); ``hccl``; ``ASCEND_RT_VISIBLE_DEVICES``.

Probing never imports ``torch_npu`` unless an NPU device node exists and the
CANN collective library is found: on a host without CANN, importing
``torch_npu`` raises ``OSError`` (missing ``libhccl.so``), and with torch's
device-backend autoload even ``import torch`` fails while torch_npu is
installed (``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` avoids that).

Verified statically (``omni-backends check-drift --source <vllm-ascend wheel>``)
and on simulated devices (``tests/simulated/``, ``tests/core/test_v2_vendor_state.py``);
never on an Ascend NPU.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, ClassVar, ContextManager, Mapping, Unpack

from omni_backends.backend import (
    Capabilities,
    ForwardContextArgs,
    ProbeResult,
    ProbeState,
    Verification,
    unknown_forward_context_keywords,
)
from omni_backends.binding import VendorSymbol, runner_symbol, worker_symbol
from omni_backends.device_lists import ORDINAL, check_range, refuse_descending, refuse_duplicates, split_entries
from omni_backends.errors import OmniBackendError, PlacementError
from omni_backends.probing import device_nodes, find_shared_library, install_hint, version_mismatches, versions_of
from omni_backends.patches import install_one_token_greedy
from omni_backends.torch_device import TorchAcceleratorBackend, copy_host_to_device_blocking
from omni_backends.vllm_upstream import CPU_GPU_BUFFER

# ------------------------------------------------------------ vendor symbols
# Checked against vllm-ascend 0.23.0.post1 and torch-npu 2.10.0.post4 (docs/drift.md).
SET_ASCEND_FORWARD_CONTEXT = VendorSymbol(
    "vllm_ascend.ascend_forward_context",
    "set_ascend_forward_context",
    params=(
        "attn_metadata",
        "vllm_config",
        "num_tokens",
        "num_tokens_across_dp",
        "in_profile_run",
        "num_actual_tokens",
        "aclgraph_runtime_mode",
        "batch_descriptor",
        "model_instance",
        "skip_compiled",
    ),
    required=("attn_metadata", "vllm_config"),
    defaults=(("num_tokens", "0"), ("aclgraph_runtime_mode", "CUDAGraphMode.NONE")),
    dist="vllm-ascend",
)
ACL_GRAPH_WRAPPER = VendorSymbol(
    "vllm_ascend.compilation.acl_graph",
    "ACLGraphWrapper",
    params=("runnable", "vllm_config", "runtime_mode"),
    required=("runnable", "vllm_config", "runtime_mode"),
    dist="vllm-ascend",
    kind="class",
)
ACL_GRAPH_CAPTURE = VendorSymbol(
    "vllm_ascend.worker.model_runner_v1", "graph_capture", params=("device",), required=("device",), dist="vllm-ascend"
)
ASCEND_SAMPLER = VendorSymbol(
    "vllm_ascend.sample.sampler", "AscendSampler", params=("logprobs_mode",), required=(), dist="vllm-ascend", kind="class"
)
# AscendSampler keeps vLLM's Sampler.sample and replaces its top-k/top-p module with AscendTopKTopPSampler;
# the one-token rule (omni_backends.patches.install_one_token_greedy) wraps that attribute.
ASCEND_SAMPLER_TOPK = VendorSymbol(
    "vllm_ascend.sample.sampler", "AscendSampler.topk_topp_sampler", dist="vllm-ascend", kind="attribute"
)
NPU_PIN_MEMORY = VendorSymbol(
    "vllm_ascend.platform", "NPUPlatform.is_pin_memory_available", required=(), dist="vllm-ascend"
)
ASCEND_COMMON_ATTN_METADATA = VendorSymbol(
    "vllm_ascend.attention.utils", "AscendCommonAttentionMetadata", dist="vllm-ascend", kind="class"
)
NPU_MODEL_RUNNER_V1 = runner_symbol("vllm_ascend.worker.model_runner_v1", "NPUModelRunner", dist="vllm-ascend")
NPU_MODEL_RUNNER_V2 = runner_symbol("vllm_ascend.worker.v2.model_runner", "NPUModelRunner", dist="vllm-ascend")
NPU_WORKER = worker_symbol("vllm_ascend.worker.worker", "NPUWorker", dist="vllm-ascend")
# The V2 model state vllm-ascend builds (the omni V2 runner composes the omni hooks with it, core.runner.model_state).
_STATE_ARGS = ("vllm_config", "model", "encoder_cache", "device")
ASCEND_MODEL_STATE = VendorSymbol("vllm_ascend.worker.v2.model_states.default", "AscendModelState", params=_STATE_ARGS,
                                  required=_STATE_ARGS, dist="vllm-ascend", kind="class")
#: the override the omni state must keep: the NPU attention metadata, also stored as ``self.attn_metadata``
ASCEND_PREPARE_ATTN = VendorSymbol(
    "vllm_ascend.worker.v2.model_states.default", "AscendModelState.prepare_attn",
    params=("input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups", "kv_cache_config"),
    required=("input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups", "kv_cache_config"),
    dist="vllm-ascend",
)
#: vllm-ascend's replacement for vLLM's ``init_model_state`` (the vendor's spelling), which builds AscendModelState
ASCEND_INIT_MODEL_STATE = VendorSymbol("vllm_ascend.worker.v2.model_states", "init_asecnd_model_state",
                                       params=_STATE_ARGS, required=_STATE_ARGS, mentions=("AscendModelState",),
                                       dist="vllm-ascend")
#: the patch that installs it: ``model_runner.init_model_state = init_asecnd_model_state`` at import
ASCEND_MODEL_STATE_PATCH = VendorSymbol("vllm_ascend.patch.worker.patch_v2.patch_model_state", "", dist="vllm-ascend",
                                        kind="module")
#: the name vLLM's V2 ``GPUModelRunner.load_model`` builds its state through (what the patch rebinds)
V2_RUNNER_INIT_MODEL_STATE = VendorSymbol("vllm.v1.worker.gpu.model_runner", "init_model_state", kind="attribute")
TORCH_NPU = VendorSymbol("torch_npu", "", dist="torch-npu", kind="module")
NPU_GRAPH = VendorSymbol("torch_npu.npu", "NPUGraph", required=(), dist="torch-npu", kind="class")
NPU_GRAPH_CAPTURE = VendorSymbol(
    "torch_npu.npu", "graph", params=("npu_graph", "pool", "stream"), required=("npu_graph",), dist="torch-npu", kind="class"
)
NPU_GRAPH_POOL_HANDLE = VendorSymbol("torch_npu.npu", "graph_pool_handle", required=(), dist="torch-npu")


@dataclasses.dataclass(frozen=True)
class AscendStack:
    """One vllm-ascend release line the driver is verified against (statically: ``check-drift`` on its
    source, ``tests/test_drift_vendor_sources.py``): the distributions it pins (PEP 440 specifiers), whether
    the omni V2 runner runs on it and why (the static facts, ``file:line`` in the vendor sources)."""

    requirements: dict[str, str]
    v2_runner: bool
    v2_why: str

    @property
    def label(self) -> str:
        return f"vllm-ascend{self.requirements['vllm-ascend']} on vllm{self.requirements['vllm']}"


_TORCH_2_10 = {"torch-npu": ">=2.10,<2.11", "torch": ">=2.10,<2.11"}
#: the verified stacks, oldest first. vllm-ascend X.Y runs on vLLM X.Y (its ``vllm_version_is("X.Y.0")`` checks)
#: and pins torch 2.10.0 + torch-npu 2.10.0.post4. Both build ``AscendModelState`` through the patched
#: ``init_model_state``; what differs is vLLM's V2 runner.
STACKS: tuple[AscendStack, ...] = (
    AscendStack({"vllm-ascend": ">=0.23,<0.24", **_TORCH_2_10, "vllm": ">=0.23,<0.24"}, v2_runner=False, v2_why=(
        "vLLM 0.23's V2 ModelState has no remove_request (vllm/v1/worker/gpu/model_states/interface.py:38) and its "
        "runner's _remove_request never calls one (vllm/v1/worker/gpu/model_runner.py:708; check-drift: "
        "state-override-never-called), so a finished request's omni payloads would never be freed")),
    AscendStack({"vllm-ascend": ">=0.26.0rc1,<0.27", **_TORCH_2_10, "vllm": ">=0.26,<0.27"}, v2_runner=True, v2_why=(
        "vLLM 0.26's V2 runner calls remove_request (vllm/v1/worker/gpu/model_runner.py:757), add_request (:816), "
        "get_mm_embeddings (:1287), prepare_inputs (:1300) and prepare_dummy_inputs (cudagraph_utils.py:479) on the "
        "AscendModelState vllm-ascend builds (vllm_ascend/patch/worker/patch_v2/patch_model_state.py:26), from "
        "methods vllm-ascend does not override; statically checked, never run on an NPU")),
)


def stack_of(versions: Mapping[str, str | None]) -> AscendStack | None:
    """The verified stack (:data:`STACKS`) the installed ``versions`` form, else ``None``."""
    return next((s for s in STACKS if not version_mismatches(s.requirements, versions)), None)


def _nearest_stack(versions: Mapping[str, str | None]) -> AscendStack:
    """The stack of the installed vllm-ascend's release line, else the newest one (what a fix installs)."""
    ascend = {"vllm-ascend": versions.get("vllm-ascend")}
    return next((s for s in STACKS if not version_mismatches({"vllm-ascend": s.requirements["vllm-ascend"]}, ascend)),
                STACKS[-1])


def stacks_text() -> str:
    """The verified stacks in one line, each with whether the omni V2 runner runs on it."""
    return "; ".join(f"{s.label} (V2 runner: {'yes' if s.v2_runner else 'no'})" for s in STACKS)


def v2_runner_note(versions: Mapping[str, str | None]) -> str:
    """Whether the omni V2 runner runs on the installed ``versions``, and why (one sentence)."""
    stack = stack_of(versions)
    if stack is None:
        return ("V2 runner: no (not a verified stack; V2 only on "
                + ", ".join(s.label for s in STACKS if s.v2_runner) + ")")
    return f"V2 runner: {'yes' if stack.v2_runner else 'no'} ({stack.v2_why})"


def cann_dirs() -> list[str]:
    """CANN install roots from the environment variables its set_env.sh exports."""
    roots = [os.environ.get(k) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")]
    return [r for r in roots if r and os.path.isdir(r)]


def ascend_forward_context_kwargs(attn_metadata: Any, vllm_config: Any,
                                  **kwargs: Unpack[ForwardContextArgs]) -> dict[str, Any]:
    """Map vLLM's ``set_forward_context`` arguments onto ``set_ascend_forward_context``'s.

    Renames ``cudagraph_runtime_mode`` -> ``aclgraph_runtime_mode``,
    ``is_profile`` -> ``in_profile_run``, ``model`` -> ``model_instance``;
    passes ``num_actual_tokens``; drops ``slot_mapping`` and ``is_padding``
    (vllm-ascend's attention reads the slot mapping from its own metadata and
    its wrapper does not forward either). ``None`` for ``num_tokens`` /
    ``cudagraph_runtime_mode`` leaves the vendor default (``0`` /
    ``CUDAGraphMode.NONE``).

    Raises :class:`OmniBackendError` for ``ubatch_slices`` (vllm-ascend's
    forward context has no micro-batching: turn off dual-batch overlap).
    """
    unknown_forward_context_keywords(kwargs)
    if kwargs.get("ubatch_slices") is not None:
        raise OmniBackendError(
            "vllm-ascend's set_ascend_forward_context takes no ubatch_slices (no micro-batching on Ascend); "
            "disable dual-batch overlap (--enable-dbo) for the npu driver"
        )
    get = kwargs.get
    mapped: dict[str, Any] = {
        "attn_metadata": attn_metadata,
        "vllm_config": vllm_config,
        "num_tokens_across_dp": get("num_tokens_across_dp"),
        "in_profile_run": bool(get("is_profile", False)),
        "num_actual_tokens": get("num_actual_tokens"),
        "batch_descriptor": get("batch_descriptor"),
        "model_instance": get("model"),
        "skip_compiled": get("skip_compiled", False),
    }
    if get("num_tokens") is not None:
        mapped["num_tokens"] = kwargs["num_tokens"]
    if get("cudagraph_runtime_mode") is not None:
        mapped["aclgraph_runtime_mode"] = kwargs["cudagraph_runtime_mode"]
    return mapped


def check_v2_model_state_patch() -> None:
    """Raise :class:`OmniBackendError` unless ``vllm.v1.worker.gpu.model_runner.init_model_state`` is
    vllm-ascend's ``init_asecnd_model_state`` (so the V2 runner builds ``AscendModelState``)."""
    built_by = V2_RUNNER_INIT_MODEL_STATE.resolve()
    if built_by is not ASCEND_INIT_MODEL_STATE.resolve():
        raise OmniBackendError(
            f"vLLM's V2 runner builds its model state with {getattr(built_by, '__module__', '?')}."
            f"{getattr(built_by, '__qualname__', built_by)}, not vllm-ascend's {ASCEND_INIT_MODEL_STATE.qualname}: "
            f"the patch {ASCEND_MODEL_STATE_PATCH.qualname} is not applied, so the state would not be "
            f"{ASCEND_MODEL_STATE.qualname} and its {ASCEND_PREPARE_ATTN.attr_name} (the NPU attention metadata) "
            "would not run. Build the runner inside vllm-ascend's NPUWorker (its __init__ calls "
            "vllm_ascend.utils.adapt_patch()), or set VLLM_USE_V2_MODEL_RUNNER=0"
        )


class AscendBackend(TorchAcceleratorBackend):
    """Ascend NPU driver (see the module docstring for what each group delegates to)."""

    name: ClassVar[str] = "npu"
    aliases: ClassVar[tuple[str, ...]] = ("ascend",)
    device_type: ClassVar[str] = "npu"
    dist_backend: ClassVar[str] = "hccl"
    visible_devices_env: ClassVar[str | None] = "ASCEND_RT_VISIBLE_DEVICES"
    priority: ClassVar[int] = 90
    #: the window the verified :data:`STACKS` span (vllm-ascend 0.23.0.post1 and 0.26.0rc1, each on its own vLLM,
    #: both on torch 2.10.0 + torch-npu 2.10.0.post4); :meth:`probe` also requires the installed versions to form
    #: one of the stacks (vllm-ascend 0.24 / 0.25, or 0.23 on vLLM 0.26, are inside the window but not verified).
    vendor_requirements: ClassVar[dict[str, str]] = {
        "vllm-ascend": ">=0.23,<0.27",
        "torch-npu": ">=2.10,<2.11",
        "torch": ">=2.10,<2.11",
        "vllm": ">=0.23,<0.27",
    }
    #: torch_npu (and vllm-ascend, which imports it) raise OSError without CANN's runtime (libhccl.so)
    vendor_modules: ClassVar[dict[str, str]] = {
        m: "install CANN and load its toolkit environment (`source /usr/local/Ascend/ascend-toolkit/set_env.sh`, "
           "which puts libhccl.so on LD_LIBRARY_PATH)" for m in ("torch_npu", "vllm_ascend")}
    verification = (Verification.STATIC, Verification.SIMULATED)
    vllm_device_type: ClassVar[str] = "npu"

    def __init__(self, *, load_vendor: bool = True) -> None:
        """``load_vendor`` imports ``torch_npu`` so ``torch.accelerator`` and
        ``torch.npu`` know the NPU (needed when ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).
        Tests of the pure mapping logic pass ``load_vendor=False``."""
        if load_vendor:
            TORCH_NPU.resolve()

    # ---------------------------------------------------------------- probe
    @classmethod
    def probe(cls) -> ProbeResult:
        try:
            versions = versions_of(cls.vendor_requirements)
            nodes = device_nodes("/dev/davinci[0-9]*")
            missing = [d for d in ("vllm-ascend", "torch-npu") if versions.get(d) is None]
            if missing:
                return ProbeResult(
                    ProbeState.NOT_INSTALLED,
                    f"{' and '.join(missing)} not installed; {len(nodes)} Ascend device node(s) in /dev; verified "
                    f"stacks: {stacks_text()}",
                    versions,
                    fix="install Huawei CANN, then pip install 'omni-backends[ascend]'",
                    device_count=len(nodes),
                )
            problems = version_mismatches(cls.vendor_requirements, versions)
            if problems:
                return ProbeResult(ProbeState.INSTALLED, "; ".join(problems), versions,
                                   fix=install_hint(cls.vendor_requirements, versions), device_count=len(nodes))
            stack = stack_of(versions)
            if stack is None:
                near = _nearest_stack(versions)
                return ProbeResult(
                    ProbeState.INSTALLED,
                    f"vllm-ascend {versions['vllm-ascend']} with vllm {versions['vllm']} is not a verified stack ("
                    + "; ".join(version_mismatches(near.requirements, versions)) + "; verified stacks: "
                    + stacks_text() + ")",
                    versions, fix=install_hint(near.requirements, versions), device_count=len(nodes))
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
            if not nodes:
                return ProbeResult(ProbeState.IMPORTABLE, "CANN and torch-npu found but no /dev/davinci* device",
                                   versions, fix="run on an Ascend host with the NPU driver loaded")
            try:
                npu = TORCH_NPU.resolve().npu
                count = int(npu.device_count())
            except (OSError, RuntimeError, ImportError, AttributeError) as exc:
                return ProbeResult(ProbeState.INSTALLED, f"importing torch_npu failed: {type(exc).__name__}: {exc}",
                                   versions, fix="check the CANN installation matches torch-npu", error=repr(exc))
            visible = os.environ.get(cls.visible_devices_env or "")
            if count == 0:
                return ProbeResult(ProbeState.IMPORTABLE,
                                   f"torch_npu imports but reports 0 NPUs (ASCEND_RT_VISIBLE_DEVICES={visible!r})",
                                   versions, fix="check ASCEND_RT_VISIBLE_DEVICES and the NPU driver")
            return ProbeResult(ProbeState.USABLE, f"{count} Ascend NPU(s); vllm-ascend {versions['vllm-ascend']} on "
                               f"vllm {versions['vllm']}; {v2_runner_note(versions)}", versions, device_count=count)
        except Exception as exc:  # a probe never raises
            return ProbeResult(ProbeState.NOT_INSTALLED, f"probe failed: {exc}", {}, error=repr(exc))

    @classmethod
    def parse_visible_devices(cls, value: str, env: Mapping[str, str], device_count: int | None = None) -> tuple[str, ...]:
        """``ASCEND_RT_VISIBLE_DEVICES``: comma-separated NPU logical ids; ``""``
        hides every NPU. CANN accepts them in ascending order only, so a
        descending list is refused rather than guessed. Raises
        :class:`~omni_backends.errors.PlacementError` for a non-numeric, empty or
        repeated entry, a descending list, or an id ``>= device_count``."""
        variable = cls.visible_devices_env or "ASCEND_RT_VISIBLE_DEVICES"
        if value.strip() == "":
            return ()
        entries = split_entries(variable, value)
        for e in entries:
            if not ORDINAL.match(e):
                raise PlacementError(
                    f"{variable}={value!r}: entry {e!r} is not an NPU id (CANN reads only the ids before it); "
                    f"fix {variable}."
                )
        ordinals = [int(e) for e in entries]
        refuse_duplicates(variable, value, [str(o) for o in ordinals])
        refuse_descending(variable, value, ordinals, "CANN supports only ascending device ids here.")
        check_range(variable, value, ordinals, device_count)
        return tuple(str(o) for o in ordinals)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            static_graph_modes=("PIECEWISE", "FULL", "FULL_DECODE_ONLY"),
            h2d_stream_ordered=False,
            d2h_stream_ordered=True,
            pinned_memory=True,
            v1_runner=True,
            v2_runner=self.v2_runner_supported(),
            talker_mtp_graph=True,
            events=True,  # torch.Event
        )

    @classmethod
    def v2_runner_supported(cls) -> bool:
        """Whether the installed vllm-ascend / vLLM form a stack of :data:`STACKS` on which the omni V2 runner
        composes with vllm-ascend's ``AscendModelState`` (:func:`v2_runner_note` says why; distribution
        metadata only, nothing imported). False where vllm-ascend is not installed."""
        stack = stack_of(versions_of(cls.vendor_requirements))
        return stack is not None and stack.v2_runner

    # ------------------------------------------------- torch graph primitive
    def new_graph(self) -> Any:
        """``torch.npu.NPUGraph()`` (``torch_npu.npu.NPUGraph``)."""
        return NPU_GRAPH.resolve()()

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]:
        """``torch.npu.graph(graph, pool=pool, stream=stream)``."""
        return NPU_GRAPH_CAPTURE.resolve()(graph, pool=pool, stream=stream)

    def graph_pool_handle(self) -> Any:
        """``torch.npu.graph_pool_handle()``."""
        return NPU_GRAPH_POOL_HANDLE.resolve()()

    # ------------------------------------------------------ forward context
    def forward_context(self, attn_metadata: Any, vllm_config: Any,
                        **kwargs: Unpack[ForwardContextArgs]) -> ContextManager[None]:
        """``set_ascend_forward_context(**ascend_forward_context_kwargs(...))``; see
        :func:`ascend_forward_context_kwargs` for the argument mapping and errors."""
        mapped = ascend_forward_context_kwargs(attn_metadata, vllm_config, **kwargs)  # bad input fails first
        return SET_ASCEND_FORWARD_CONTEXT.resolve()(**mapped)

    # ------------------------------------------------------- graph wrapping
    def wrap_graph(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any) -> Callable[..., Any]:
        """``ACLGraphWrapper(runnable, vllm_config, runtime_mode=runtime_mode)``;
        ``runnable`` itself when ``runtime_mode`` is ``None``/``CUDAGraphMode.NONE``
        (the vendor wrapper refuses NONE) or static graphs are off."""
        if not self.capabilities().static_graphs or runtime_mode is None or getattr(runtime_mode, "name", "") == "NONE":
            return runnable
        return ACL_GRAPH_WRAPPER.resolve()(runnable, vllm_config, runtime_mode=runtime_mode)

    def graph_capture_context(self, device: Any) -> ContextManager[Any]:
        """vllm-ascend's ``graph_capture(device)``: a side ``torch.npu.Stream`` made
        current after it waited for the current stream."""
        return ACL_GRAPH_CAPTURE.resolve()(device=device)

    # ---------------------------------------------------------------- sampler
    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        """``vllm_ascend.sample.sampler.AscendSampler(logprobs_mode=...)`` with the
        one-token rule installed (:meth:`prepare_sampler`)."""
        return self.prepare_sampler(ASCEND_SAMPLER.resolve()(logprobs_mode=logprobs_mode))

    def prepare_sampler(self, sampler: Any) -> Any:
        """``sampler`` (the ``AscendSampler`` the NPU runner built) with its
        ``topk_topp_sampler`` wrapped in place by
        :func:`omni_backends.patches.install_one_token_greedy`: a row whose
        top-k / top-p keep one token returns the greedy token, lowest id on ties."""
        return install_one_token_greedy(sampler, attr=ASCEND_SAMPLER_TOPK.attr_name)

    # ---------------------------------------------------------------- buffers
    def make_buffer(self, *size: int, dtype: Any, numpy: bool = True) -> Any:
        """``vllm.v1.utils.CpuGpuBuffer`` on the NPU, pinned iff
        ``NPUPlatform.is_pin_memory_available()`` (the vendor's rule)."""
        return CPU_GPU_BUFFER.resolve()(
            *size, dtype=dtype, device=self.device(), pin_memory=bool(NPU_PIN_MEMORY.resolve()()), with_numpy=numpy
        )

    def copy_to_device(self, buffer: Any, n: int | None = None) -> Any:
        """Blocking copy of ``buffer.cpu[:n]`` into ``buffer.gpu[:n]`` (H2D is not
        ordered with the next kernel on Ascend): on return the device slice is
        complete and ``buffer.cpu`` may be rewritten. Returns the device slice."""
        return copy_host_to_device_blocking(buffer, n)

    # ----------------------------------------------------- attention metadata
    def common_attn_metadata_cls(self) -> type:
        """``vllm_ascend.attention.utils.AscendCommonAttentionMetadata``."""
        return ASCEND_COMMON_ATTN_METADATA.resolve()

    # ------------------------------------------------------------ bases
    def model_runner_base(self, v2: bool = False) -> type:
        """vllm-ascend's ``worker.model_runner_v1.NPUModelRunner`` (V1, vllm-ascend's
        default) or ``worker.v2.model_runner.NPUModelRunner`` (V2).

        For V2, raises :class:`OmniBackendError` unless vLLM's V2 runner builds its
        state through vllm-ascend's ``init_asecnd_model_state`` (the patch
        ``vllm_ascend.patch.worker.patch_v2.patch_model_state``, which
        ``NPUWorker.__init__`` applies through ``adapt_patch()``): without it vLLM's
        ``DefaultModelState`` would be built and composed, and its ``prepare_attn``
        is not the NPU one (:func:`check_v2_model_state_patch`)."""
        if not v2:
            return NPU_MODEL_RUNNER_V1.resolve()
        runner = NPU_MODEL_RUNNER_V2.resolve()
        check_v2_model_state_patch()
        return runner

    def worker_base(self) -> type:
        """``vllm_ascend.worker.worker.NPUWorker`` (initialises ``hccl``)."""
        return NPU_WORKER.resolve()
