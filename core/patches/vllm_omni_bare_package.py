"""Patch: ``sys.modules["vllm_omni"]`` -- vLLM-Omni's package installed bare, its ``__init__`` never run.

- What: :func:`install_bare_package` puts a plain package object for ``vllm_omni`` (its ``__path__`` the installed
  wheel's, marked ``__omni_bare__``) into ``sys.modules``, so that ``importlib.import_module("vllm_omni.<sub>")``
  imports the submodule without running ``vllm_omni/__init__.py``.
- Why: ``vllm_omni/__init__.py`` imports ``vllm_omni.patch``, which rebinds vLLM's ``Request``,
  ``EngineCoreOutput(s)``, ``TokensPrompt``, ``MRotaryEmbedding`` and more in every loaded module of the
  process; the core runs vLLM-Omni's model classes unchanged on stock vLLM and must keep those patches out.
- Versions: vLLM-Omni 0.30 (its ``__init__`` imports ``patch``; the model modules need nothing it sets).
- Until: vLLM-Omni's package imports without patching vLLM (its patches applied by an explicit call or its
  plugin only).
"""

from __future__ import annotations

import sys
import types

from omni_backends.binding import Patch, VendorSymbol

#: what the bare package keeps out: the package's ``__init__`` imports vLLM-Omni's patch module
PACKAGE_IMPORTS_PATCH = VendorSymbol("vllm_omni", "", kind="module", dist="vllm-omni", mentions=("patch",))
#: the module that rebinds vLLM's classes process-wide
PATCH_MODULE = VendorSymbol("vllm_omni.patch", "", kind="module", dist="vllm-omni")

PATCH = Patch.declare(__name__, __doc__, (PACKAGE_IMPORTS_PATCH, PATCH_MODULE))


def install_bare_package(name: str, path: list[str], origin: str | None) -> types.ModuleType:
    """``sys.modules[name]``: a new package object over the folders ``path`` (``origin``: its ``__init__`` file,
    never executed), marked ``__omni_bare__``; returned."""
    mod = types.ModuleType(name, "vLLM-Omni, loaded bare by core.models.vllm_omni (no __init__, no patches)")
    mod.__path__ = list(path)
    mod.__file__ = origin
    mod.__package__ = name
    mod.__omni_bare__ = True  # type: ignore[attr-defined]
    sys.modules[name] = mod
    return mod
