"""Deprecated alias of :mod:`omni_backends.registry.metadata` (moved there in 0.1.0; removed in the next release).

Importing a name from here warns with :class:`DeprecationWarning` and returns the object from its new home.
"""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = ("Record", "Records", "driver_records")


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"omni_backends.entry_points.{name} moved to omni_backends.registry.metadata.{name}; "
                  f"import it from there", DeprecationWarning, stacklevel=2)
    from omni_backends.registry import metadata

    return getattr(metadata, name)


__all__ = list(_MOVED)
