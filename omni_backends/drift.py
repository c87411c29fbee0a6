"""Vendor API drift check: ``omni-backends check-drift``.

Every driver declares the vendor symbols it binds as module-level
:class:`~omni_backends.binding.VendorSymbol` objects and uses them only through
``.resolve()``. This module collects those declarations (from the driver's
package and from the ``omni_backends`` modules it imports names from, e.g.
``omni_backends/vllm_upstream.py``) and resolves each one against

- the installed stack (``--installed``): ``importlib.import_module`` +
  ``getattr`` + ``inspect.signature``; or
- a source tree, wheel (``.whl``/``.zip``) or sdist (``.tar.gz``)
  (``--source``, repeatable): the Python files are parsed with :mod:`ast`,
  nothing is imported, so a vendor stack that cannot install here (CANN,
  torch-npu) can still be checked.

Problems reported, each with the driver's ``file:line`` (declaration and every
``.resolve()`` use) and the vendor's ``file:line`` where found:
``missing-module``, ``missing-symbol``, ``removed-param``, ``renamed-param``,
``new-required-param``, ``changed-default``, ``import-error``. Notes that are
not drift: ``not-checked`` (the symbol's package is not in what was given)
and ``unverifiable`` (the definition is outside the given sources, e.g. a C
extension base class).

:func:`vendor_import_drift` checks a *vendor's own* source (vllm-ascend)
against the upstream vLLM it is meant to run on: every ``from vllm... import
name`` is resolved in the upstream tree.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import importlib
import importlib.metadata
import inspect
import json
import os
import tarfile
import textwrap
import zipfile
from typing import Any, Iterable, Iterator

from omni_backends.binding import VendorSymbol

#: finding kinds that are drift (non-zero exit).
DRIFT_KINDS = (
    "missing-module",
    "missing-symbol",
    "removed-param",
    "renamed-param",
    "new-required-param",
    "changed-default",
    "import-error",
    "missing-behaviour",
)
#: finding kinds that are reported but are not drift.
NOTE_KINDS = ("not-checked", "unverifiable", "kwargs-only", "guarded-import", "alternative")

_VAR_KINDS = ("var_positional", "var_keyword")


# ------------------------------------------------------------------ results
@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a vendor signature (``kind`` as ``inspect.Parameter.kind``, lower-case)."""

    name: str
    kind: str
    default: str | None  # source text of the default; None = required


@dataclasses.dataclass
class Finding:
    """One problem (or note) about one declared symbol."""

    driver: str
    symbol: str  # the driver's variable name, e.g. SET_FORWARD_CONTEXT
    target: str  # module.attr
    kind: str
    message: str
    declared_at: str
    used_at: list[str] = dataclasses.field(default_factory=list)
    vendor_at: str | None = None

    @property
    def drift(self) -> bool:
        return self.kind in DRIFT_KINDS

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["drift"] = self.drift
        return d


@dataclasses.dataclass
class DriverReport:
    driver: str
    symbols: int
    checked: int
    findings: list[Finding]

    @property
    def drift(self) -> list[Finding]:
        return [f for f in self.findings if f.drift]

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "symbols": self.symbols,
            "checked": self.checked,
            "drift": len(self.drift),
            "findings": [f.to_json() for f in self.findings],
        }


# ------------------------------------------------- declared symbols per driver
@dataclasses.dataclass(frozen=True)
class Declared:
    """A declaration plus where the driver uses it."""

    name: str
    symbol: VendorSymbol
    used_at: tuple[str, ...]


def _relpath(path: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = os.path.abspath(path)
    return os.path.relpath(ap, root) if ap.startswith(root + os.sep) else ap


def _rel_defined_at(defined_at: str) -> str:
    path, _, line = defined_at.rpartition(":")
    return f"{_relpath(path)}:{line}" if path else defined_at


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
            uses.setdefault(id(sym), []).append(f"{_relpath(path)}:{node.lineno}")
    return uses


def driver_declarations(driver_cls: type) -> list[Declared]:
    """Every :class:`VendorSymbol` a driver depends on, with its use sites.

    Collected from all modules of the driver's package (``omni_backends/<driver>/*.py``)
    and from the ``omni_backends`` modules those import names from that declare
    symbols (``omni_backends/vllm_upstream.py``). A symbol declared in a shared
    module counts only if a driver module uses it, directly or through a shared
    mixin the driver inherits from.
    """
    from omni_backends.binding import declared_symbols

    package = driver_cls.__module__.rpartition(".")[0] or driver_cls.__module__
    own = _package_modules(package)
    shared_names: set[str] = set()
    for m in own:
        shared_names |= {n for n in _imported_omni_modules(m) if not n.startswith(package)}
    shared = [importlib.import_module(n) for n in sorted(shared_names)]
    shared = [m for m in shared if any(True for _ in declared_symbols(m))]
    mro_modules = {c.__module__ for c in driver_cls.__mro__}

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


# ------------------------------------------------------------- source trees
class SourceTree:
    """Python sources of a directory, wheel/zip or sdist, read without importing.

    ``label`` names what was read; ``versions`` maps distribution -> version from
    any ``*.dist-info/METADATA`` or ``PKG-INFO`` found.
    """

    def __init__(self, path: str) -> None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"--source {path!r} does not exist; give a source directory, a .whl or an sdist")
        self.path = path
        self.label = os.path.basename(os.path.normpath(path))
        self._files: dict[str, Any] = {}  # relpath -> loader
        self._native: set[str] = set()  # relpaths (no suffix) of compiled extension modules
        self._cache: dict[str, str | None] = {}
        self.versions: dict[str, str] = {}
        if os.path.isdir(path):
            # a package directory itself (site-packages/torch) keeps its name as the top level
            base = os.path.basename(os.path.normpath(path)) + "/" if os.path.isfile(os.path.join(path, "__init__.py")) else ""
            for root, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
                for f in files:
                    full = os.path.join(root, f)
                    rel = base + os.path.relpath(full, path).replace(os.sep, "/")
                    if f.endswith((".so", ".pyd")):
                        self._native.add(_native_name(rel))
                    elif f.endswith(".py") or f in ("METADATA", "PKG-INFO"):
                        self._files[rel] = (lambda p=full: open(p, encoding="utf-8", errors="replace").read())
        elif zipfile.is_zipfile(path):
            zf = zipfile.ZipFile(path)
            for n in zf.namelist():
                if n.endswith((".so", ".pyd")):
                    self._native.add(_native_name(n))
                elif n.endswith(".py") or n.endswith("/METADATA") or n.endswith("PKG-INFO"):
                    self._files[n] = (lambda n=n: zf.read(n).decode("utf-8", errors="replace"))
        elif tarfile.is_tarfile(path):
            tf = tarfile.open(path)
            for m in tf.getmembers():
                if m.isfile() and m.name.endswith((".so", ".pyd")):
                    self._native.add(_native_name(m.name))
                elif m.isfile() and (m.name.endswith(".py") or m.name.endswith("PKG-INFO")):
                    self._files[m.name] = (lambda m=m: tf.extractfile(m).read().decode("utf-8", errors="replace"))
        else:
            raise ValueError(f"--source {path!r} is neither a directory, a zip/wheel nor a tar sdist")
        for rel in sorted(self._files, key=len):
            if rel.endswith(("/METADATA", "PKG-INFO")) or rel in ("METADATA",):
                name = version = None
                for line in self._files[rel]().splitlines():
                    if line.startswith("Name:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                    if name and version:
                        break
                if name and version:
                    self.versions.setdefault(name, version)
        # top-level packages: a package directory whose parent is not a package
        self._roots: dict[str, str] = {}
        for rel in sorted(self._files, key=lambda r: (r.count("/"), r)):
            parts = rel.split("/")
            if not rel.endswith(".py"):
                continue
            if parts[-1] == "__init__.py" and len(parts) >= 2:
                top, prefix = parts[-2], "/".join(parts[:-2])
            else:
                top, prefix = parts[-1][:-3], "/".join(parts[:-1])
            if (prefix + "/__init__.py" if prefix else "__init__.py") in self._files:
                continue  # a subpackage / submodule, not a top-level one
            self._roots.setdefault(top, prefix)

    def has_top(self, top: str) -> bool:
        return top in self._roots

    def module_file(self, module: str) -> str | None:
        """Relative path of ``module``'s source (``a/b.py`` or ``a/b/__init__.py``)."""
        parts = module.split(".")
        prefix = self._roots.get(parts[0])
        if prefix is None:
            return None
        base = "/".join(([prefix] if prefix else []) + parts)
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self._files:
                return cand
        return None

    def is_native(self, module: str) -> bool:
        """True if ``module`` or a parent is a compiled extension (contents not readable)."""
        parts = module.split(".")
        prefix = self._roots.get(parts[0])
        if prefix is None:
            return False
        for i in range(1, len(parts) + 1):
            if "/".join(([prefix] if prefix else []) + parts[:i]) in self._native:
                return True
        return False

    def read(self, rel: str) -> str:
        return self._files[rel]()

    def python_files(self, top: str) -> Iterator[str]:
        prefix = self._roots.get(top)
        if prefix is None:
            return
        head = (prefix + "/" if prefix else "") + top
        for rel in sorted(self._files):
            if rel.endswith(".py") and (rel.startswith(head + "/") or rel == head + ".py"):
                yield rel

    def describe(self) -> str:
        vs = ", ".join(f"{k} {v}" for k, v in sorted(self.versions.items()))
        return f"{self.path}" + (f" ({vs})" if vs else "")


def _native_name(rel: str) -> str:
    """``pkg/_C.cpython-311-x86_64-linux-gnu.so`` -> ``pkg/_C``."""
    head, _, base = rel.replace(os.sep, "/").rpartition("/")
    return (head + "/" if head else "") + base.split(".", 1)[0]


@dataclasses.dataclass
class _Def:
    kind: str  # def | class | assign | import | module | dynamic
    node: Any = None
    module: str = ""  # module the node lives in (or import target)
    name: str = ""  # imported name


class _ModuleIndex:
    """Top-level names of one parsed module."""

    def __init__(self, module: str, rel: str, source: str, is_package: bool) -> None:
        self.module = module
        self.rel = rel
        self.tree = ast.parse(source)
        self.names: dict[str, _Def] = {}
        self.dynamic = False
        package = module if is_package else module.rpartition(".")[0]
        self._collect(self.tree.body, package)

    def _collect(self, body: list[ast.stmt], package: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.names[node.name] = _Def("def", node, self.module)
                if node.name == "__getattr__":
                    self.dynamic = True
            elif isinstance(node, ast.ClassDef):
                self.names[node.name] = _Def("class", node, self.module)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.names.setdefault(n.id, _Def("assign", node, self.module))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    if a.name == "*":
                        self.names.setdefault(f"*{src}", _Def("star", node, src))
                        continue
                    self.names[a.asname or a.name] = _Def("import", node, src, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.names[a.asname] = _Def("module", node, a.name)
                    else:
                        top = a.name.split(".")[0]
                        self.names.setdefault(top, _Def("module", node, top))
            elif isinstance(node, ast.If):
                self._collect(node.body, package)
                self._collect(node.orelse, package)
            elif isinstance(node, ast.Try):
                self._collect(node.body, package)
                for h in node.handlers:
                    self._collect(h.body, package)
                self._collect(node.orelse, package)
                self._collect(node.finalbody, package)
            elif isinstance(node, ast.With):
                self._collect(node.body, package)


class _Unverifiable(Exception):
    """The definition lies outside the given sources."""


class _Missing(Exception):
    def __init__(self, kind: str, message: str, where: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.where = where


class SourceResolver:
    """Resolves declarations against one or more :class:`SourceTree`s via AST."""

    def __init__(self, trees: list[SourceTree]) -> None:
        self.trees = trees
        self._index: dict[str, _ModuleIndex | None] = {}

    def describe(self) -> str:
        return "; ".join(t.describe() for t in self.trees)

    def _tree_for(self, top: str) -> SourceTree | None:
        for t in self.trees:
            if t.has_top(top):
                return t
        return None

    def covers(self, module: str) -> bool:
        return self._tree_for(module.split(".")[0]) is not None

    def native(self, module: str) -> bool:
        tree = self._tree_for(module.split(".")[0])
        return tree is not None and tree.is_native(module)

    def index(self, module: str) -> _ModuleIndex | None:
        if module not in self._index:
            tree = self._tree_for(module.split(".")[0])
            rel = tree.module_file(module) if tree else None
            idx = None
            if rel is not None:
                try:
                    idx = _ModuleIndex(module, rel, tree.read(rel), rel.endswith("__init__.py"))
                except SyntaxError:
                    idx = None
            self._index[module] = idx
        return self._index[module]

    # -- lookups
    def lookup(self, module: str, name: str, _seen: frozenset = frozenset()) -> tuple[_ModuleIndex, _Def]:
        """Find top-level ``name`` in ``module``, following re-exports."""
        key = (module, name)
        if key in _seen:
            raise _Missing("missing-symbol", f"import cycle resolving {module}.{name}")
        _seen = _seen | {key}
        if not self.covers(module):
            raise _Unverifiable(f"{module} is outside the given sources")
        if self.native(module):
            raise _Unverifiable(f"{module} is (inside) a compiled extension module")
        idx = self.index(module)
        if idx is None:
            raise _Missing("missing-module", f"module {module} does not exist")
        d = idx.names.get(name)
        if d is not None and d.kind == "import":
            sub = f"{d.module}.{d.name}"
            if self.covers(sub) and self.index(sub) is not None:
                return self.index(sub), _Def("module", d.node, sub)  # type: ignore[return-value]
            return self.lookup(d.module, d.name, _seen)
        if d is not None and d.kind == "module":
            sub_idx = self.index(d.module) if self.covers(d.module) else None
            if sub_idx is None:
                raise _Unverifiable(f"{module}.{name} is module {d.module}, outside the given sources")
            return sub_idx, _Def("module", d.node, d.module)
        if d is not None:
            return idx, d
        sub = f"{module}.{name}"
        if self.index(sub) is not None:
            return self.index(sub), _Def("module", None, sub)  # type: ignore[return-value]
        for k, star in idx.names.items():
            if star.kind == "star":
                try:
                    return self.lookup(star.module, name, _seen)
                except (_Missing, _Unverifiable):
                    continue
        if idx.dynamic:
            raise _Unverifiable(f"{module} has no {name!r} but defines a module __getattr__ that may provide it")
        raise _Missing("missing-symbol", f"{module} has no {name!r}", f"{idx.rel}")

    def _class_bases(self, idx: _ModuleIndex, cls: ast.ClassDef) -> list[tuple[_ModuleIndex, ast.ClassDef] | str]:
        out: list[tuple[_ModuleIndex, ast.ClassDef] | str] = []
        for b in cls.bases:
            expr = b.value if isinstance(b, ast.Subscript) else b
            dotted = _dotted(expr)
            if dotted is None or dotted in ("object", "Generic", "ABC", "Protocol", "Enum", "IntEnum"):
                continue
            head, *rest = dotted.split(".")
            try:
                m, d = self.lookup(idx.module, head)
                for r in rest:
                    if d.kind != "module":
                        raise _Unverifiable(dotted)
                    m, d = self.lookup(d.module, r)
                if d.kind == "class":
                    out.append((m, d.node))
                else:
                    out.append(dotted)
            except (_Missing, _Unverifiable):
                out.append(dotted)
        return out

    def _member(self, idx: _ModuleIndex, cls: ast.ClassDef, name: str, instance_ok: bool, depth: int = 0):
        """(module index, node, owner class) of ``name`` in ``cls`` or its bases."""
        if depth > 30:
            raise _Unverifiable("class hierarchy too deep")
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return idx, node, cls
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return idx, node, cls
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                return idx, node, cls
        if instance_ok:
            for node in ast.walk(cls):
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr == name:
                            return idx, node, cls
        external = []
        for base in self._class_bases(idx, cls):
            if isinstance(base, str):
                external.append(base)
                continue
            try:
                return self._member(base[0], base[1], name, instance_ok, depth + 1)
            except _Missing:
                continue
        if external:
            raise _Unverifiable(f"{cls.name} has no {name!r}; its base(s) {', '.join(external)} lie outside the sources")
        raise _Missing("missing-symbol", f"class {cls.name} has no {name!r}", f"{idx.rel}:{cls.lineno}")

    def resolve(self, sym: VendorSymbol) -> tuple[str, list[Param] | None, str]:
        """(vendor file:line, signature params or None, what it is). Raises _Missing/_Unverifiable."""
        self.last_node = None
        if not self.covers(sym.module):
            raise _Unverifiable(f"{sym.module.split('.')[0]} is not in the given sources")
        if self.native(sym.module):
            raise _Unverifiable(f"{sym.module} is (inside) a compiled extension module")
        idx = self.index(sym.module)
        if idx is None:
            raise _Missing("missing-module", f"module {sym.module} does not exist in {self.describe()}")
        if not sym.attr:
            return idx.rel, None, "module"
        parts = sym.attr.split(".")
        m, d = self.lookup(sym.module, parts[0])
        node, owner = d.node, None
        where_mod = m
        for i, part in enumerate(parts[1:], start=1):
            if d.kind == "module":
                where_mod, d = self.lookup(d.module, part)
                node, owner = d.node, None
                continue
            if not isinstance(node, ast.ClassDef):
                raise _Unverifiable(f"{'.'.join(parts[:i])} is not a class in the sources; cannot look up {part!r}")
            last = i == len(parts) - 1
            where_mod, node, owner = self._member(where_mod, node, part, instance_ok=last and sym.kind == "attribute")
            d = _Def("member", node, where_mod.module)
        if d.kind == "module":
            return d.module, None, "module"
        self.last_node = node
        where = f"{where_mod.rel}:{getattr(node, 'lineno', '?')}"
        if sym.kind in ("attribute", "module") or not (sym.params or sym.required is not None or sym.defaults):
            return where, None, type(node).__name__
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            drop_first = owner is not None and not any(_dotted(dec) == "staticmethod" for dec in node.decorator_list)
            return where, _ast_params(node, drop_first), "function"
        if isinstance(node, ast.ClassDef):
            return where, self._class_signature(where_mod, node), "class"
        raise _Unverifiable(f"{sym.qualname} is bound by an assignment at {where}; its signature cannot be read statically")

    def source_text(self, sym: VendorSymbol) -> str | None:
        """Source of the definition :meth:`resolve` found last (``ast.unparse``)."""
        node = getattr(self, "last_node", None)
        return ast.unparse(node) if isinstance(node, ast.AST) else None

    def _class_signature(self, idx: _ModuleIndex, cls: ast.ClassDef) -> list[Param]:
        try:
            m, node, _owner = self._member(idx, cls, "__init__", instance_ok=False)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return _ast_params(node, drop_first=True)
        except _Missing:
            pass
        except _Unverifiable:
            if not _is_dataclass(cls):
                raise
        fields = self._dataclass_fields(idx, cls)
        if fields is None:
            return []  # no __init__ anywhere in a fully known hierarchy: object.__init__
        return fields

    def _dataclass_fields(self, idx: _ModuleIndex, cls: ast.ClassDef, depth: int = 0) -> list[Param] | None:
        if not _is_dataclass(cls):
            return None
        fields: dict[str, Param] = {}
        for base in reversed(self._class_bases(idx, cls)):
            if isinstance(base, str):
                raise _Unverifiable(f"dataclass {cls.name} has base {base} outside the sources")
            inherited = self._dataclass_fields(base[0], base[1], depth + 1) if depth < 30 else None
            for p in inherited or []:
                fields[p.name] = p
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                ann = ast.unparse(node.annotation)
                if "ClassVar" in ann:
                    continue
                default = None if node.value is None else ast.unparse(node.value)
                if default and default.startswith(("field(", "dataclasses.field(")):
                    call = node.value
                    kws = {k.arg: k.value for k in call.keywords} if isinstance(call, ast.Call) else {}
                    if "init" in kws and isinstance(kws["init"], ast.Constant) and kws["init"].value is False:
                        continue
                    default = ast.unparse(kws["default"]) if "default" in kws else (
                        "<factory>" if "default_factory" in kws else None)
                fields[node.target.id] = Param(node.target.id, "positional_or_keyword", default)
        return list(fields.values())


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for dec in cls.decorator_list:
        expr = dec.func if isinstance(dec, ast.Call) else dec
        if (_dotted(expr) or "").endswith("dataclass"):
            return True
    return False


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return f"{head}.{expr.attr}" if head else None
    return None


def _ast_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> list[Param]:
    a = fn.args
    out: list[Param] = []
    positional = [(p, "positional_only") for p in a.posonlyargs] + [(p, "positional_or_keyword") for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    for (p, kind), default in zip(positional, defaults):
        out.append(Param(p.arg, kind, default))
    if drop_first and out:
        out = out[1:]
    if a.vararg:
        out.append(Param(a.vararg.arg, "var_positional", None))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append(Param(p.arg, "keyword_only", None if d is None else ast.unparse(d)))
    if a.kwarg:
        out.append(Param(a.kwarg.arg, "var_keyword", None))
    return out


# ---------------------------------------------------------- installed stack
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
            raise _Unverifiable(f"{sym.module.split('.')[0]} is not installed")
        try:
            obj = importlib.import_module(sym.module)
        except ModuleNotFoundError as exc:
            if exc.name and (sym.module == exc.name or sym.module.startswith(exc.name + ".")):
                raise _Missing("missing-module", f"module {sym.module} does not exist ({exc})") from exc
            raise _Missing("import-error", f"importing {sym.module} failed: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # OSError from a vendor's native libs, RuntimeError, ...
            raise _Missing("import-error", f"importing {sym.module} failed: {type(exc).__name__}: {exc}") from exc
        parts = sym.attr.split(".") if sym.attr else []
        for i, part in enumerate(parts):
            if not hasattr(obj, part):
                last = i == len(parts) - 1
                if last and sym.kind == "attribute" and isinstance(obj, type) and _assigns_instance_attr(obj, part):
                    return _where(obj), None, "instance attribute"
                raise _Missing("missing-symbol", f"{getattr(obj, '__name__', obj)!s} has no {part!r}")
            obj = getattr(obj, part)
        self.last_obj = obj
        where = _where(obj)
        if sym.kind in ("attribute", "module") or not (sym.params or sym.required is not None or sym.defaults):
            return where, None, type(obj).__name__
        try:
            return where, _installed_params(obj), "callable"
        except (TypeError, ValueError) as exc:
            raise _Unverifiable(f"no signature for {sym.qualname}: {exc}") from exc


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


# ------------------------------------------------------------ comparison
def compare_signature(sym: VendorSymbol, params: list[Param]) -> list[tuple[str, str]]:
    """(kind, message) for every mismatch between a declaration and a vendor signature."""
    problems: list[tuple[str, str]] = []
    by_name = {p.name: p for p in params if p.kind not in _VAR_KINDS}
    order = [p.name for p in params if p.kind not in _VAR_KINDS]
    has_var_kw = any(p.kind == "var_keyword" for p in params)
    declared = set(sym.params) | set(sym.required or ())
    missing = [n for n in sym.params if n not in by_name]
    new = [n for n in order if n not in declared]
    new_required = [n for n in new if by_name[n].default is None and by_name[n].kind != "positional_only"]
    renamed: dict[str, str] = {}
    for n in missing:
        # a parameter that vanished while an unknown one appeared at its old slot = rename
        pos = sym.params.index(n)
        cand = [m for m in new if m not in renamed.values()]
        guess = next((m for m in cand if order.index(m) == pos), None) or (cand[0] if len(cand) == 1 and len(missing) == 1 else None)
        if guess is not None:
            renamed[n] = guess
    for n in missing:
        if n in renamed:
            problems.append(("renamed-param", f"parameter {n!r} is gone; {renamed[n]!r} appeared in its place (renamed?)"))
        elif has_var_kw:
            problems.append(("kwargs-only", f"parameter {n!r} is no longer named; it is only accepted through **kwargs"))
        else:
            problems.append(("removed-param", f"parameter {n!r} was removed"))
    if sym.required is not None:
        for n in new_required:
            if n in renamed.values():
                continue
            problems.append(("new-required-param", f"new required parameter {n!r} (no default) that the driver does not pass"))
    for name, expected in sym.defaults:
        p = by_name.get(name)
        if p is None:
            if name not in missing:
                problems.append(("removed-param", f"parameter {name!r} (default relied on) was removed"))
            continue
        if p.default is None:
            problems.append(("changed-default", f"parameter {name!r} lost its default (expected {expected})"))
        elif not _same_default(p.default, expected):
            problems.append(("changed-default", f"default of {name!r} changed: expected {expected}, vendor has {p.default}"))
    return problems


def _same_default(got: str, expected: str) -> bool:
    if got == expected:
        return True
    try:
        return ast.literal_eval(got) == ast.literal_eval(expected)
    except (ValueError, SyntaxError):
        return got.rsplit(".", 2)[-2:] == expected.rsplit(".", 2)[-2:]


def _check_symbol(sym: VendorSymbol, resolver: Any) -> tuple[bool, list[tuple[str, str, str | None]]]:
    """(checked, [(kind, message, vendor_at)]) for one spelling of a declaration."""
    try:
        where, params, _what = resolver.resolve(sym)
    except _Missing as exc:
        return True, [(exc.kind, str(exc), exc.where)]
    except _Unverifiable as exc:
        kind = "not-checked" if "not in the given sources" in str(exc) or "not installed" in str(exc) else "unverifiable"
        return False, [(kind, str(exc), None)]
    out: list[tuple[str, str, str | None]] = []
    if params is not None:
        out += [(kind, message, where) for kind, message in compare_signature(sym, params)]
    if sym.mentions:
        text = resolver.source_text(sym)
        if text is None:
            out.append(("unverifiable", f"cannot read the source of {sym.qualname} to check it mentions "
                                        f"{', '.join(sym.mentions)}", where))
        else:
            gone = [m for m in sym.mentions if m not in text]
            if gone:
                out.append(("missing-behaviour", f"{sym.qualname} no longer mentions {', '.join(gone)}: the behaviour "
                                                 "the binding relies on is gone", where))
    return True, out


def check_declarations(driver: str, declared: Iterable[Declared], resolver: Any) -> DriverReport:
    """Resolve every declaration with ``resolver`` (:class:`InstalledResolver` / :class:`SourceResolver`).

    A declaration with ``alternatives`` passes when one spelling resolves
    without drift (first its own, then the alternatives in order); a note
    (``alternative``) says which one. Otherwise its own spelling's findings
    are reported, naming the alternatives tried."""
    findings: list[Finding] = []
    checked = 0
    declared = list(declared)
    for d in declared:
        def add(kind: str, message: str, vendor_at: str | None = None, d: Declared = d) -> None:
            findings.append(
                Finding(driver, d.name, d.symbol.qualname, kind, message, _rel_defined_at(d.symbol.defined_at),
                        list(d.used_at), vendor_at)
            )

        main_checked, main = _check_symbol(d.symbol, resolver)
        chosen: tuple[VendorSymbol, bool, list] = (d.symbol, main_checked, main)
        if any(kind in DRIFT_KINDS for kind, _, _ in main):
            for alt in d.symbol.alternatives:
                alt_checked, alt_out = _check_symbol(alt, resolver)
                if alt_checked and not any(kind in DRIFT_KINDS for kind, _, _ in alt_out):
                    chosen = (alt, alt_checked, alt_out)
                    break
        sym, was_checked, out = chosen
        checked += int(was_checked)
        if sym is not d.symbol:
            add("alternative", f"{d.symbol.qualname} is absent here; the seam resolves as {sym.qualname} "
                               f"(declared alternative)")
        for kind, message, where in out:
            if sym is d.symbol and d.symbol.alternatives and kind in DRIFT_KINDS:
                message += f" (alternatives tried: {', '.join(a.qualname for a in d.symbol.alternatives)})"
            add(kind, message, where)
    return DriverReport(driver, len(declared), checked, findings)


# ------------------------------------------------- vendor's own import drift
def _guards(tree: ast.Module) -> dict[int, str]:
    """id(node) -> why an import is guarded: inside ``try:``, ``if TYPE_CHECKING:``,
    or an ``if``/``else`` whose test names a version (``vllm_version_is(...)``)."""
    out: dict[int, str] = {}

    def mark(body: list[ast.stmt], why: str) -> None:
        for stmt in body:
            for n in ast.walk(stmt):
                out.setdefault(id(n), why)

    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            mark(node.body, "guarded by try")
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" in test:
                mark(node.body, "type checking only")
            elif "version" in test.lower():
                mark(node.body + node.orelse, f"version-gated by `if {test}`")
    return out


def vendor_import_drift(vendor: SourceTree, package: str, upstream: SourceResolver) -> list[Finding]:
    """Names a vendor package imports from an upstream package that the upstream lacks.

    Walks every ``from <upstream top> ... import name`` in ``package`` (the
    vendor's own code, e.g. ``vllm_ascend`` importing from ``vllm``) and
    resolves it in ``upstream``. Returns ``missing-module``/``missing-symbol``
    findings whose ``declared_at`` is the vendor's ``file:line``. An import
    that is guarded (``try:``, ``if TYPE_CHECKING:``, an ``if`` on a version)
    is reported as kind ``guarded-import`` (a note, not drift), saying which
    guard; imports from compiled extension modules cannot be read and are skipped.
    """
    out: list[Finding] = []
    for rel in vendor.python_files(package):
        try:
            tree = ast.parse(vendor.read(rel))
        except SyntaxError:
            continue
        guards = _guards(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level):
                continue
            if not upstream.covers(node.module) or node.module.split(".")[0] == package or upstream.native(node.module):
                continue
            guard = guards.get(id(node))
            at = f"{rel}:{node.lineno}"

            def add(kind: str, target: str, message: str) -> None:
                if guard:
                    out.append(Finding(package, target.rpartition(".")[2], target, "guarded-import",
                                       f"{message} ({guard}; {kind})", at))
                else:
                    out.append(Finding(package, target.rpartition(".")[2], target, kind, message, at))

            if upstream.index(node.module) is None:
                add("missing-module", node.module, f"module {node.module} does not exist upstream")
                continue
            for a in node.names:
                if a.name == "*":
                    continue
                try:
                    upstream.lookup(node.module, a.name)
                except _Missing as exc:
                    add(exc.kind, f"{node.module}.{a.name}", str(exc))
                except _Unverifiable:
                    pass
    return out


# ------------------------------------------------------------------ driver
def _drivers(names: list[str] | None) -> dict[str, type]:
    from omni_backends.errors import OmniBackendError
    from omni_backends.registry import discover, problem_of, resolve_name

    entries, _notes = discover()
    wanted = [resolve_name(n, entries, source="--driver") for n in names] if names else sorted(entries)
    out = {}
    for n in wanted:
        e = entries[n]
        if e.cls is None:
            raise OmniBackendError(f"driver {n!r} cannot be checked: {problem_of(e)}")
        out[n] = e.cls
    return out


def run_check(drivers: list[str] | None = None, sources: list[str] | None = None) -> dict[str, Any]:
    """Check the named drivers (all installed drivers when ``None``) against
    ``sources`` (paths) or, when ``sources`` is empty, the installed stack.
    Returns the JSON-able report (see :func:`render_text`)."""
    resolver: Any = SourceResolver([SourceTree(s) for s in sources]) if sources else InstalledResolver()
    declared = {n: driver_declarations(cls) for n, cls in _drivers(drivers).items()}
    reports = [check_declarations(n, decls, resolver) for n, decls in declared.items()]
    versions: dict[str, str | None] = {}
    if sources:
        for t in resolver.trees:
            versions.update(t.versions)
    else:
        tops = {d.symbol.module.split(".")[0] for decls in declared.values() for d in decls}
        dists = importlib.metadata.packages_distributions()
        for top in sorted(tops):
            for dist in dists.get(top, []):
                try:
                    versions[dist] = importlib.metadata.version(dist)
                except importlib.metadata.PackageNotFoundError:
                    versions[dist] = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "source" if sources else "installed",
        "against": resolver.describe(),
        "versions": versions,
        "drift": any(r.drift for r in reports),
        "drivers": [r.to_json() for r in reports],
    }


def render_text(report: dict[str, Any]) -> str:
    lines = [f"check-drift ({report['mode']}: {report['against']}) {report['date']}"]
    if report.get("versions"):
        lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(report["versions"].items())))
    for d in report["drivers"]:
        unchecked = d["symbols"] - d["checked"]
        status = "DRIFT" if d["drift"] else ("clean" if not unchecked else "no drift in the checked part")
        lines.append(f"\n{d['driver']}: {status} -- {d['checked']}/{d['symbols']} symbols checked, {d['drift']} drift"
                     + (f"; {unchecked} NOT checked (their source is not in what was given: see the notes)" if unchecked else ""))
        for f in d["findings"]:
            tag = f["kind"] if f["drift"] else f"note: {f['kind']}"
            lines.append(f"  [{tag}] {f['target']} ({f['symbol']}): {f['message']}")
            lines.append(f"      declared at {f['declared_at']}" + (f"; used at {', '.join(f['used_at'])}" if f["used_at"] else ""))
            if f.get("vendor_at"):
                lines.append(f"      vendor: {f['vendor_at']}")
    for v in report.get("vendor_imports", []):
        broken = [f for f in v["findings"] if f["drift"]]
        lines.append(f"\nvendor {v['package']} ({v['source']}) imports vs {v['against']}: {len(broken)} broken "
                     f"import(s), {len(v['findings']) - len(broken)} guarded")
        for f in sorted(v["findings"], key=lambda f: (not f["drift"], f["declared_at"])):
            tag = f["kind"] if f["drift"] else f"note: {f['kind']}"
            lines.append(f"  [{tag}] {f['target']}: {f['message']}  at {f['declared_at']}")
    lines.append("")
    lines.append("result: " + ("DRIFT (exit 1)" if report["drift"] else "no drift"))
    return "\n".join(lines)


def _cmd_check_drift(args: argparse.Namespace) -> int:
    report = run_check(args.driver, args.source or None)
    if args.vendor_imports:
        if not args.source:
            raise SystemExit("omni-backends check-drift: --vendor-imports needs --source (the upstream vLLM to check against)")
        upstream = SourceResolver([SourceTree(s) for s in args.source])
        vendor = SourceTree(args.vendor_imports)
        report["vendor_imports"] = []
        for pkg in args.vendor_package:
            found = vendor_import_drift(vendor, pkg, upstream)
            report["vendor_imports"].append(
                {"package": pkg, "source": vendor.describe(), "against": upstream.describe(),
                 "findings": [f.to_json() for f in found]}
            )
            report["drift"] = report["drift"] or any(f.drift for f in found)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_text(report))
    return 1 if report["drift"] else 0


def add_command(subparsers: Any) -> None:
    """Entry point (``omni_backends.commands``): adds ``check-drift``."""
    p = subparsers.add_parser(
        "check-drift",
        help="check every vendor symbol the drivers bind against an installed stack or a source tree",
        description="Resolve every VendorSymbol declared by the drivers (omni_backends/<driver>/*.py and the shared "
        "modules they use, e.g. omni_backends/vllm_upstream.py) against the installed vendor stack (import + inspect) "
        "or against source trees / wheels / sdists (AST, nothing imported). Reports missing modules and symbols, "
        "removed or renamed parameters, newly required parameters and changed defaults, each with the driver's "
        "file:line. Exit status: 0 no drift, 1 drift.",
    )
    p.add_argument("--driver", action="append", metavar="NAME",
                   help="driver to check (repeatable; aliases accepted); default: every installed driver")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--installed", action="store_true", help="resolve against the installed packages (default)")
    mode.add_argument("--source", action="append", metavar="PATH_OR_WHEEL",
                      help="source directory, .whl or sdist to read instead (repeatable, e.g. vLLM and vllm-ascend)")
    p.add_argument("--vendor-imports", metavar="PATH_OR_WHEEL",
                   help="also check a vendor's own source (e.g. the vllm-ascend wheel): every import it makes from "
                   "the --source packages must exist there")
    p.add_argument("--vendor-package", action="append", default=None, metavar="PKG",
                   help="package inside --vendor-imports to walk (default: vllm_ascend)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_check_drift_defaults)


def _cmd_check_drift_defaults(args: argparse.Namespace) -> int:
    if args.vendor_package is None:
        args.vendor_package = ["vllm_ascend"]
    return _cmd_check_drift(args)


__all__ = [
    "DRIFT_KINDS",
    "Declared",
    "DriverReport",
    "Finding",
    "InstalledResolver",
    "Param",
    "SourceResolver",
    "SourceTree",
    "add_command",
    "check_declarations",
    "compare_signature",
    "driver_declarations",
    "render_text",
    "run_check",
    "vendor_import_drift",
]
