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

#: what a :class:`VendorSymbol` can name.
KINDS = ("callable", "class", "attribute", "module")


@dataclasses.dataclass(frozen=True)
class VendorSymbol:
    """A vendor symbol a driver binds.

    - ``module``: dotted module path (``"vllm.forward_context"``).
    - ``attr``: attribute path inside it; dots walk into classes
      (``"CUDAGraphWrapper.clear_all_graphs"``).
    - ``params``: parameters the driver passes (by keyword or position) or
      reads; the drift check fails if one disappears or is renamed.
    - ``required``: the parameters the driver always fills; a parameter
      without a default that is not listed here is drift ("newly required").
      ``None`` = do not check for new required parameters.
    - ``defaults``: ``(param, default source)`` pairs for parameters the driver
      leaves at the vendor's default and relies on (``("logprobs_mode",
      "'raw_logprobs'")``); a changed default is drift.
    - ``dist``: the distribution that ships ``module`` (for version reports).
    - ``kind``: ``"callable"`` (signature checked), ``"class"`` (its
      ``__init__`` signature checked), ``"attribute"`` (existence only; on a
      class this also finds instance attributes assigned in its methods) or
      ``"module"``.
    - ``mentions``: names the vendor callable's own source must contain (a
      behaviour the binding relies on that no signature shows, e.g. that
      ``init_model_state`` asks the model for ``get_model_state_cls``); the
      drift check reads the source, a name gone is drift (``missing-behaviour``).
    - ``alternatives``: the same seam under the spelling of other supported
      vendor versions (older names first-come, e.g. vLLM 0.26's
      ``get_mm_embeddings`` for 0.27+'s ``prepare_inputs_embeds``).
      :meth:`resolve` returns the first that exists (this symbol first); the
      drift check passes when one of them resolves without drift and reports
      which. This is the one place a version-dependent binding is written:
      callers never branch on a version.
    - ``defined_at``: ``file:line`` of the declaration (filled automatically).
    """

    module: str
    attr: str
    params: tuple[str, ...] = ()
    required: tuple[str, ...] | None = None
    dist: str = "vllm"
    kind: str = "callable"
    defaults: tuple[tuple[str, str], ...] = ()
    mentions: tuple[str, ...] = ()
    alternatives: tuple["VendorSymbol", ...] = ()
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"VendorSymbol kind must be one of {KINDS}, got {self.kind!r}")
        unknown = [p for p in (self.required or ()) if p not in self.params]
        if unknown:
            raise ValueError(f"{self.module}.{self.attr}: required {unknown} must also be listed in params")
        if not self.defined_at:
            frame = sys._getframe(2)  # the driver module line that declared it
            object.__setattr__(self, "defined_at", f"{frame.f_code.co_filename}:{frame.f_lineno}")
        for alt in self.alternatives:
            if alt.alternatives:
                raise ValueError(f"{self.qualname}: an alternative ({alt.qualname}) cannot have alternatives itself")
            if not alt.defined_at or alt.defined_at.startswith(__file__):
                object.__setattr__(alt, "defined_at", self.defined_at)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.attr}" if self.attr else self.module

    def resolve(self) -> Any:
        """Import ``module`` and return ``attr`` (or, when absent, the first of
        ``alternatives`` that exists). Raises ``ImportError`` / ``AttributeError``
        naming this declaration when the vendor moved it."""
        return self.resolve_spelling()[1]

    def resolve_spelling(self) -> "tuple[VendorSymbol, Any]":
        """``(the symbol that resolved, the object)``: this one or the first of
        ``alternatives`` present in the installed vendor version. Raises this
        symbol's own error (naming the alternatives tried) when none exists."""
        if not self.alternatives:
            return self, self._resolve_one()
        try:
            return self, self._resolve_one()
        except (ImportError, AttributeError) as first:
            for alt in self.alternatives:
                try:
                    return alt, alt._resolve_one()
                except (ImportError, AttributeError):
                    continue
            tried = ", ".join(a.qualname for a in self.alternatives)
            raise type(first)(f"{first} (alternatives tried: {tried})") from first

    @property
    def attr_name(self) -> str:
        """The last part of ``attr`` (a method or field name)."""
        return self.attr.rpartition(".")[2]

    def _resolve_one(self) -> Any:
        obj: Any = sys.modules.get(self.module)  # fast path: already imported (resolution stays call-time)
        if obj is None:
            try:
                obj = importlib.import_module(self.module)
            except ImportError as exc:
                raise ImportError(f"{self.qualname} (declared at {self.defined_at}): cannot import {self.module}: {exc}") from exc
        for part in self.attr.split(".") if self.attr else ():
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
