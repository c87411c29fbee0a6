"""Patch: ``sys.modules["torchaudio"]`` -- a stand-in while vLLM-Omni's modules import, where torchaudio is missing.

- What: :func:`torchaudio_for_import` (a context manager around the import of a ``vllm_omni`` module) puts a stub
  ``torchaudio`` package with ``torchaudio.functional.melscale_fbanks`` (raising ``NotImplementedError`` saying
  what to install) into ``sys.modules`` when no torchaudio is importable, and restores what was there after.
- Why: vLLM-Omni's ``vllm_omni.utils.audio`` imports ``torchaudio.functional.melscale_fbanks`` at module level, and
  the Qwen3-TTS modules import it; only reference-audio features (Qwen3-TTS ``Base`` voice cloning) call it. A
  torch build without a matching torchaudio wheel (cpu, some vendor stacks) could not load the CustomVoice /
  VoiceDesign models at all.
- Versions: vLLM-Omni 0.30 (``utils/audio.py``'s module-level import).
- Until: vLLM-Omni imports torchaudio lazily where reference audio is read.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from typing import Any, Iterator

from omni_backends.binding import Patch, VendorSymbol

#: the module-level import the stand-in satisfies
AUDIO_IMPORTS_MELSCALE = VendorSymbol("vllm_omni.utils.audio", "", kind="module", dist="vllm-omni",
                                      mentions=("from torchaudio.functional import melscale_fbanks",))

PATCH = Patch.declare(__name__, __doc__, (AUDIO_IMPORTS_MELSCALE,))


def _melscale_fbanks_unavailable(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        "torchaudio.functional.melscale_fbanks is not installed: vLLM-Omni needs it for mel features of reference "
        "audio (Qwen3-TTS 'Base' voice cloning). Install a torchaudio build matching your torch, or use the "
        "CustomVoice / VoiceDesign tasks, which never call it."
    )


@contextlib.contextmanager
def torchaudio_for_import() -> Iterator[None]:
    """The real torchaudio if importable; else a stub module during the import only."""
    if importlib.util.find_spec("torchaudio") is not None:
        yield
        return
    if importlib.util.find_spec("transformers") is not None:
        # transformers probes its optional packages when first imported (importlib.util.find_spec, which
        # raises for a module without __spec__, as the stand-in is): let it probe before the stand-in goes in
        importlib.import_module("transformers.utils.import_utils")
    stub = types.ModuleType("torchaudio")
    functional = types.ModuleType("torchaudio.functional")
    functional.melscale_fbanks = _melscale_fbanks_unavailable  # type: ignore[attr-defined]
    stub.functional = functional  # type: ignore[attr-defined]
    stub.__omni_stub__ = True  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in ("torchaudio", "torchaudio.functional")}
    sys.modules["torchaudio"], sys.modules["torchaudio.functional"] = stub, functional
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
