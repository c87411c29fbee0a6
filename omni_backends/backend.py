"""The Backend interface: what the core runner and the driver selection call, in one place.

A driver is a subclass of :class:`Backend` registered under the entry-point
group ``omni_backends.drivers``. The core omni runner (``core/``) calls only
this interface; it never names a device. :class:`Backend` reads in two parts,
in the order a driver implements them (``docs/vendor-guide.md`` counts them):

1. required -- identity (class attributes) and the abstract methods the
               core and the selection call: probe, capabilities, device,
               device count, synchronize, memory, the ordering-safe to-host
               copy, forward context, graph wrapping, the vendor's runner and
               worker bases;
2. defaults -- methods the core or selection call that most drivers
               inherit: peak memory, distributed backend, visible-devices
               parsing, events (where :attr:`Capabilities.events` says so),
               graph-capture context, sampler preparation, model and
               vLLM-platform checks, identity report.

What a driver supports is declared in :class:`Capabilities`; the core reads
those flags and never probes a method by catching an exception.

The conformance kit needs more device operations than the core does (streams,
generators, the torch graph primitive, a sampler, buffers, attention metadata,
the KV write): they are the protocol
:class:`omni_backends.testing.kit_ops.KitOps`, which a driver implements beside
this interface and the kit checks. The shared bases
(:class:`~omni_backends.torch_device.TorchAcceleratorBackend`,
:class:`~omni_backends.vllm_upstream.VllmUpstreamBackend`) write most of it.

Policy every driver shares lives in :mod:`omni_backends.policy` (re-exported
here): :func:`capture_sizes` (graph capture sizes) and
:func:`check_attn_metadata` (``CommonAttentionMetadata`` invariants).

Vendor stacks (``vllm``, ``torch_npu``, ``intel_extension_for_pytorch``) are
imported lazily inside methods, never at module import, and a driver never
rebinds attributes of ``torch``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Mapping, TypedDict, Unpack

from omni_backends.device_lists import parse_generic
from omni_backends.policy import capture_sizes, check_attn_metadata

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: Version of this interface. A driver lists the versions it implements in
#: ``Backend.interface_versions``; the registry refuses a driver whose list
#: does not contain this number.
INTERFACE_VERSION = 1


class ProbeState(str, enum.Enum):
    """How far a driver got when probed, in order."""

    NOT_INSTALLED = "not-installed"  #: a required vendor package is absent
    INSTALLED = "installed"  #: packages present, but importing them failed
    IMPORTABLE = "importable"  #: imports work, but no device / wrong versions
    USABLE = "usable"  #: this driver can run here


class Verification(str, enum.Enum):
    """How a driver is verified in this project (``omni-backends devices`` shows it and :attr:`meaning`)."""

    ENGINE = "engine run"
    DEVICE = "device level"
    STATIC = "static"
    SIMULATED = "simulated"

    @property
    def meaning(self) -> str:
        return _VERIFICATION_MEANING[self.value]


_VERIFICATION_MEANING = {"engine run": "a real vLLM engine ran through it in CI",
                         "device level": "torch-level tests ran on the real device",
                         "static": "vendor symbols checked against the vendor's source",
                         "simulated": "behaviour tested on a simulated device only"}


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What :meth:`Backend.probe` found. Never raised; always returned.

    ``versions`` maps distribution name -> installed version (``None`` when
    absent). ``reason`` is one sentence a user can act on; ``fix`` says what to
    do to make the driver usable (empty when usable). ``error`` holds the
    formatted exception when an import or a device query raised.
    """

    state: ProbeState
    reason: str
    versions: dict[str, str | None] = dataclasses.field(default_factory=dict)
    fix: str = ""
    device_count: int = 0
    error: str | None = None

    @property
    def usable(self) -> bool:
        return self.state is ProbeState.USABLE

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "usable": self.usable,
            "reason": self.reason,
            "versions": dict(self.versions),
            "fix": self.fix,
            "device_count": self.device_count,
            "error": self.error,
        }


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """Static facts about a driver that the core branches on.

    The core reads these flags; it never asks which device it runs on.

    - ``static_graph_modes``: names of ``vllm.config.CUDAGraphMode`` members the
      driver can capture (``()`` = eager only).
    - ``h2d_stream_ordered``: a non-blocking host->device copy is ordered before
      the next kernel on the current stream (True on CUDA; False on Ascend,
      where the consumer must wait on an event or the copy must block).
    - ``d2h_stream_ordered``: a non-blocking device->host copy followed by an
      event synchronize yields complete data (False on some XPU stacks).
    - ``pinned_memory``: page-locked host buffers are available.
    - ``events``: :meth:`Backend.new_event` returns a device event; the core
      fences its in-flight host copies with one, and synchronizes the device
      where this is False.
    - ``v1_runner`` / ``v2_runner``: vLLM's V1 / V2 model runner can run.
    - ``talker_mtp_graph``: the talker MTP head may be graph-captured.
    - ``generator_offsets``: the device's ``torch.Generator`` has an offset
      (``get_offset`` / ``set_offset``, as CUDA's Philox generators). vLLM's
      V1 model runner rewinds a seeded request's generator by offset when it
      discards the token sampled for a prefill split over steps
      (``GPUModelRunner._bookkeeping_sync``); where this is False (a CPU
      generator) the core's engine factory turns vLLM's chunked prefill off
      (``EngineArgs.enable_chunked_prefill=False``) unless the caller sets it.
    - ``synchronous_copies``: the device completes every copy when it is
      issued (host memory, no queue: the cpu driver), so nothing is ever in
      flight on its streams. Read by the conformance kit only: where it is
      False the kit proves that ``KitOps.queue_copy`` leaves a copy in flight
      on the current stream before its ordering checks (``to-host``,
      ``streams-events``) rely on one, and fails the driver (contract
      ``kit-ops``) when it cannot; where it is True those ordering checks are
      reported skipped with this reason, and the kit checks that
      ``queue_copy`` has landed on return.
    """

    static_graph_modes: tuple[str, ...] = ()
    h2d_stream_ordered: bool = True
    d2h_stream_ordered: bool = True
    pinned_memory: bool = False
    v1_runner: bool = True
    v2_runner: bool = False
    talker_mtp_graph: bool = False
    events: bool = False
    generator_offsets: bool = True
    synchronous_copies: bool = False

    @property
    def static_graphs(self) -> bool:
        return bool(self.static_graph_modes)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["static_graph_modes"] = list(self.static_graph_modes)
        return d


class ForwardContextArgs(TypedDict, total=False):
    """The keywords of :meth:`Backend.forward_context` (all optional), declared once: those of
    ``vllm.forward_context.set_forward_context`` (same names and meanings), then the vendor extras
    (:data:`FORWARD_CONTEXT_EXTRAS`) some vendors' calls take and vLLM's does not."""

    num_tokens: int | None  #: tokens in the batch (vLLM: ``None``)
    num_tokens_across_dp: torch.Tensor | None  #: per data-parallel rank
    cudagraph_runtime_mode: Any  #: a ``CUDAGraphMode``; ``None`` means ``CUDAGraphMode.NONE``
    batch_descriptor: Any  #: a ``BatchDescriptor`` (selects the captured graph)
    ubatch_slices: Any  #: micro-batch slices (dual-batch overlap)
    slot_mapping: Any  #: layer name -> int64 ``[num_tokens]``
    skip_compiled: bool  #: run the model eagerly (vLLM: ``False``)
    is_padding: Any
    num_actual_tokens: int | None  #: tokens without padding (Ascend)
    model: Any  #: the model instance (Ascend's ``model_instance``)
    is_profile: bool  #: a profiling run (Ascend's ``in_profile_run``)


#: every keyword :meth:`Backend.forward_context` takes
FORWARD_CONTEXT_KEYWORDS = frozenset(ForwardContextArgs.__optional_keys__)
#: the keywords vLLM's ``set_forward_context`` does not take (vendor extras)
FORWARD_CONTEXT_EXTRAS = frozenset({"num_actual_tokens", "model", "is_profile"})
#: what a keyword not given means: ``None`` (vLLM's default), ``False`` for the two flags
FORWARD_CONTEXT_DEFAULTS: dict[str, Any] = {k: False if k in ("skip_compiled", "is_profile") else None
                                            for k in ForwardContextArgs.__annotations__}


def unknown_forward_context_keywords(kwargs: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` naming every key of ``kwargs`` that :class:`ForwardContextArgs` lacks (a typo fails
    at the call, as it would against an explicit signature)."""
    unknown = kwargs.keys() - FORWARD_CONTEXT_KEYWORDS
    if unknown:
        raise TypeError(f"forward_context() got unexpected keyword argument(s) {', '.join(sorted(unknown))}; "
                        f"it takes {', '.join(sorted(FORWARD_CONTEXT_KEYWORDS))}")


class Backend(abc.ABC):
    """One hardware backend. One instance per process, selected once.

    Identity is data (class attributes); behaviour is methods. Every method
    that names a vLLM or vendor symbol delegates to it; nothing here
    re-implements vLLM. Read top to bottom: (1) what a driver must write,
    (2) what it may override.

    Drivers on PyTorch's device-generic API build on
    :class:`omni_backends.torch_device.TorchAcceleratorBackend` and drivers on
    vLLM's own components on :class:`omni_backends.vllm_upstream.VllmUpstreamBackend`,
    both ``Backend`` subclasses that write most of part 1 and of the kit's
    :class:`~omni_backends.testing.kit_ops.KitOps`.
    """

    # ---------------------------------------------------------------- identity
    #: ``--device`` value, e.g. ``"cuda"``, ``"npu"``, ``"xpu"``, ``"cpu"``.
    name: ClassVar[str]
    #: other accepted spellings of ``name`` (e.g. ``("ascend",)``).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: ``torch.device(...).type`` of this driver's tensors.
    device_type: ClassVar[str]
    #: ``torch.distributed`` backend name handed to vLLM's distributed init.
    dist_backend: ClassVar[str]
    #: environment variable that restricts visible devices (``None`` = none).
    visible_devices_env: ClassVar[str | None]
    #: auto-detect priority: the highest *usable* wins; ties break by name.
    priority: ClassVar[int]
    #: distribution name -> PEP 440 specifier the driver needs.
    vendor_requirements: ClassVar[dict[str, str]] = {}
    #: top-level vendor modules of this driver's stack -> how to repair their runtime when importing them
    #: raises (e.g. ``torch_npu`` -> "install CANN ..."). When another driver runs, such a module that
    #: raises on import is hidden from that process (:func:`omni_backends.probing.hide_broken_vendor_packages`).
    vendor_modules: ClassVar[dict[str, str]] = {}
    #: Backend interface versions implemented (see :data:`INTERFACE_VERSION`).
    interface_versions: ClassVar[tuple[int, ...]] = (INTERFACE_VERSION,)
    #: how this project verifies the driver (strongest first).
    verification: ClassVar[tuple[Verification, ...]] = ()
    #: ``vllm.platforms.current_platform.device_type`` this driver needs.
    vllm_device_type: ClassVar[str]

    # ======================================================================
    # 1. Required: abstract, called by the core runner (core/) or by this
    #    package's selection and placement. A driver writes every one.
    # ======================================================================

    # ---------------------------------------------------------- probe
    @classmethod
    @abc.abstractmethod
    def probe(cls) -> ProbeResult:
        """Say whether this driver can run here. Cheap; never raises.

        Must not initialise the device runtime in this process (use NVML or an
        equivalent), must not import the vendor's vLLM stack unless the
        package is installed, and must catch every exception (a vendor import
        may raise ``OSError``/``RuntimeError`` on a host without the hardware),
        reporting it in ``ProbeResult.error``.
        """

    # ---------------------------------------------------------- capabilities
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """Static capability flags of this driver on the installed stack."""

    # ---------------------------------------------------------- device
    @abc.abstractmethod
    def device(self, index: int | None = None) -> "torch.device":
        """The ``torch.device`` for ``index`` (current device when ``None``)."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """Number of visible devices (0 when none)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for all work on the current device (``torch.accelerator.synchronize``)."""

    @abc.abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` device memory in bytes (``torch.accelerator.get_memory_info``)."""

    @abc.abstractmethod
    def to_host(self, tensor: "torch.Tensor") -> "torch.Tensor":
        """Copy ``tensor`` to CPU and return it *complete*: the caller may read
        it at once. Uses a non-blocking copy plus event sync where D2H is
        stream-ordered (``Capabilities.d2h_stream_ordered``), a blocking copy
        otherwise."""

    # ---------------------------------------------------------- forward context
    @abc.abstractmethod
    def forward_context(self, attn_metadata: Any, vllm_config: Any,
                        **kwargs: Unpack[ForwardContextArgs]) -> ContextManager[None]:
        """Set vLLM's forward context for one forward pass; the core calls it as
        ``forward_context(None, vllm_config, num_tokens=p, cudagraph_runtime_mode=
        CUDAGraphMode.FULL, batch_descriptor=BatchDescriptor(num_tokens=p))``.

        Takes the arguments of ``vllm.forward_context.set_forward_context`` plus
        the extras some vendors need, as keywords: :class:`ForwardContextArgs`
        (their one home; every driver keeps this signature, the kit and
        ``tests/test_backend_contract.py`` compare it). A driver maps them onto
        its vendor call, dropping what that call does not take, raises
        ``TypeError`` for a keyword :class:`ForwardContextArgs` lacks, and
        :class:`~omni_backends.errors.OmniBackendError` for an argument its
        vendor cannot honour (e.g. ``ubatch_slices`` on Ascend).
        """

    # ---------------------------------------------------------- graph wrapping
    @abc.abstractmethod
    def wrap_graph(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any) -> Callable[..., Any]:
        """Wrap ``runnable`` for static-graph capture/replay in ``runtime_mode``
        (a ``CUDAGraphMode``) with the vendor's wrapper
        (``vllm.compilation.cuda_graph.CUDAGraphWrapper`` /
        ``vllm_ascend.compilation.acl_graph.ACLGraphWrapper``). Returns
        ``runnable`` itself when the driver has no static graphs."""

    # ---------------------------------------------------------- runner / worker bases
    @abc.abstractmethod
    def model_runner_base(self, v2: bool = False) -> type:
        """The vendor's model-runner class the omni runner builds on (V1 or V2).
        Raises :class:`~omni_backends.errors.OmniBackendError` if ``v2`` is asked
        for and the driver cannot run it."""

    @abc.abstractmethod
    def worker_base(self) -> type:
        """The vendor's vLLM worker class the omni workers subclass."""

    # ======================================================================
    # 2. Defaults: called by the core or this package; override where the
    #    device differs.
    # ======================================================================

    def peak_memory(self) -> int | None:
        """Peak device memory this process's allocator has held, in bytes
        (``torch.accelerator.max_memory_reserved``: allocator blocks incl. graph
        pools, not the driver context); ``None`` where the driver cannot tell
        (the default). Never raises."""
        return None

    def distributed_backend(self) -> str:
        """The ``torch.distributed`` backend name vLLM's distributed init must
        receive in every rank (``nccl`` / ``hccl`` / ``xccl`` or ``ccl`` / ``gloo``).
        Default: :attr:`dist_backend`; a driver whose name depends on the
        installed stack (XPU) overrides it. Raises
        :class:`~omni_backends.errors.OmniBackendError` when no backend is available."""
        return self.dist_backend

    @classmethod
    def parse_visible_devices(cls, value: str, env: Mapping[str, str], device_count: int | None = None) -> tuple[str, ...]:
        """The devices ``visible_devices_env=value`` makes visible: one id per
        device index, in the runtime's index order (the rank order of
        :func:`omni_backends.placement.plan`). ``env`` is the rest of the
        environment (read only; some runtimes read a second variable);
        ``device_count`` the host's device count when known (ids past it are
        refused). ``()`` means the value hides every device.

        Default (:func:`omni_backends.device_lists.parse_generic`): ``""`` hides
        all; comma-separated entries as written, none empty or repeated. A driver
        whose runtime has other rules (order, UUIDs, sub-devices) overrides it.
        Raises :class:`~omni_backends.errors.PlacementError` naming the fix."""
        return parse_generic(cls.visible_devices_env or "visible devices", value, device_count)

    @classmethod
    def child_env_for_device(cls, device_id: str, env: Mapping[str, str]) -> dict[str, str]:
        """Variables for a child process that should see only ``device_id`` (an
        id :meth:`parse_visible_devices` returned; there its index is 0).
        ``env`` is the parent's environment (read only). Default
        ``{visible_devices_env: device_id}``; ``{}`` without a variable."""
        return {cls.visible_devices_env: device_id} if cls.visible_devices_env else {}

    def new_event(self, enable_timing: bool = False) -> Any:
        """A new event on the current device (``torch.Event``) with ``record()``,
        ``synchronize()``, ``wait(stream)`` and, if ``enable_timing``,
        ``elapsed_time`` (ms). The core calls it only where
        ``capabilities().events`` is True (a driver declaring events writes it;
        the kit checks both). Default: raises
        :class:`~omni_backends.errors.OmniBackendError` (no events)."""
        from omni_backends.errors import OmniBackendError

        raise OmniBackendError(f"driver {self.name!r} has no device events (capabilities().events is False); the "
                               "caller should have read the capability and synchronized instead")

    def graph_capture_context(self, device: "torch.device") -> ContextManager[Any]:
        """Context for a capture session (``vllm.distributed.parallel_state.graph_capture``).
        Default: a null context (no graphs)."""
        return contextlib.nullcontext()

    def captured_graphs(self, wrapped: Any) -> int | None:
        """How many graphs ``wrapped`` (what :meth:`wrap_graph` returned) holds,
        for the talker MTP's graph report (``core.hooks.TalkerMTP.graph_stats``);
        ``None`` when the wrapper does not tell. Default: ``None``."""
        return None

    def prepare_sampler(self, sampler: Any) -> Any:
        """Give the V1 sampler a model runner built (``GPUModelRunner.sampler``:
        ``vllm.v1.sample.sampler.Sampler`` / ``AscendSampler``) the driver's
        sampling rules, in place, and return it; the omni V1 runner calls this
        once after vLLM's ``__init__``. The rules are the reference sampler's
        (:mod:`omni_backends.testing.reference_sampler`): a random row whose ``top_k`` /
        ``top_p`` keep one token returns the greedy token, ties towards the
        lowest token id (``omni_backends.patches.install_one_token_greedy``
        adds this to vLLM's ``TopKTopPSampler``). Default: ``sampler`` unchanged."""
        return sampler

    def check_model_config(self, hf_config: Any) -> None:
        """Refuse, before any engine starts, a model this device cannot run.

        ``hf_config`` is the model's ``config.json`` as a dict. Raises
        :class:`~omni_backends.errors.BadInputError` saying what to change
        (e.g. an attention head size the device's attention backend lacks).
        Default: accept everything.
        """

    def vllm_platform_env(self) -> dict[str, str]:
        """Environment variables that make vLLM resolve this driver's platform
        when set before ``vllm.platforms.current_platform`` is first read.
        Default: none."""
        return {}

    def vllm_env_defaults(self) -> dict[str, str]:
        """Environment variables this driver's vLLM engines need unless the user set them: written into the
        environment of this process and its children by the selection (``export_selection``), never over a
        value already there. Default: none."""
        return {}

    def check_vllm_platform(self) -> None:
        """Raise :class:`~omni_backends.errors.PlatformMismatchError` if vLLM's
        ``current_platform.device_type`` is not ``vllm_device_type``."""
        from omni_backends.errors import PlatformMismatchError
        from vllm.platforms import current_platform

        got = getattr(current_platform, "device_type", None)
        if got != self.vllm_device_type:
            raise PlatformMismatchError(
                f"omni-backends selected driver {self.name!r} (vLLM platform {self.vllm_device_type!r}) but vLLM "
                f"resolved platform {got!r}. Select the matching device with --device / OMNI_BACKENDS_DEVICE, or set "
                f"{self.vllm_platform_env() or 'VLLM_PLUGINS'} before vLLM is imported."
            )

    @classmethod
    def identity(cls) -> dict[str, Any]:
        """Identity attributes as a JSON-able dict."""
        return {
            "name": cls.name,
            "aliases": list(cls.aliases),
            "device_type": cls.device_type,
            "dist_backend": cls.dist_backend,
            "visible_devices_env": cls.visible_devices_env,
            "priority": cls.priority,
            "vendor_requirements": dict(cls.vendor_requirements),
            "interface_versions": list(cls.interface_versions),
            "verification": [v.value for v in cls.verification],
        }

    # ---------------------------------------------------------- report
    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


__all__ = [
    "FORWARD_CONTEXT_DEFAULTS",
    "FORWARD_CONTEXT_EXTRAS",
    "FORWARD_CONTEXT_KEYWORDS",
    "INTERFACE_VERSION",
    "Backend",
    "Capabilities",
    "ForwardContextArgs",
    "ProbeResult",
    "ProbeState",
    "Verification",
    "capture_sizes",
    "check_attn_metadata",
    "unknown_forward_context_keywords",
]
