"""Seam facts about the runner's async output: what ``sample_tokens`` returns and how the executors unwrap it.

- the abstract methods of the async base (``AsyncModelRunnerOutput``);
- the executors' ``isinstance(x, AsyncModelRunnerOutput)``;
- each class ``sample_tokens`` returns: ``async-output-unrecognised`` when
  it looks async (``get_output``) but does not subclass the base;
- the core's wrapper: ``async-wrapper-unrecognised`` when it relies on
  ``get_output`` duck typing where the executor uses ``isinstance``,
  ``abstract-not-implemented`` when the base declares abstract methods the
  wrapper does not implement.
"""

from __future__ import annotations

import ast
import collections

from omni_backends.binding import AsyncOutputContract, VendorSymbol
from omni_backends.drift.chain import ClassChain, Method
from omni_backends.drift.seam_facts import SeamCheck, declared_at, ours_line
from omni_backends.drift.sources import dotted_name, Missing, Unverifiable


def subclasses(chain: ClassChain, base: VendorSymbol) -> bool:
    """True if a class of ``chain`` is ``base`` (or a base outside the sources is named like it)."""
    return any(c.node.name == base.attr and c.idx.module == base.module for c in chain.classes) or any(
        e.rpartition(".")[2] == base.attr for e in chain.external
    )


class AsyncOutputCheck(SeamCheck):
    """The ``async-output`` facts of one runner chain."""

    def async_output(self, a: AsyncOutputContract) -> None:
        """Every ``async-output`` fact of contract part ``a`` about ``self.chain`` (see the module docstring)."""
        ours = ours_line(self.contract, a.ours) or declared_at(a)
        base_name = a.base.attr
        try:
            base_chain = ClassChain(self.resolver, a.base.module, a.base.attr)
        except (Missing, Unverifiable) as exc:
            self.add("async-output", base_name, "drift", "missing-base", f"{a.base.qualname} exists", str(exc), ours)
            return
        abstract = base_chain.abstract_methods()
        self.add("async-output", f"{base_name} abstract methods", "clean", "ok", "listed",
                 ", ".join(sorted(abstract)) or "(none)", ours, base_chain.leaf.at())
        checks = self._executor_checks(a, ours)
        async_returned = self._returned_outputs(a, ours, checks)
        self._wrapper(a, ours, checks, abstract, async_returned)

    def _executor_checks(self, a: AsyncOutputContract, ours: str | None) -> list[str]:
        """``file:line`` of each executor's ``isinstance(…, <async base>)``, reported as one fact."""
        base_name = a.base.attr
        checks: list[str] = []
        for mod in a.executors:
            idx = self.resolver.index(mod) if self.resolver.covers(mod) else None
            if idx is None:
                continue
            for n in ast.walk(idx.tree):
                if (isinstance(n, ast.Call) and dotted_name(n.func) == "isinstance" and len(n.args) == 2
                        and base_name in {(dotted_name(x) or "").rpartition(".")[2] for x in
                                          (n.args[1].elts if isinstance(n.args[1], ast.Tuple) else [n.args[1]])}):
                    checks.append(f"{idx.rel}:{n.lineno}")
        self.add("async-output", f"executor isinstance(…, {base_name})", "clean" if checks else "note",
                 "ok" if checks else "not-found", f"executors recognise async outputs by isinstance(…, {base_name})",
                 ", ".join(checks) or f"no isinstance(…, {base_name}) in {', '.join(a.executors)}", ours,
                 checks[0] if checks else None)
        return checks

    def _returned_outputs(self, a: AsyncOutputContract, ours: str | None, checks: list[str]) -> bool:
        """One fact per class ``sample_tokens`` returns; True if one of them is an async output."""
        base_name = a.base.attr
        st = self.chain.method("sample_tokens")
        returned = self._returned_classes(st) if st is not None else []
        async_returned = False
        for label, cls_chain, at in returned:
            if cls_chain is None:
                self.add("async-output", f"sample_tokens returns {label}", "note", "unresolved", "a known class",
                         f"{label} (not resolvable in the sources)", ours, at)
                continue
            is_async = subclasses(cls_chain, a.base)
            looks_async = cls_chain.method("get_output") is not None
            if is_async:
                async_returned = True
                self.add("async-output", f"sample_tokens returns {label}", "clean", "ok",
                         f"an async output subclasses {base_name}", f"{cls_chain.leaf.qualname} subclasses {base_name}",
                         ours, at)
            elif looks_async:
                self.add("async-output", f"sample_tokens returns {label}", "drift", "async-output-unrecognised",
                         f"an async output subclasses {base_name}",
                         f"{cls_chain.leaf.qualname} ({cls_chain.leaf.at()}) has get_output but does not subclass "
                         f"{base_name}: the executor's isinstance check ({checks[0] if checks else '?'}) never "
                         "unwraps it", ours, at)
            else:
                self.add("async-output", f"sample_tokens returns {label}", "clean", "ok", "a step output",
                         f"{cls_chain.leaf.qualname} (not async)", ours, at)
        return async_returned

    def _wrapper(self, a: AsyncOutputContract, ours: str | None, checks: list[str], abstract: dict[str, str],
                 async_returned: bool) -> None:
        """The fact about the core's async wrapper: recognised by the executors, implementing the base."""
        base_name = a.base.attr
        if not async_returned:
            self.add("async-output", "omni async wrapper", "clean", "ok", f"wraps {base_name} outputs",
                     "sample_tokens returns no async output here; the wrapper is not used", ours)
        elif a.recognised_by == "get_output" and checks:
            self.add("async-output", "omni async wrapper", "drift", "async-wrapper-unrecognised",
                     "the executor unwraps any output with get_output() (the wrapper is a plain class)",
                     f"the executor tests isinstance(…, {base_name}) at {', '.join(checks)}: the wrapped output "
                     "is passed on unconverted (it reaches the scheduler)", ours, checks[0])
        else:
            missing = [] if a.implements is None else sorted(set(abstract) - set(a.implements))
            if missing:
                self.add("async-output", "omni async wrapper", "drift", "abstract-not-implemented",
                         f"the wrapper implements {', '.join(a.implements or ())}",
                         f"{base_name} also declares abstract {', '.join(missing)}", ours,
                         abstract[missing[0]])
            else:
                self.add("async-output", "omni async wrapper", "clean", "ok",
                         f"subclasses {base_name}, implements "
                         + ("every abstract method (delegated)" if a.implements is None else ", ".join(a.implements)),
                         f"abstract: {', '.join(sorted(abstract))}; isinstance at {', '.join(checks) or '-'}", ours,
                         checks[0] if checks else None)

    def _returned_classes(self, m: Method, depth: int = 0) -> list[tuple[str, ClassChain | None, str]]:
        out: list[tuple[str, ClassChain | None, str]] = []
        assigns: dict[str, list[ast.expr]] = collections.defaultdict(list)
        for n in ast.walk(m.node):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        assigns[t.id].append(n.value)
        for n in ast.walk(m.node):
            if not isinstance(n, ast.Return) or n.value is None:
                continue
            values = [n.value]
            if isinstance(n.value, ast.Name):
                values = assigns.get(n.value.id, [])
            for v in values:
                if not isinstance(v, ast.Call):
                    continue
                f = v.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and dotted_name(f.value.func) == "super":
                    parent = self.chain.method(f.attr, after=m.owner)
                    if parent is not None and depth < 3:
                        out += self._returned_classes(parent, depth + 1)
                    continue
                dotted = dotted_name(f)
                parts = (dotted or "").split(".")
                if not dotted or parts[0] == "self" or not any(p[:1].isupper() for p in parts[-2:]):
                    continue  # a method or function call (copy(...), out.get_output()), not a class
                cls = self.chain.class_named(m.owner, dotted)
                if cls is None and "." in dotted:  # Class.factory(...)
                    cls = self.chain.class_named(m.owner, dotted.rpartition(".")[0])
                if any(o[0] == dotted and o[2] == m.at(n) for o in out):
                    continue
                sub = None
                if cls is not None:
                    sub = ClassChain.of(self.resolver, cls)
                out.append((dotted.split(".")[0] if cls is not None and "." in dotted else dotted, sub, m.at(n)))
        return out


__all__ = ["AsyncOutputCheck", "subclasses"]
