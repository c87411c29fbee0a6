"""Vendor sources read without importing: directories, wheels, sdists (:mod:`ast`)."""

from __future__ import annotations

import ast
import dataclasses
import os
import tarfile
import zipfile
from typing import Any, Iterator

from omni_backends.binding import VendorSymbol
from omni_backends.drift.model import Param


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


class ModuleIndex:
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


class Unverifiable(Exception):
    """The definition lies outside the given sources."""


class Missing(Exception):
    def __init__(self, kind: str, message: str, where: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.where = where


class SourceResolver:
    """Resolves declarations against one or more :class:`SourceTree`s via AST."""

    def __init__(self, trees: list[SourceTree]) -> None:
        self.trees = trees
        self._index: dict[str, ModuleIndex | None] = {}

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

    def index(self, module: str) -> ModuleIndex | None:
        if module not in self._index:
            tree = self._tree_for(module.split(".")[0])
            rel = tree.module_file(module) if tree else None
            idx = None
            if rel is not None:
                try:
                    idx = ModuleIndex(module, rel, tree.read(rel), rel.endswith("__init__.py"))
                except SyntaxError:
                    idx = None
            self._index[module] = idx
        return self._index[module]

    # -- lookups
    def lookup(self, module: str, name: str, _seen: frozenset = frozenset()) -> tuple[ModuleIndex, _Def]:
        """Find top-level ``name`` in ``module``, following re-exports."""
        key = (module, name)
        if key in _seen:
            raise Missing("missing-symbol", f"import cycle resolving {module}.{name}")
        _seen = _seen | {key}
        if not self.covers(module):
            raise Unverifiable(f"{module} is outside the given sources")
        if self.native(module):
            raise Unverifiable(f"{module} is (inside) a compiled extension module")
        idx = self.index(module)
        if idx is None:
            raise Missing("missing-module", f"module {module} does not exist")
        d = idx.names.get(name)
        if d is not None and d.kind == "import":
            sub = f"{d.module}.{d.name}"
            if self.covers(sub) and self.index(sub) is not None:
                return self.index(sub), _Def("module", d.node, sub)  # type: ignore[return-value]
            return self.lookup(d.module, d.name, _seen)
        if d is not None and d.kind == "module":
            sub_idx = self.index(d.module) if self.covers(d.module) else None
            if sub_idx is None:
                raise Unverifiable(f"{module}.{name} is module {d.module}, outside the given sources")
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
                except (Missing, Unverifiable):
                    continue
        if idx.dynamic:
            raise Unverifiable(f"{module} has no {name!r} but defines a module __getattr__ that may provide it")
        raise Missing("missing-symbol", f"{module} has no {name!r}", f"{idx.rel}")

    def _class_bases(self, idx: ModuleIndex, cls: ast.ClassDef) -> list[tuple[ModuleIndex, ast.ClassDef] | str]:
        out: list[tuple[ModuleIndex, ast.ClassDef] | str] = []
        for b in cls.bases:
            expr = b.value if isinstance(b, ast.Subscript) else b
            dotted = dotted_name(expr)
            if dotted is None or dotted in ("object", "Generic", "ABC", "Protocol", "Enum", "IntEnum"):
                continue
            head, *rest = dotted.split(".")
            try:
                m, d = self.lookup(idx.module, head)
                for r in rest:
                    if d.kind != "module":
                        raise Unverifiable(dotted)
                    m, d = self.lookup(d.module, r)
                if d.kind == "class":
                    out.append((m, d.node))
                else:
                    out.append(dotted)
            except (Missing, Unverifiable):
                out.append(dotted)
        return out

    def _member(self, idx: ModuleIndex, cls: ast.ClassDef, name: str, instance_ok: bool, depth: int = 0):
        """(module index, node, owner class) of ``name`` in ``cls`` or its bases."""
        if depth > 30:
            raise Unverifiable("class hierarchy too deep")
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
            except Missing:
                continue
        if external:
            raise Unverifiable(f"{cls.name} has no {name!r}; its base(s) {', '.join(external)} lie outside the sources")
        raise Missing("missing-symbol", f"class {cls.name} has no {name!r}", f"{idx.rel}:{cls.lineno}")

    def resolve(self, sym: VendorSymbol) -> tuple[str, list[Param] | None, str]:
        """(vendor file:line, signature params or None, what it is). Raises Missing/Unverifiable."""
        self.last_node = None
        if not self.covers(sym.module):
            raise Unverifiable(f"{sym.module.split('.')[0]} is not in the given sources")
        if self.native(sym.module):
            raise Unverifiable(f"{sym.module} is (inside) a compiled extension module")
        idx = self.index(sym.module)
        if idx is None:
            raise Missing("missing-module", f"module {sym.module} does not exist in {self.describe()}")
        if not sym.attr:
            self.last_node = idx.tree  # a module's own source (its ``mentions`` / ``absent``)
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
                raise Unverifiable(f"{'.'.join(parts[:i])} is not a class in the sources; cannot look up {part!r}")
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
            drop_first = owner is not None and not any(dotted_name(dec) == "staticmethod" for dec in node.decorator_list)
            return where, ast_params(node, drop_first), "function"
        if isinstance(node, ast.ClassDef):
            return where, self._class_signature(where_mod, node), "class"
        raise Unverifiable(f"{sym.qualname} is bound by an assignment at {where}; its signature cannot be read statically")

    def source_text(self, sym: VendorSymbol) -> str | None:
        """Source of the definition :meth:`resolve` found last (``ast.unparse``)."""
        node = getattr(self, "last_node", None)
        return ast.unparse(node) if isinstance(node, ast.AST) else None

    def _class_signature(self, idx: ModuleIndex, cls: ast.ClassDef) -> list[Param]:
        try:
            m, node, _owner = self._member(idx, cls, "__init__", instance_ok=False)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return ast_params(node, drop_first=True)
        except Missing:
            pass
        except Unverifiable:
            if not _is_dataclass(cls):
                raise
        fields = self._dataclass_fields(idx, cls)
        if fields is None:
            return []  # no __init__ anywhere in a fully known hierarchy: object.__init__
        return fields

    def _dataclass_fields(self, idx: ModuleIndex, cls: ast.ClassDef, depth: int = 0) -> list[Param] | None:
        if not _is_dataclass(cls):
            return None
        fields: dict[str, Param] = {}
        for base in reversed(self._class_bases(idx, cls)):
            if isinstance(base, str):
                raise Unverifiable(f"dataclass {cls.name} has base {base} outside the sources")
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
        if (dotted_name(expr) or "").endswith("dataclass"):
            return True
    return False


def dotted_name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = dotted_name(expr.value)
        return f"{head}.{expr.attr}" if head else None
    return None


def ast_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> list[Param]:
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
