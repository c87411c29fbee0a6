"""Deprecated: the V2 model state moved to :mod:`core.runner.model_state` (the V2 runner to
:mod:`core.runner.v2`, the vLLM symbols to :mod:`core.seams`). Every name imported from here warns once
(``DeprecationWarning``) and is the new one; this module goes in the next release."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = {
    "model_state_cls": "core.runner.model_state", "OmniModelStateMixin": "core.runner.model_state",
    "OmniSampler": "core.runner.model_state", "OmniV2RunnerMixin": "core.runner.v2",
    "v2_runner_class": "core.runner.v2", "V2_SYMBOLS": "core.seams",
    "capture_talker_mtp": "core.hooks.graphs", "mtp_graph_context": "core.hooks.graphs",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    warnings.warn(f"core.model_state.{name} moved to {_MOVED[name]}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_MOVED[name]), name)
