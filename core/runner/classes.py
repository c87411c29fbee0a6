"""How the omni runner classes are made: an omni mixin over the driver's base runner, one class per
``(mixin, base, kind, backend)`` (used by :mod:`core.runner.v1` and :mod:`core.runner.v2`, which import nothing
of each other)."""

from __future__ import annotations

import functools
from typing import Any

from core.kinds import AR, KINDS
from omni_backends.backend import Backend


@functools.lru_cache(maxsize=None)
def omni_runner_class(mixin: type, base: type, kind: str, backend: Backend) -> type:
    """``type(f"Omni{AR|Generation}{base}", (mixin, base), {"omni_kind": kind, "omni_backend": backend})``,
    in the mixin's module. Raises ``ValueError`` for an unknown ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"runner kind must be one of {KINDS}, got {kind!r}")
    name = f"Omni{'AR' if kind == AR else 'Generation'}{base.__name__}"
    return type(name, (mixin, base), {"omni_kind": kind, "omni_backend": backend, "__module__": mixin.__module__})
