"""Which ``VendorSymbol`` declarations a driver depends on, and where it uses them."""

from __future__ import annotations

import ast
import importlib
import inspect
from typing import Any

from omni_backends.binding import VendorSymbol
from omni_backends.drift.model import Declared, rel_path


def _package_modules(package: str) -> list[Any]:
    import pkgutil

    pkg = importlib.import_module(package)
    mods = [pkg]
    for info in pkgutil.iter_modules(getattr(pkg, "__path__", []), prefix=package + "."):
        mods.append(importlib.import_module(info.name))
    return mods


def _imported_omni_modules(module: Any) -> set[str]:
    """``omni_backends.*`` modules that ``module``'s source imports names from."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("omni_backends") and not node.level:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("omni_backends"))
    return out


def _resolve_uses(module: Any) -> dict[int, list[str]]:
    """id(VendorSymbol) -> ``file:line`` of every ``NAME.resolve()`` (or other
    attribute use, e.g. ``NAME.attr``) in ``module``."""
    try:
        path = inspect.getsourcefile(module) or ""
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    uses: dict[int, list[str]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and isinstance(getattr(module, node.value.id, None), VendorSymbol)
        ):
            sym = getattr(module, node.value.id)
            uses.setdefault(id(sym), []).append(f"{rel_path(path)}:{node.lineno}")
    return uses


def driver_declarations(driver_cls: type) -> list[Declared]:
    """Every :class:`VendorSymbol` a driver depends on, with its use sites.

    Collected from all modules of the driver's package (``omni_backends/<driver>/*.py``)
    and from the ``omni_backends`` modules those import names from that declare
    symbols (``omni_backends/vllm_upstream.py``, and what a shared base it
    inherits imports: ``omni_backends/patches.py``). A symbol declared in a shared
    module counts only if a driver module uses it, directly or through a shared
    mixin the driver inherits from.
    """
    from omni_backends.binding import declared_symbols

    package = driver_cls.__module__.rpartition(".")[0] or driver_cls.__module__
    own = _package_modules(package)
    shared_names: set[str] = set()
    for m in own:
        shared_names |= {n for n in _imported_omni_modules(m) if not n.startswith(package)}
    mro_modules = {c.__module__ for c in driver_cls.__mro__}
    # a shared base's own shared modules (vllm_upstream -> patches) count as inherited with it
    for name in sorted(shared_names & mro_modules):
        for sub in _imported_omni_modules(importlib.import_module(name)):
            if not sub.startswith(package) and sub not in shared_names:
                shared_names.add(sub)
                mro_modules.add(sub)
    shared = [importlib.import_module(n) for n in sorted(shared_names)]
    shared = [m for m in shared if any(True for _ in declared_symbols(m))]

    uses: dict[int, list[str]] = {}
    for m in own + shared:
        for k, v in _resolve_uses(m).items():
            uses.setdefault(k, []).extend(v)

    out: dict[int, Declared] = {}
    for m in own:
        for name, sym in declared_symbols(m):
            out.setdefault(id(sym), Declared(name, sym, tuple(sorted(set(uses.get(id(sym), []))))))
    for m in shared:
        inherited = m.__name__ in mro_modules
        used_by_own = {id(getattr(o, n)) for o in own for n in vars(o) if isinstance(getattr(o, n), VendorSymbol)}
        for name, sym in declared_symbols(m):
            if inherited or id(sym) in used_by_own:
                out.setdefault(id(sym), Declared(name, sym, tuple(sorted(set(uses.get(id(sym), []))))))
    return sorted(out.values(), key=lambda d: d.symbol.defined_at)


def runner_bases(driver_cls: type, method: str = "model_runner_base") -> list[Declared]:
    """The base runner classes a driver binds: every ``VendorSymbol`` its
    ``model_runner_base`` method (or ``method``, e.g. ``worker_base``) names,
    read from the defining module's source (first class of the MRO that
    defines it). ``[]`` when there is none."""
    for klass in driver_cls.__mro__:
        if method not in vars(klass):
            continue
        module = inspect.getmodule(klass)
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError, SyntaxError):
            return []
        out: list[Declared] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
                for fn in node.body:
                    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == method:
                        for n in ast.walk(fn):
                            value = getattr(module, n.id, None) if isinstance(n, ast.Name) else None
                            if isinstance(value, VendorSymbol) and all(d.symbol is not value for d in out):
                                out.append(Declared(n.id, value, (f"{rel_path(inspect.getsourcefile(module) or '')}:"
                                                                  f"{n.lineno}",)))
        return out
    return []


#: top-level modules of the vendor stacks drivers bind (besides a driver's own ``vendor_modules``)
VENDOR_TOPS = ("vllm", "vllm_ascend", "vllm_omni", "torch_npu", "intel_extension_for_pytorch")


def undeclared_vendor_imports(driver_cls: type) -> list[str]:
    """Vendor names the driver's own package imports directly (``import vllm...`` / ``from vllm... import ...``,
    anywhere, in a method too) instead of declaring them as :class:`VendorSymbol`: ``check-drift`` cannot check
    those, so a release that renames one breaks the driver at run time with a clean drift report. Returns
    ``"path:line: the import statement"`` per import, sorted. The package is the one the driver class's module
    lives in (``omni_simdev`` for ``omni_simdev.driver``; ``omni_backends.cpu`` for the cpu driver)."""
    module = driver_cls.__module__
    package = module.rpartition(".")[0] or module
    tops = set(VENDOR_TOPS) | {m.split(".")[0] for m in getattr(driver_cls, "vendor_modules", {})}
    try:
        modules = _package_modules(package)
    except Exception:  # the package cannot be walked: the class's own module at least
        modules = [importlib.import_module(module)]
    out = []
    for mod in modules:
        try:
            path = inspect.getsourcefile(mod) or ""
            tree = ast.parse(inspect.getsource(mod))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
                text = f"from {node.module} import {', '.join(a.name for a in node.names)}"
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                text = "import " + ", ".join(a.name for a in node.names)
            else:
                continue
            if any(n.split(".")[0] in tops for n in names):
                out.append((rel_path(path), node.lineno, text))
    return [f"{path}:{line}: {text}" for path, line, text in sorted(set(out))]

