"""A class and its bases read from source: Python's method dispatch and call reach, statically (:mod:`ast`)."""

from __future__ import annotations

import ast
import collections
import dataclasses
from typing import Iterator

from omni_backends.drift.sources import SourceResolver, dotted_name, Missing, ModuleIndex, Unverifiable

#: how many methods deep :meth:`ClassChain.reach` follows calls.
MAX_DEPTH = 5


@dataclasses.dataclass(frozen=True)
class _Cls:
    idx: ModuleIndex
    node: ast.ClassDef

    @property
    def qualname(self) -> str:
        return f"{self.idx.module}.{self.node.name}"

    def at(self, node: ast.AST | None = None) -> str:
        return f"{self.idx.rel}:{getattr(node or self.node, 'lineno', '?')}"


@dataclasses.dataclass(frozen=True)
class Method:
    owner: _Cls
    node: ast.FunctionDef | ast.AsyncFunctionDef

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def label(self) -> str:
        return f"{self.owner.node.name}.{self.node.name}"

    def at(self, node: ast.AST | None = None) -> str:
        return self.owner.at(node or self.node)


class ClassChain:
    """A class and its bases (depth-first, left to right, each once) as far as the sources reach."""

    def __init__(self, resolver: SourceResolver, module: str, name: str) -> None:
        self.resolver = resolver
        idx, d = resolver.lookup(module, name)
        if d.kind != "class":
            raise Missing("missing-symbol", f"{module}.{name} is not a class in the sources", idx.rel)
        self.classes: list[_Cls] = []
        self.external: list[str] = []  # bases outside the sources
        self._walk(_Cls(idx, d.node), 0)

    @classmethod
    def of(cls, resolver: SourceResolver, start: _Cls) -> "ClassChain":
        chain = cls.__new__(cls)
        chain.resolver, chain.classes, chain.external = resolver, [], []
        chain._walk(start, 0)
        return chain

    def _walk(self, c: _Cls, depth: int) -> None:
        if depth > 30 or any(x.node is c.node for x in self.classes):
            return
        self.classes.append(c)
        for base in self.resolver._class_bases(c.idx, c.node):
            if isinstance(base, str):
                self.external.append(base)
            else:
                self._walk(_Cls(base[0], base[1]), depth + 1)

    @property
    def leaf(self) -> _Cls:
        return self.classes[0]

    def has(self, module: str, name: str) -> bool:
        return any(c.idx.module == module and c.node.name == name for c in self.classes)

    def method(self, name: str, after: _Cls | None = None) -> Method | None:
        """``self.name`` as Python dispatches it (``after``: ``super()`` from that class)."""
        start = 0
        if after is not None:
            for i, c in enumerate(self.classes):
                if c.node is after.node:
                    start = i + 1
        for c in self.classes[start:]:
            for node in c.node.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    return Method(c, node)
        return None

    def live_methods(self) -> list[Method]:
        """Every method the leaf dispatches to, plus shadowed ones reached through ``super()``/``Base.m(self``."""
        names: list[str] = []
        for c in self.classes:
            for node in c.node.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in names:
                    names.append(node.name)
        live = [m for m in (self.method(n) for n in names) if m is not None]
        seen = {id(m.node) for m in live}
        queue = list(live)
        while queue:
            m = queue.pop()
            for target, _line in self._explicit_targets(m):
                if id(target.node) not in seen:
                    seen.add(id(target.node))
                    live.append(target)
                    queue.append(target)
        return live

    def _explicit_targets(self, m: Method) -> Iterator[tuple[Method, int]]:
        """Methods ``m`` calls through ``super().x(`` or ``Base.x(self, ...)``."""
        for node in ast.walk(m.node):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            recv = node.func.value
            if isinstance(recv, ast.Call) and dotted_name(recv.func) == "super":
                t = self.method(node.func.attr, after=m.owner)
                if t is not None:
                    yield t, node.lineno
            elif node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                dotted = dotted_name(recv)
                cls = self.class_named(m.owner, dotted) if dotted else None
                if cls is not None:
                    t = self._method_from(cls, node.func.attr)
                    if t is not None:
                        yield t, node.lineno

    def class_named(self, where: _Cls, dotted: str) -> _Cls | None:
        for c in self.classes:
            if c.node.name == dotted.rpartition(".")[2]:
                return c
        try:
            head, *rest = dotted.split(".")
            idx, d = self.resolver.lookup(where.idx.module, head)
            for r in rest:
                if d.kind != "module":
                    return None
                idx, d = self.resolver.lookup(d.module, r)
            return _Cls(idx, d.node) if d.kind == "class" else None
        except (Missing, Unverifiable):
            return None

    def _method_from(self, cls: _Cls, name: str) -> Method | None:
        for i, c in enumerate(self.classes):
            if c.node is cls.node:
                for k in self.classes[i:]:
                    for node in k.node.body:
                        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                            return Method(k, node)
                return None
        return ClassChain.of(self.resolver, cls).method(name)

    def targets(self, m: Method, via: str | None = None) -> Iterator[tuple[str, Method | None, int]]:
        """(name, resolved method or None, line) for every ``self.name`` use, ``super().name(`` and
        ``Base.name(self`` in ``m``; with ``via`` also ``self.<via>.name`` (e.g. a worker's
        ``self.model_runner._dummy_run``: resolved to None, it is another object's method)."""
        for node in ast.walk(m.node):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                yield node.attr, self.method(node.attr), node.lineno
            elif (via and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == via and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"):
                yield node.attr, None, node.lineno
        for t, line in self._explicit_targets(m):
            yield t.name, t, line

    def reach(self, caller: str, callee: str, via: str | None = None) -> tuple[list[str], str] | None:
        """Path (method labels) and ``file:line`` where ``caller`` reaches ``callee``, or None
        (``via``: see :meth:`targets`)."""
        start = self.method(caller)
        if start is None:
            return None
        queue = collections.deque([(start, [start.label])])
        seen = {id(start.node)}
        while queue:
            m, path = queue.popleft()
            for name, target, line in self.targets(m, via):
                if name == callee:
                    return path + [callee], m.at(_Line(line))
                if target is not None and id(target.node) not in seen and len(path) < MAX_DEPTH:
                    seen.add(id(target.node))
                    queue.append((target, path + [target.label]))
        return None

    def abstract_methods(self) -> dict[str, str]:
        """name -> ``file:line`` of every ``@abstractmethod`` of the chain's classes (the leaf's first)."""
        out: dict[str, str] = {}
        for c in self.classes:
            for node in c.node.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    (dotted_name(d) or "").rpartition(".")[2] == "abstractmethod" for d in node.decorator_list
                ):
                    out.setdefault(node.name, c.at(node))
        return out


@dataclasses.dataclass(frozen=True)
class _Line:
    lineno: int
