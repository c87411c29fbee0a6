"""Resolving declarations against the installed stack (import + :mod:`inspect`)."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from typing import Any

from omni_backends.binding import VendorSymbol
from omni_backends.drift.model import Param
from omni_backends.drift.sources import Missing, Unverifiable


def _installed_params(obj: Any) -> list[Param]:
    sig = inspect.signature(obj)
    out = []
    for p in sig.parameters.values():
        default = None if p.default is inspect.Parameter.empty else _default_text(p.default)
        out.append(Param(p.name, p.kind.name.lower(), default))
    return out


def _default_text(value: Any) -> str:
    import enum

    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


class InstalledResolver:
    """Resolves declarations by importing the installed vendor stack."""

    def describe(self) -> str:
        return "installed packages"

    def covers(self, module: str) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(module.split(".")[0]) is not None
        except (ImportError, ValueError):
            return False

    def source_text(self, sym: VendorSymbol) -> str | None:
        """Source of the object :meth:`resolve` found last (``inspect.getsource``), or None."""
        import inspect

        try:
            return inspect.getsource(self.last_obj)
        except (TypeError, OSError, AttributeError):
            return None

    def resolve(self, sym: VendorSymbol) -> tuple[str, list[Param] | None, str]:
        self.last_obj = None
        if not self.covers(sym.module):
            raise Unverifiable(f"{sym.module.split('.')[0]} is not installed")
        try:
            obj = importlib.import_module(sym.module)
        except ModuleNotFoundError as exc:
            if exc.name and (sym.module == exc.name or sym.module.startswith(exc.name + ".")):
                raise Missing("missing-module", f"module {sym.module} does not exist ({exc})") from exc
            raise Missing("import-error", f"importing {sym.module} failed: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # OSError from a vendor's native libs, RuntimeError, ...
            raise Missing("import-error", f"importing {sym.module} failed: {type(exc).__name__}: {exc}") from exc
        parts = sym.attr.split(".") if sym.attr else []
        for i, part in enumerate(parts):
            if not hasattr(obj, part):
                last = i == len(parts) - 1
                if last and sym.kind == "attribute" and isinstance(obj, type) and _assigns_instance_attr(obj, part):
                    return _where(obj), None, "instance attribute"
                raise Missing("missing-symbol", f"{getattr(obj, '__name__', obj)!s} has no {part!r}")
            obj = getattr(obj, part)
        self.last_obj = obj
        where = _where(obj)
        if sym.kind in ("attribute", "module") or not (sym.params or sym.required is not None or sym.defaults):
            return where, None, type(obj).__name__
        try:
            return where, _installed_params(obj), "callable"
        except (TypeError, ValueError) as exc:
            raise Unverifiable(f"no signature for {sym.qualname}: {exc}") from exc


def _assigns_instance_attr(cls: type, name: str) -> bool:
    """True if a method of ``cls`` or a base assigns ``self.<name>`` (read from source)."""
    for klass in cls.__mro__:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr == name:
                    return True
    return False


def _where(obj: Any) -> str:
    try:
        target = inspect.unwrap(obj) if callable(obj) else obj
        path = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
        return f"{path}:{line}"
    except (TypeError, OSError):
        return getattr(obj, "__module__", "?") or "?"
