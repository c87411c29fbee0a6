"""Load vLLM-Omni's own model modules without vLLM-Omni's global patches.

``import vllm_omni`` runs its ``__init__``, which imports ``patch.py``: that
replaces vLLM's ``Request``, ``EngineCoreRequest``, ``EngineCoreOutput(s)``,
``TokensPrompt`` and ``MRotaryEmbedding`` in every loaded vLLM module. The
wheel also registers a ``vllm.general_plugins`` entry point
(``vllm_omni_register_models``) that vLLM would load in every process. The
core runner serves vLLM-Omni's *models*; it must not let that package alter
the process. So:

- :func:`load_module` imports ``vllm_omni.<name>`` under a bare ``vllm_omni``
  package object (its ``__path__`` only, so ``__init__``/``patch.py`` never
  run; the sub-packages' own ``__init__`` files do run, and none patches
  vLLM: ``tests/core/test_vllm_omni_loader.py`` checks vLLM's classes are the
  same objects afterwards);
- :func:`plugin_allowlist` / :func:`keep_plugin_out` set ``VLLM_PLUGINS`` to
  every installed vLLM plugin *except* vLLM-Omni's (vLLM honours the variable
  in every process it starts, ``vllm.plugins.load_plugins_by_group``);
- vLLM-Omni's model code asks ``vllm_omni.platforms.current_omni_platform``
  about the device (e.g. ``supports_torch_inductor()``, which raises on its
  ``UnspecifiedOmniPlatform``, the one it picks on a CPU host). The loader
  installs :class:`HostOmniPlatform`, answered from the selected
  :class:`~omni_backends.backend.Backend` instead of vLLM-Omni's own
  pynvml / torch-npu detection (``supports_torch_inductor()``: from
  :data:`INNER_COMPILE_ENV`, False by default);
- pickling: vLLM hands its ``VllmConfig`` to every process it starts by
  pickle (the engine core, the workers; ``spawn`` on the cpu platform and
  wherever CUDA is initialised), and the model's ``hf_config`` is vLLM-Omni's
  config class. Pickled by reference, the child would import it as
  ``vllm_omni....`` while unpickling -- before any vLLM plugin runs there --
  and so run the real ``vllm_omni/__init__`` and its patches. The loader
  registers a ``copyreg`` reducer for each vLLM-Omni config class it loads
  (:func:`_reduce_config`): the pickle names :func:`_rebuild_config` of this
  module instead, which loads the class bare in whichever process unpickles
  it (and registers the reducers there too, for the processes that one
  starts);
- ``torchaudio``: the talker's ``vllm_omni.utils.audio`` imports
  ``torchaudio.functional.melscale_fbanks`` at module level (a mel filter bank
  for reference-audio speaker embeddings, used only by the ``Base`` voice-clone
  task). The CPU stack has no torchaudio (no build exists for torch 2.13), so
  when it is missing the loader puts a one-function stub in ``sys.modules``
  for the duration of the import only (transformers imported before, so its
  own probe for torchaudio never sees the stub); calling it raises
  :class:`NotImplementedError` naming the fix. ``CustomVoice`` and
  ``VoiceDesign`` requests never call it.

Each change of another's object above is a declared patch in :mod:`core.patches` (what, why, versions, until,
proven by ``check-drift``): ``vllm_omni_bare_package`` (the bare package), ``vllm_omni_platform`` (its platform
global), ``vllm_omni_config_pickling`` (the reducers) and ``torchaudio_stub``; this module decides when.

Nothing of vLLM-Omni is vendored: it is installed from PyPI
(``vllm-omni==0.30.0 --no-deps``, ``scripts/setup.sh``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
import types
from typing import Any, MutableMapping

from core.patches.torchaudio_stub import torchaudio_for_import
from core.patches.vllm_omni_bare_package import install_bare_package
from core.patches.vllm_omni_config_pickling import pickle_through
from core.patches.vllm_omni_platform import install_omni_platform
from omni_backends.backend import Backend

DISTRIBUTION = "vllm-omni"
PACKAGE = "vllm_omni"
#: the vLLM plugin groups whose entry points VLLM_PLUGINS filters
PLUGIN_GROUPS = ("vllm.general_plugins", "vllm.platform_plugins", "vllm.io_processor_plugins",
                 "vllm.stat_logger_plugins")

_lock = threading.RLock()


class VllmOmniNotInstalled(ImportError):
    """vLLM-Omni's wheel is not installed (``pip install --no-deps vllm-omni==0.30.0``)."""


def installed_version() -> str | None:
    """The installed ``vllm-omni`` distribution's version, or None."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------ plugins
def _vllm_omni_entry_points() -> set[str]:
    names = set()
    for group in PLUGIN_GROUPS:
        for ep in importlib.metadata.entry_points(group=group):
            if ep.value.split(".", 1)[0].split(":", 1)[0] == PACKAGE:
                names.add(ep.name)
    return names


def plugin_allowlist() -> str | None:
    """The ``VLLM_PLUGINS`` value that loads every installed vLLM plugin except
    vLLM-Omni's (comma-separated entry-point names), or None when no vLLM-Omni
    plugin is installed (nothing to keep out)."""
    omni = _vllm_omni_entry_points()
    if not omni:
        return None
    keep = sorted({ep.name for g in PLUGIN_GROUPS for ep in importlib.metadata.entry_points(group=g)} - omni)
    return ",".join(keep)


def keep_plugin_out(env: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``VLLM_PLUGINS`` in ``env`` (default ``os.environ``) so vLLM never
    loads vLLM-Omni's plugin (which would import ``vllm_omni`` and run its
    patches) in this process or the ones it starts. Call before vLLM loads
    plugins (``core.stage.make_engine`` does). Returns the value now in effect.

    Raises ``ValueError`` if ``VLLM_PLUGINS`` is already set and names a
    vLLM-Omni plugin (remove it from the list)."""
    env = os.environ if env is None else env
    omni = _vllm_omni_entry_points()
    current = env.get("VLLM_PLUGINS")
    if current is not None:
        named = omni & {p.strip() for p in current.split(",")}
        if named:
            raise ValueError(
                f"VLLM_PLUGINS={current!r} loads vLLM-Omni's plugin(s) {sorted(named)}, which import vllm_omni and "
                "patch vLLM's classes in every process; remove them from VLLM_PLUGINS (the core loads vLLM-Omni's "
                "models itself, core.models.vllm_omni)"
            )
        return current
    allow = plugin_allowlist()
    if allow is not None:
        env["VLLM_PLUGINS"] = allow
    return allow


def imported_normally() -> bool:
    """Whether ``vllm_omni`` was imported the normal way in this process (its ``__init__`` ran, and with it
    ``patch.py``: vLLM's classes are replaced here), e.g. by a vLLM-Omni user's ``import vllm_omni`` or
    ``from vllm_omni import Omni``; also after such an import failed part-way (``vllm_omni.patch`` loaded)."""
    mod = sys.modules.get(PACKAGE)
    if mod is not None and not getattr(mod, "__omni_bare__", False):
        return True
    return sys.modules.get(f"{PACKAGE}.patch") is not None


def load_vllm_plugins() -> None:
    """Load vLLM's general plugins in this process (vLLM's ``load_general_plugins``) with vLLM-Omni's kept out
    first (:func:`keep_plugin_out`): whatever loads them first in a process that starts engines must come
    through here, or vLLM-Omni's plugin imports ``vllm_omni`` and its patches apply to the engines. Raises
    ``ValueError`` as :func:`keep_plugin_out` does."""
    keep_plugin_out()
    from vllm.plugins import load_general_plugins

    load_general_plugins()


# ------------------------------------------------------------------ platform
#: ``1``: vLLM-Omni's model code may ``torch.compile`` its inner modules with Inductor
#: (``supports_torch_inductor()`` answers True, as vLLM-Omni's own CUDA platform does; e.g. the Qwen3-TTS code
#: predictor, ``torch.compile(dynamic=False)`` per batch bucket at its first call); unset or ``0``: it may not
#: (graphs go through the Backend). Read when the host platform is installed, in every process (the engine
#: core and workers inherit the environment). A measurement switch (issue 25): setting it asserts that
#: Inductor generates kernels for the selected device.
INNER_COMPILE_ENV = "OMNI_BACKENDS_MODEL_INNER_COMPILE"


def inner_compile_allowed(env: Any = None) -> bool:
    """Whether :data:`INNER_COMPILE_ENV` lets a model compile its inner modules (``env``: default
    ``os.environ``). Raises ``ValueError`` naming the variable for a value other than unset, ``0`` or ``1``."""
    value = (os.environ if env is None else env).get(INNER_COMPILE_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{INNER_COMPILE_ENV}={value!r}: use 1 (vLLM-Omni's model code may torch.compile its inner "
                         "modules) or 0 / unset (it may not)")
    return value == "1"


def host_omni_platform(backend: Backend) -> Any:
    """A ``vllm_omni.platforms.interface.OmniPlatform`` for ``backend``.

    vLLM-Omni's model code asks its platform ``is_npu()`` / ``is_xpu()`` /
    ``is_cuda()`` (from the driver's torch device type),
    ``supports_torch_inductor()`` (False unless :data:`INNER_COMPILE_ENV`
    is ``1``: by default the host does not let a model torch.compile its
    inner modules on its own; graphs go through the Backend),
    ``supports_talker_mtp_graph_capture()`` (the driver's
    ``capabilities().talker_mtp_graph``) and ``synchronize()``
    (``Backend.synchronize``). Raises ``ValueError`` for a bad
    :data:`INNER_COMPILE_ENV` value."""
    from vllm_omni.platforms.interface import OmniPlatformEnum, UnspecifiedOmniPlatform

    inductor = inner_compile_allowed()

    try:  # vLLM-Omni names its platforms by torch device type; one it lacks (e.g. the CPU) is "unspecified"
        enum = OmniPlatformEnum(backend.device_type)
    except ValueError:
        enum = OmniPlatformEnum.UNSPECIFIED
    mtp_graph = bool(backend.capabilities().talker_mtp_graph)

    class HostOmniPlatform(UnspecifiedOmniPlatform):
        _omni_enum = enum
        device_type = backend.device_type

        @classmethod
        def supports_torch_inductor(cls) -> bool:
            return inductor

        @classmethod
        def supports_talker_mtp_graph_capture(cls) -> bool:
            return mtp_graph

        @classmethod
        def synchronize(cls) -> None:
            backend.synchronize()

    HostOmniPlatform.__qualname__ = HostOmniPlatform.__name__ = f"HostOmniPlatform[{backend.name}]"
    return HostOmniPlatform()


# ------------------------------------------------------------------ loader
def _bare_package() -> types.ModuleType:
    """``sys.modules['vllm_omni']`` as a bare package (``__init__`` not run).

    Raises :class:`VllmOmniNotInstalled` when the wheel is missing and
    ``RuntimeError`` when the real package was already imported (its patches
    have run in this process: import order is the caller's bug)."""
    mod = sys.modules.get(PACKAGE)
    if mod is not None:
        if not getattr(mod, "__omni_bare__", False):
            raise RuntimeError(
                "vllm_omni was imported normally in this process, so its patch.py already replaced vLLM classes; "
                "load vLLM-Omni models only through core.models.vllm_omni and keep its plugin out (VLLM_PLUGINS)"
            )
        return mod
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise VllmOmniNotInstalled(
            "vLLM-Omni is not installed; install its wheel without dependencies: "
            "pip install --no-deps vllm-omni==0.30.0 && pip install soundfile prettytable (scripts/setup.sh does)"
        )
    return install_bare_package(PACKAGE, list(spec.submodule_search_locations), spec.origin)


# ------------------------------------------------------------------ pickling
_pickled_by_loader: set[type] = set()


def _rebuild_config(name: str, qualname: str) -> Any:
    """A new, empty instance of vLLM-Omni's class ``qualname`` in ``vllm_omni.<name>``, that module loaded
    bare (:func:`load_module`, no platform): what a pickle of a vLLM-Omni config calls first; pickle then
    restores the instance's state (``copy.deepcopy`` comes here too, the module then already loaded).
    Raises :class:`VllmOmniNotInstalled` if the wheel is missing."""
    cls: Any = sys.modules.get(f"{PACKAGE}.{name}") or load_module(name, platform=False)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return cls.__new__(cls)


def _reduce_config(obj: Any) -> tuple:
    """The ``copyreg`` reducer of a vLLM-Omni config: rebuilt by :func:`_rebuild_config`, then the state
    ``object.__reduce_ex__`` would give (``obj.__getstate__()``)."""
    cls = type(obj)
    return _rebuild_config, (cls.__module__.removeprefix(PACKAGE + "."), cls.__qualname__), obj.__getstate__()


def _register_pickling() -> None:
    """``copyreg.pickle(cls, _reduce_config)`` for every ``transformers.PretrainedConfig`` subclass defined in
    a loaded ``vllm_omni.*`` module (idempotent; the caller holds ``_lock``). ``pickle`` reads
    ``copyreg.dispatch_table``, multiprocessing's ``ForkingPickler`` copies it for each pickler, cloudpickle
    (vLLM's fallback serialiser) chains it, ``copy.deepcopy`` reads it."""
    config_base = getattr(sys.modules.get("transformers"), "PretrainedConfig", None)
    if config_base is None:
        return
    for modname, mod in list(sys.modules.items()):
        if mod is None or not modname.startswith(PACKAGE + "."):
            continue
        for value in list(vars(mod).values()):
            if (isinstance(value, type) and value.__module__ == modname and issubclass(value, config_base)
                    and value not in _pickled_by_loader):
                pickle_through(value, _reduce_config)
                _pickled_by_loader.add(value)


def _process_backend() -> Any:
    from omni_backends.registry import get_backend

    return get_backend()


def load_module(name: str, backend: Backend | None = None, *, platform: bool = True) -> types.ModuleType:
    """Import ``vllm_omni.<name>`` without running ``vllm_omni/__init__``.

    ``backend``: the driver whose :func:`host_omni_platform` vLLM-Omni's code
    sees (default: the process's, ``omni_backends.registry.get_backend()``).
    ``platform=False`` (a module that never asks vLLM-Omni's platform, e.g. a
    config class): no driver is selected for it, so loading it from a vLLM
    plugin does not select (and export) a driver before the worker checks the
    parent's selection. The vLLM-Omni config classes then loaded pickle through
    :func:`_rebuild_config` (see the module doc). Raises :class:`VllmOmniNotInstalled` if the wheel is
    missing."""
    with _lock:
        _bare_package()
        # vLLM-Omni's own logger set-up (its ``vllm_omni.logger``, which ``vllm_omni/__init__`` imports): its
        # modules' log lines go through vLLM's handlers, e.g. code2wav's "Code2Wav decoder CUDA Graph enabled"
        importlib.import_module(f"{PACKAGE}.logger")
        if platform:
            platforms = importlib.import_module(f"{PACKAGE}.platforms")
            install_omni_platform(platforms, lambda: host_omni_platform(backend or _process_backend()))
        with torchaudio_for_import():
            module = importlib.import_module(f"{PACKAGE}.{name}")
        _register_pickling()
        return module


__all__ = [
    "INNER_COMPILE_ENV", "VllmOmniNotInstalled", "host_omni_platform", "imported_normally", "inner_compile_allowed",
    "installed_version", "keep_plugin_out", "load_module", "load_vllm_plugins", "plugin_allowlist",
]
