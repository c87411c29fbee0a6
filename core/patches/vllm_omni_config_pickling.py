"""Patch: ``copyreg.dispatch_table`` -- vLLM-Omni's config classes pickle through the bare loader.

- What: :func:`pickle_through` registers a reducer (``copyreg.pickle``) for each ``transformers.PretrainedConfig``
  subclass a bare-loaded ``vllm_omni.*`` module defines (``core.models.vllm_omni``: rebuilt by
  ``_rebuild_config``, which loads its module bare first, then the instance's state restored).
- Why: vLLM pickles a stage's ``VllmConfig`` (its ``hf_config``: e.g. vLLM-Omni's ``Qwen3TTSConfig``) into the
  engine-core and worker processes; pickle's default reduction imports ``vllm_omni.<module>`` there by name, which
  runs ``vllm_omni/__init__`` and its patches (``core.patches.vllm_omni_bare_package``) in that process.
- Versions: vLLM-Omni 0.30 (the Qwen3-TTS config classes: plain ``PretrainedConfig`` subclasses with no reducer of
  their own).
- Until: vLLM-Omni's package imports without patching vLLM.
"""

from __future__ import annotations

import copyreg
from typing import Any, Callable

from omni_backends.binding import Patch, VendorSymbol

#: a config class the reducer stands in for: no reduction of its own that the registered one would override
QWEN3_TTS_CONFIG = VendorSymbol("vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts", "Qwen3TTSConfig",
                                kind="attribute", dist="vllm-omni", absent=("__reduce__", "__reduce_ex__"))

PATCH = Patch.declare(__name__, __doc__, (QWEN3_TTS_CONFIG,))


def pickle_through(cls: type, reduce: Callable[[Any], tuple]) -> None:
    """``copyreg.pickle(cls, reduce)``: pickle (and multiprocessing's ``ForkingPickler``, cloudpickle,
    ``copy.deepcopy``) reduces instances of ``cls`` with ``reduce``."""
    copyreg.pickle(cls, reduce)
