"""Declared vendor symbols: the one place a driver names what it binds.

A driver declares every vendor symbol it uses as a module-level
:class:`VendorSymbol` and calls it through :meth:`VendorSymbol.resolve`, so the
declaration cannot drift from the code that uses it. The drift check
(``omni-backends check-drift``) reads the same declarations and resolves them
against an installed stack or a source tree, reporting the driver's
``file:line`` for each problem.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Iterator


@dataclasses.dataclass(frozen=True)
class VendorSymbol:
    """A vendor symbol a driver binds.

    - ``module``: dotted module path (``"vllm.forward_context"``).
    - ``attr``: attribute path inside it; dots walk into classes
      (``"CUDAGraphWrapper.clear_all_graphs"``).
    - ``params``: keyword parameters the driver passes (or reads); the drift
      check fails if one disappears.
    - ``max_required``: positional/keyword parameters the driver fills; a new
      required parameter beyond these is drift.
    - ``dist``: the distribution that ships ``module`` (for version reports).
    - ``kind``: ``"callable"`` (signature checked), ``"class"`` or ``"attribute"``.
    - ``defined_at``: ``file:line`` of the declaration (filled automatically).
    """

    module: str
    attr: str
    params: tuple[str, ...] = ()
    required: tuple[str, ...] | None = None
    dist: str = "vllm"
    kind: str = "callable"
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.defined_at:
            frame = sys._getframe(2)  # the driver module line that declared it
            object.__setattr__(self, "defined_at", f"{frame.f_code.co_filename}:{frame.f_lineno}")

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.attr}"

    def resolve(self) -> Any:
        """Import ``module`` and return ``attr``. Raises ``ImportError`` /
        ``AttributeError`` naming this declaration when the vendor moved it."""
        try:
            obj: Any = importlib.import_module(self.module)
        except ImportError as exc:
            raise ImportError(f"{self.qualname} (declared at {self.defined_at}): cannot import {self.module}: {exc}") from exc
        for part in self.attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise AttributeError(
                    f"{self.qualname} (declared at {self.defined_at}): {self.module} has no {self.attr!r}; "
                    f"run `omni-backends check-drift` to see what moved"
                ) from exc
        return obj


def declared_symbols(module: Any) -> Iterator[tuple[str, VendorSymbol]]:
    """Every ``VendorSymbol`` bound at module level in ``module`` (name, symbol)."""
    for name, value in vars(module).items():
        if isinstance(value, VendorSymbol):
            yield name, value
