"""The Backend interface: everything that differs between devices, in one place.

A driver is a subclass of :class:`Backend` registered under the entry-point
group ``omni_backends.drivers``. The core omni runner (``core/``) calls only
this interface; it never names a device.

Groups, in the order a driver should implement them:

1. identity and probe      -- class attributes + :meth:`Backend.probe`
2. capabilities            -- :meth:`Backend.capabilities`
3. device operations       -- device, streams, events, memory, generators,
                              ordering-safe copies, the torch graph primitive
4. forward context         -- :meth:`Backend.forward_context`
5. graph wrapping          -- :meth:`Backend.wrap_graph` and friends
6. sampler                 -- :meth:`Backend.make_sampler`
7. CPU/device buffers      -- :meth:`Backend.make_buffer`, :meth:`Backend.copy_to_device`
8. attention metadata      -- :meth:`Backend.common_attn_metadata_cls` and the
                              shared invariant check :func:`check_attn_metadata`
9. runner/worker bases     -- :meth:`Backend.model_runner_base`, :meth:`Backend.worker_base`
10. vLLM platform binding  -- :meth:`Backend.vllm_platform_env`, :meth:`Backend.check_vllm_platform`

Vendor stacks (``vllm``, ``torch_npu``, ``intel_extension_for_pytorch``) are
imported lazily inside methods, never at module import, and a driver never
rebinds attributes of ``torch``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Iterator, Mapping

from omni_backends.device_lists import parse_generic

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
    """How a driver is verified in this project (shown by ``omni-backends devices``)."""

    ENGINE = "engine run"  #: a real vLLM engine ran through it in CI
    DEVICE = "device level"  #: torch-level tests ran on the real device
    STATIC = "static"  #: vendor symbols checked against the vendor's source
    SIMULATED = "simulated"  #: behaviour tested on a simulated device only


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
    - ``v1_runner`` / ``v2_runner``: vLLM's V1 / V2 model runner can run.
    - ``talker_mtp_graph``: the talker MTP head may be graph-captured.
    - ``device_sync_after_replay_safe``: a device-wide synchronize right after a
      graph replay is safe (False on XPU; use a stream synchronize instead).
    """

    static_graph_modes: tuple[str, ...] = ()
    h2d_stream_ordered: bool = True
    d2h_stream_ordered: bool = True
    pinned_memory: bool = False
    v1_runner: bool = True
    v2_runner: bool = False
    talker_mtp_graph: bool = False
    device_sync_after_replay_safe: bool = True

    @property
    def static_graphs(self) -> bool:
        return bool(self.static_graph_modes)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["static_graph_modes"] = list(self.static_graph_modes)
        return d


def capture_sizes(max_batch: int, *, min_size: int = 1) -> list[int]:
    """Batch sizes to capture graphs for; the one policy every driver shares.

    Mirrors vLLM's default ladder (``VllmConfig._set_cudagraph_sizes``:
    1, 2, 4, then multiples of 8 up to 256, then multiples of 16), cut at
    ``max_batch`` and always *including* ``max_batch`` itself, so the largest
    configured batch never falls back to eager.

    Returns a strictly increasing list of ints in ``[min_size, max_batch]``.
    Raises ``ValueError`` if ``max_batch < 1`` or ``min_size`` is out of range.
    """
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    if min_size < 1 or min_size > max_batch:
        raise ValueError(f"min_size must be in [1, {max_batch}], got {min_size}")
    ladder = [1, 2, 4, *range(8, 256, 8), *range(256, max_batch + 1, 16)]
    sizes = sorted({s for s in ladder if min_size <= s <= max_batch} | {max_batch})
    return sizes


def check_attn_metadata(
    query_start_loc: "torch.Tensor",
    seq_lens: "torch.Tensor",
    slot_mapping: "torch.Tensor | None" = None,
    *,
    num_reqs: int | None = None,
    num_actual_tokens: int | None = None,
) -> None:
    """Check the invariants of a ``CommonAttentionMetadata`` batch.

    Arguments mirror ``vllm.v1.attention.backend.CommonAttentionMetadata``:
    ``query_start_loc`` int32 ``[num_reqs + 1]``, ``seq_lens`` int32
    ``[num_reqs]``, ``slot_mapping`` int64 ``[num_tokens]`` (negative = padding,
    never written to the KV cache).

    Raises ``ValueError`` naming the broken invariant:
    query_start_loc starts at 0 and is non-decreasing; ``seq_lens >= query_lens``
    per request; ``num_actual_tokens`` equals ``query_start_loc[num_reqs]``;
    padding slots (< 0) appear only at or after ``num_actual_tokens``.
    """
    qsl = query_start_loc.detach().to("cpu").long()
    sl = seq_lens.detach().to("cpu").long()
    n = int(num_reqs) if num_reqs is not None else sl.numel()
    if qsl.numel() < n + 1:
        raise ValueError(f"query_start_loc has {qsl.numel()} entries, need num_reqs + 1 = {n + 1}")
    if int(qsl[0]) != 0:
        raise ValueError(f"query_start_loc must start at 0, starts at {int(qsl[0])}")
    q = qsl[1 : n + 1] - qsl[:n]
    if bool((q < 0).any()):
        raise ValueError(f"query_start_loc must be monotonic non-decreasing: {qsl[: n + 1].tolist()}")
    if bool((sl[:n] < q).any()):
        raise ValueError(f"seq_lens must be >= query_lens per request: seq_lens={sl[:n].tolist()} query_lens={q.tolist()}")
    total = int(qsl[n])
    if num_actual_tokens is not None and int(num_actual_tokens) != total:
        raise ValueError(f"num_actual_tokens={num_actual_tokens} but query_start_loc[num_reqs]={total}")
    if slot_mapping is not None:
        sm = slot_mapping.detach().to("cpu").long()
        if bool((sm[:total] < 0).any()):
            raise ValueError("a real token (index < num_actual_tokens) has a negative (padding) slot id")


class Backend(abc.ABC):
    """One hardware backend. One instance per process, selected once.

    Identity is data (class attributes); behaviour is methods. Every method
    that names a vLLM or vendor symbol delegates to it; nothing here
    re-implements vLLM.
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

    # ------------------------------------------------------------------ probe
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

    # ---------------------------------------------------------- device ops
    @abc.abstractmethod
    def device(self, index: int | None = None) -> "torch.device":
        """The ``torch.device`` for ``index`` (current device when ``None``)."""

    @abc.abstractmethod
    def set_device(self, index: int) -> None:
        """Make device ``index`` current for this thread
        (``torch.accelerator.set_device_index``). Raises ``RuntimeError`` for a
        bad index."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """Number of visible devices (0 when none)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for all work on the current device (``torch.accelerator.synchronize``)."""

    @abc.abstractmethod
    def new_stream(self) -> Any:
        """A new side stream on the current device (``torch.Stream``)."""

    @abc.abstractmethod
    def current_stream(self) -> Any:
        """The current stream (``torch.accelerator.current_stream``)."""

    @abc.abstractmethod
    def stream_context(self, stream: Any) -> ContextManager[Any]:
        """Make ``stream`` current inside the ``with`` block."""

    @abc.abstractmethod
    def new_event(self, enable_timing: bool = False) -> Any:
        """A new event (``torch.Event``) with ``record()``, ``synchronize()``,
        ``wait(stream)`` and, if ``enable_timing``, ``elapsed_time`` (ms)."""

    @abc.abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` device memory in bytes (``torch.accelerator.get_memory_info``)."""

    def peak_memory(self) -> int | None:
        """Peak device memory this process's allocator has held, in bytes
        (``torch.accelerator.max_memory_reserved``: allocator blocks incl. graph
        pools, not the driver context); ``None`` where the driver cannot tell
        (the default). Never raises."""
        return None

    @abc.abstractmethod
    def empty_cache(self) -> None:
        """Release cached, unused allocator blocks (``torch.accelerator.empty_cache``)."""

    @abc.abstractmethod
    def generator(self, seed: int) -> "torch.Generator":
        """A ``torch.Generator`` on this device seeded with ``seed``; the same
        seed yields the same random stream."""

    def is_device_tensor(self, tensor: "torch.Tensor") -> bool:
        """True if ``tensor`` lives on this driver's device type. Replaces every
        ``t.is_cuda`` / ``device.type == "cuda"`` test in the core."""
        return tensor.device.type == self.device_type

    @abc.abstractmethod
    def to_host(self, tensor: "torch.Tensor") -> "torch.Tensor":
        """Copy ``tensor`` to CPU and return it *complete*: the caller may read
        it at once. Uses a non-blocking copy plus event sync where D2H is
        stream-ordered (``Capabilities.d2h_stream_ordered``), a blocking copy
        otherwise."""

    # torch-level graph primitive (what the vendor graph wrappers build on)
    def new_graph(self) -> Any:
        """A new, empty device graph (``torch.cuda.CUDAGraph`` /
        ``torch.npu.NPUGraph`` / ``torch.xpu.XPUGraph``).

        Raises ``NotImplementedError`` when ``capabilities().static_graphs`` is False.
        """
        raise NotImplementedError(f"driver {self.name!r} has no static graphs (capabilities().static_graph_modes is empty)")

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> ContextManager[Any]:
        """Capture the work issued inside the block into ``graph``
        (``torch.cuda.graph(graph, pool=, stream=)`` and its vendor twins).
        Replay with ``graph.replay()``: inputs must live in persistent buffers
        updated in place. Raises ``NotImplementedError`` without static graphs."""
        raise NotImplementedError(f"driver {self.name!r} has no static graphs")

    def graph_pool_handle(self) -> Any:
        """A memory-pool handle shared by several captures (``torch.cuda.graph_pool_handle``)."""
        raise NotImplementedError(f"driver {self.name!r} has no static graphs")

    # ---------------------------------------------------------- distributed
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

    # ------------------------------------------------------ forward context
    @abc.abstractmethod
    def forward_context(
        self,
        attn_metadata: Any,
        vllm_config: Any,
        *,
        num_tokens: int | None = None,
        num_tokens_across_dp: "torch.Tensor | None" = None,
        cudagraph_runtime_mode: Any = None,
        batch_descriptor: Any = None,
        ubatch_slices: Any = None,
        slot_mapping: Any = None,
        skip_compiled: bool = False,
        num_actual_tokens: int | None = None,
        model: Any = None,
        is_profile: bool = False,
    ) -> ContextManager[None]:
        """Set vLLM's forward context for one forward pass.

        Takes the arguments of ``vllm.forward_context.set_forward_context``
        (``cudagraph_runtime_mode`` is a ``CUDAGraphMode``; ``None`` means
        ``CUDAGraphMode.NONE``; ``batch_descriptor`` a ``BatchDescriptor``) plus
        the extras some vendors need (``num_actual_tokens``, ``model``,
        ``is_profile``); each driver maps them onto its vendor call and drops
        what that call does not take.
        """

    # ----------------------------------------------------- graph wrapping
    @abc.abstractmethod
    def wrap_graph(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any) -> Callable[..., Any]:
        """Wrap ``runnable`` for static-graph capture/replay in ``runtime_mode``
        (a ``CUDAGraphMode``) with the vendor's wrapper
        (``vllm.compilation.cuda_graph.CUDAGraphWrapper`` /
        ``vllm_ascend.compilation.acl_graph.ACLGraphWrapper``). Returns
        ``runnable`` itself when the driver has no static graphs."""

    def graph_capture_context(self, device: "torch.device") -> ContextManager[Any]:
        """Context for a capture session (``vllm.distributed.parallel_state.graph_capture``).
        Default: a null context (no graphs)."""
        return contextlib.nullcontext()

    def after_graph_replay(self, forward_context: Any, num_tokens: int) -> None:
        """Hook run after a FULL-graph replay (Ascend patches frozen kernel
        arguments here via ``update_full_graph_params``). Default: nothing."""

    def clear_graphs(self) -> None:
        """Drop every captured graph (``CUDAGraphWrapper.clear_all_graphs``). Default: nothing."""

    # ------------------------------------------------------------ sampler
    @abc.abstractmethod
    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        """The vendor's V1 sampler (``vllm.v1.sample.sampler.Sampler`` /
        ``vllm_ascend.sample.sampler.AscendSampler``): called as
        ``sampler(logits=[num_reqs, vocab] float, sampling_metadata=SamplingMetadata)``
        and returning ``SamplerOutput(sampled_token_ids=[num_reqs, 1] int32, ...)``."""

    def prepare_sampler(self, sampler: Any) -> Any:
        """Give the V1 sampler a model runner built (``GPUModelRunner.sampler``:
        ``vllm.v1.sample.sampler.Sampler`` / ``AscendSampler``) the driver's
        sampling rules, in place, and return it; the omni V1 runner calls this
        once after vLLM's ``__init__``. The rules are the reference sampler's
        (:mod:`omni_backends.reference_sampler`): a random row whose ``top_k`` /
        ``top_p`` keep one token returns the greedy token, ties towards the
        lowest token id (``omni_backends.vllm_upstream.install_one_token_greedy``
        adds this to vLLM's ``TopKTopPSampler``). Default: ``sampler`` unchanged."""
        return sampler

    # ------------------------------------------------------------ buffers
    @abc.abstractmethod
    def make_buffer(self, *size: int, dtype: "torch.dtype", numpy: bool = True) -> Any:
        """A CPU/device buffer pair with ``vllm.v1.utils.CpuGpuBuffer``
        semantics (``.cpu``, ``.gpu``, ``.np``; ``numpy`` must be False for
        bfloat16), pinned when the device supports it."""

    @abc.abstractmethod
    def copy_to_device(self, buffer: Any, n: int | None = None) -> "torch.Tensor":
        """Copy ``buffer.cpu[:n]`` into ``buffer.gpu[:n]`` and return the device
        slice, safe to consume by the next kernel and safe against the caller
        rewriting ``buffer.cpu`` right after. Where H2D is not stream-ordered
        the driver copies blocking or makes the current stream wait on an
        event."""

    # ------------------------------------------------- attention metadata
    @abc.abstractmethod
    def common_attn_metadata_cls(self) -> type:
        """The common attention-metadata class the vendor builders take
        (``vllm.v1.attention.backend.CommonAttentionMetadata`` /
        ``vllm_ascend.attention.utils.AscendCommonAttentionMetadata``)."""

    def write_kv_cache(
        self,
        key: "torch.Tensor",
        value: "torch.Tensor",
        key_cache: "torch.Tensor",
        value_cache: "torch.Tensor",
        slot_mapping: "torch.Tensor",
    ) -> None:
        """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into
        the paged caches ``[num_blocks, block_size, num_kv_heads, head_size]``
        (vLLM's flash layout) at ``slot_mapping`` (int64 ``[>= num_tokens]``,
        slot = block * block_size + offset). A slot < 0 is padding and is never
        written. This default is the torch (non-kernel) write path for forwards
        run outside vLLM's attention layers; a driver may override it with the
        vendor kernel (``reshape_and_cache_flash``) if that skips padding too.
        Raises ``ValueError`` if a slot is past the end of the cache."""
        import torch

        slots = slot_mapping[: key.shape[0]].to(torch.int64)
        real = slots >= 0
        capacity = key_cache.shape[0] * key_cache.shape[1]
        if bool((slots >= capacity).any()):
            raise ValueError(f"slot_mapping has a slot >= the cache's {capacity} slots; check the block table")
        for src, cache in ((key, key_cache), (value, value_cache)):
            cache.view(capacity, *cache.shape[2:]).index_copy_(0, slots[real], src[real].to(cache.dtype))

    # ---------------------------------------------------- runner / worker
    @abc.abstractmethod
    def model_runner_base(self, v2: bool = False) -> type:
        """The vendor's model-runner class the omni runner builds on (V1 or V2).
        Raises :class:`~omni_backends.errors.OmniBackendError` if ``v2`` is asked
        for and the driver cannot run it."""

    @abc.abstractmethod
    def worker_base(self) -> type:
        """The vendor's vLLM worker class the omni workers subclass."""

    # ------------------------------------------------------ model checks
    def check_model_config(self, hf_config: Any) -> None:
        """Refuse, before any engine starts, a model this device cannot run.

        ``hf_config`` is the model's ``config.json`` as a dict. Raises
        :class:`~omni_backends.errors.BadInputError` saying what to change
        (e.g. an attention head size the device's attention backend lacks).
        Default: accept everything.
        """

    # --------------------------------------------------- vLLM platform
    def vllm_platform_env(self) -> dict[str, str]:
        """Environment variables that make vLLM resolve this driver's platform
        when set before ``vllm.platforms.current_platform`` is first read.
        Default: none."""
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

    # ------------------------------------------------------------- report
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

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


@contextlib.contextmanager
def null_stream_context(stream: Any) -> Iterator[Any]:
    """A stream context for devices without streams (CPU)."""
    yield stream
