"""Deprecated alias of :mod:`omni_backends.testing.reference_sampler`, the conformance kit's sampler oracle
(moved into the kit's package; kept for one release).

Reading any name here (``omni_backends.reference_sampler.sample``, ``greedy``, ...) warns with
:class:`DeprecationWarning` and returns the object of the new module; a name the new module lacks raises
:class:`AttributeError`. Import :mod:`omni_backends.testing.reference_sampler` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from omni_backends.testing import reference_sampler as _moved


def __getattr__(name: str) -> Any:
    value = getattr(_moved, name)
    warnings.warn(
        f"omni_backends.reference_sampler is deprecated and will be removed in the next release: import "
        f"omni_backends.testing.reference_sampler (the conformance kit's oracle) for {name!r}",
        DeprecationWarning,
        stacklevel=2,
    )
    return value


def __dir__() -> list[str]:
    return dir(_moved)
