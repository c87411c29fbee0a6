"""The seam check: a :class:`~omni_backends.binding.SeamContract` against a driver's base runner chain.

Everything is read with :mod:`ast` from the given sources (directories,
wheels, sdists, or the installed packages' directories); nothing is imported.
For a base runner class (the one a driver's ``model_runner_base`` returns) the
*chain* is that class and its bases as far as the sources reach (the driver's
vendor classes, then vLLM's). A method name resolves the way Python dispatches
``self.name``: the first class of the chain that defines it.

Facts checked (each reported with its status, clean ones too):

- ``seam``: every method the core overrides exists in the chain with the
  parameters it assumes (kinds from :func:`~omni_backends.drift.symbols.compare_signature`,
  plus ``missing-seam``).
- ``call-edge``: ``caller`` reaches ``callee`` (``self.x``, ``super().x``,
  ``Base.x(self``; through other methods of the chain, a few levels deep);
  ``missing-call-edge`` when a relied-on edge is gone.
- ``model-call``: every ``self.model(`` / ``partial(self.model`` / ``model(`` /
  ``<…model…>.forward(`` in a method the chain dispatches to, ``covered`` or
  ``uncovered-model-call`` per the contract's coverage, with the entry points
  (``execute_model``, ``profile_run``, ``capture_model``, ...) that reach it.
- ``async-output``: the classes ``sample_tokens`` returns, the executors'
  ``isinstance(x, AsyncModelRunnerOutput)``, the abstract methods of that
  base: ``async-output-unrecognised`` (a returned async-looking class the
  executor does not recognise), ``async-wrapper-unrecognised`` (the core's
  wrapper relies on ``get_output`` duck typing where the executor uses
  ``isinstance``), ``abstract-not-implemented``.
- ``model-state`` (V2): ``init_model_state`` consults ``get_model_state_cls``
  (``model-state-not-consulted``); a vendor reassigning it at module level
  (``model-state-replaced``); each state method the omni state overrides is
  called by the runner (``state-override-never-called``); every abstract
  method of the state interface is implemented (``abstract-not-implemented``).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import os
from typing import Any, Iterator

from omni_backends.binding import (
    MODEL_CALL_FORMS,
    AsyncOutputContract,
    ModelCallCoverage,
    Seam,
    SeamContract,
    V1RunnerContract,
    V2RunnerContract,
    VendorSymbol,
)
from omni_backends.drift.chain import _MAX_DEPTH, ClassChain, _Cls, _Method
from omni_backends.drift.model import _rel_defined_at
from omni_backends.drift.sources import SourceResolver, _ast_params, _dotted, _Missing, _ModuleIndex, _Unverifiable
from omni_backends.drift.symbols import compare_signature

#: seam-fact kinds that are drift (non-zero exit).
SEAM_DRIFT_KINDS = (
    "missing-seam", "removed-param", "renamed-param", "new-required-param", "changed-default",
    "missing-call-edge", "uncovered-model-call", "async-output-unrecognised", "async-wrapper-unrecognised",
    "abstract-not-implemented", "model-state-not-consulted", "model-state-replaced", "state-override-never-called",
    "missing-base",
)
#: entry points whose reach is reported for each model call.
ENTRY_POINTS = ("execute_model", "sample_tokens", "profile_run", "capture_model", "_dummy_run", "warming_up_model")


@dataclasses.dataclass
class SeamFact:
    """One checked fact of the contract about one base runner.

    ``status``: ``clean`` (holds), ``covered`` (a model call the core sees),
    ``drift`` (broken: ``kind`` says how) or ``note`` (reported, not drift).
    ``expected`` is what the contract assumes, ``found`` what the source shows;
    ``ours`` / ``vendor`` are ``file:line`` on both sides."""

    runner: str  # "v1" | "v2"
    base: str  # the driver's base runner, module.Class
    fact: str  # seam | call-edge | model-call | async-output | model-state
    seam: str  # e.g. "_preprocess", "execute_model -> _preprocess", "GPUModelRunner._dummy_run: self.model("
    status: str
    kind: str  # "ok" for clean facts, else a SEAM_DRIFT_KINDS entry or a note kind
    expected: str
    found: str
    ours: str | None = None
    vendor: str | None = None

    @property
    def drift(self) -> bool:
        return self.status == "drift"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------ helpers
def _ours(contract: SeamContract, ref: str) -> str | None:
    """``file.py:Qualname`` (relative to the contract's root) -> ``file.py:line``, read with ast."""
    if not ref:
        return None
    path, _, qual = ref.partition(":")
    full = os.path.join(contract.root, path)
    try:
        tree = ast.parse(open(full, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return f"{path} (not found under {contract.root})"
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qual.split(".") if qual else []:
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return f"{path}: {qual} not found"
        body = getattr(node, "body", [])
    return f"{path}:{getattr(node, 'lineno', 1)}"


def _declared(obj: Any) -> str | None:
    return _rel_defined_at(obj.defined_at) if getattr(obj, "defined_at", "") else None


def _model_call_form(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "model" and isinstance(f.value, ast.Name) and f.value.id == "self":
        return "self.model("
    if isinstance(f, ast.Name) and f.id == "model":
        return "model("
    if (_dotted(f) or "").rpartition(".")[2] == "partial" and call.args:
        a = call.args[0]
        if isinstance(a, ast.Attribute) and a.attr == "model" and isinstance(a.value, ast.Name) and a.value.id == "self":
            return "partial(self.model"
    if isinstance(f, ast.Attribute) and f.attr == "forward":
        recv = _dotted(f.value) or ""
        if "model" in recv.rpartition(".")[2].lower():
            return ".forward("
    return None


def _abstract_methods(chain: ClassChain, top: _Cls) -> dict[str, str]:
    """name -> file:line of every ``@abstractmethod`` of ``top`` and its bases."""
    out: dict[str, str] = {}
    classes = [top] + [c for c in chain.classes if c.node is not top.node]
    for c in classes:
        for node in c.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                (_dotted(d) or "").rpartition(".")[2] == "abstractmethod" for d in node.decorator_list
            ):
                out.setdefault(node.name, c.at(node))
    return out


def _is_subclass(chain: ClassChain, base: VendorSymbol) -> bool:
    return any(c.node.name == base.attr and c.idx.module == base.module for c in chain.classes) or any(
        e.rpartition(".")[2] == base.attr for e in chain.external
    )


class _Checker:
    def __init__(self, contract: SeamContract, resolver: SourceResolver, runner: str, chain: ClassChain) -> None:
        self.contract, self.resolver, self.runner, self.chain = contract, resolver, runner, chain
        self.facts: list[SeamFact] = []

    def add(self, fact: str, seam: str, status: str, kind: str, expected: str, found: str,
            ours: str | None = None, vendor: str | None = None) -> None:
        assert status != "drift" or kind in SEAM_DRIFT_KINDS, kind
        self.facts.append(SeamFact(self.runner, self.chain.leaf.qualname, fact, seam, status, kind, expected, found,
                                   ours, vendor))

    # -- seams
    def seam(self, s: Seam, chain: ClassChain | None = None, fact: str = "seam") -> _Method | None:
        chain = chain or self.chain
        ours = _ours(self.contract, s.ours) or _declared(s)
        m = next((x for x in (chain.method(n) for n in (s.name, *s.alternatives)) if x is not None), None)
        expected = f"{s.name}({', '.join(s.params)})" if s.required is not None else f"{s.name}(...) (arguments passed through)"
        if s.alternatives:
            expected += f" or its spelling {' / '.join(s.alternatives)}"
        if m is None:
            self.add(fact, s.name, "drift", "missing-seam", expected,
                     f"no class of {chain.leaf.qualname}'s chain defines {' or '.join(repr(n) for n in (s.name, *s.alternatives))}"
                     + (f" (bases outside the sources: {', '.join(chain.external)})" if chain.external else ""),
                     ours, chain.leaf.at())
            return None
        params = _ast_params(m.node, drop_first=True)
        sym = VendorSymbol(m.owner.idx.module, f"{m.owner.node.name}.{m.name}", params=s.params, required=s.required,
                           defined_at=s.defined_at or "?:0")
        problems = compare_signature(sym, params)
        found = f"{m.label}({', '.join(p.name + ('' if p.default is None else '=' + p.default) for p in params)})"
        if not problems:
            self.add(fact, s.name, "clean", "ok", expected, found, ours, m.at())
        for kind, message in problems:
            status = "note" if kind == "kwargs-only" else "drift"
            self.add(fact, s.name, status, kind, expected, f"{found}: {message}", ours, m.at())
        return m

    # -- call edges
    def edges(self, edges: tuple, via: str | None = None) -> None:
        for e in edges:
            ours = _declared(e)
            caller = self.chain.method(e.caller)
            seam = f"{e.caller} -> {e.callee}"
            if caller is None:
                self.add("call-edge", seam, "drift" if e.relied_on else "note",
                         "missing-call-edge" if e.relied_on else "not-defined",
                         f"{e.caller} reaches {e.callee}", f"{e.caller} is not defined in the chain", ours,
                         self.chain.leaf.at())
                continue
            got = self.chain.reach(e.caller, e.callee, via)
            if got is None:
                self.add("call-edge", seam, "drift" if e.relied_on else "note",
                         "missing-call-edge" if e.relied_on else "no-edge",
                         f"{e.caller} reaches {e.callee}" + (f" ({e.why})" if e.why else ""),
                         f"{caller.label} does not reach {e.callee} (within {_MAX_DEPTH} calls)", ours, caller.at())
            else:
                path, at = got
                self.add("call-edge", seam, "clean", "ok", f"{e.caller} reaches {e.callee}", " -> ".join(path), ours, at)

    # -- model calls
    def model_calls(self, cov: ModelCallCoverage) -> None:
        ours = _ours(self.contract, cov.ours) or _declared(cov)
        reachers: dict[int, list[str]] = {}
        live = self.chain.live_methods()
        for m in live:
            for call in (n for n in ast.walk(m.node) if isinstance(n, ast.Call)):
                form = _model_call_form(call)
                if form is None:
                    continue
                if id(m.node) not in reachers:
                    reachers[id(m.node)] = [ep for ep in ENTRY_POINTS if ep == m.name or self._reaches(ep, m)]
                covered = m.name in cov.in_methods or form in cov.forms
                where = f"in {m.label}" + (f", reached from {', '.join(reachers[id(m.node)])}"
                                            if reachers[id(m.node)] else "")
                scope = [f"calls inside {', '.join(cov.in_methods)}"] if cov.in_methods else []
                scope += [f"every {', '.join(cov.forms)} call"] if cov.forms else []
                expected = f"covered by {cov.by or 'the core'} ({'; '.join(scope) or 'nothing'})"
                if covered:
                    self.add("model-call", f"{m.label}: {form}", "covered", "ok", expected, f"{form} {where}", ours,
                             m.at(call))
                else:
                    self.add("model-call", f"{m.label}: {form}", "drift", "uncovered-model-call", expected,
                             f"{form} {where}: the core never sees this call's output (an omni output reaches "
                             "vLLM code unconverted)", ours, m.at(call))

    def _reaches(self, entry: str, m: _Method) -> bool:
        return self.chain.reach(entry, m.name) is not None

    # -- async output
    def async_output(self, a: AsyncOutputContract) -> None:
        ours = _ours(self.contract, a.ours) or _declared(a)
        base_name = a.base.attr
        try:
            base_chain = ClassChain(self.resolver, a.base.module, a.base.attr)
        except (_Missing, _Unverifiable) as exc:
            self.add("async-output", base_name, "drift", "missing-base", f"{a.base.qualname} exists", str(exc), ours)
            return
        abstract = _abstract_methods(base_chain, base_chain.leaf)
        self.add("async-output", f"{base_name} abstract methods", "clean", "ok", "listed",
                 ", ".join(sorted(abstract)) or "(none)", ours, base_chain.leaf.at())
        # executors
        checks: list[str] = []
        for mod in a.executors:
            idx = self.resolver.index(mod) if self.resolver.covers(mod) else None
            if idx is None:
                continue
            for n in ast.walk(idx.tree):
                if (isinstance(n, ast.Call) and _dotted(n.func) == "isinstance" and len(n.args) == 2
                        and base_name in {(_dotted(x) or "").rpartition(".")[2] for x in
                                          (n.args[1].elts if isinstance(n.args[1], ast.Tuple) else [n.args[1]])}):
                    checks.append(f"{idx.rel}:{n.lineno}")
        self.add("async-output", f"executor isinstance(…, {base_name})", "clean" if checks else "note",
                 "ok" if checks else "not-found", f"executors recognise async outputs by isinstance(…, {base_name})",
                 ", ".join(checks) or f"no isinstance(…, {base_name}) in {', '.join(a.executors)}", ours,
                 checks[0] if checks else None)
        # what sample_tokens returns
        st = self.chain.method("sample_tokens")
        returned = self._returned_classes(st) if st is not None else []
        async_returned = False
        for label, cls_chain, at in returned:
            if cls_chain is None:
                self.add("async-output", f"sample_tokens returns {label}", "note", "unresolved", "a known class",
                         f"{label} (not resolvable in the sources)", ours, at)
                continue
            is_async = _is_subclass(cls_chain, a.base)
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
        # the core's wrapper
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

    def _returned_classes(self, m: _Method, depth: int = 0) -> list[tuple[str, ClassChain | None, str]]:
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
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and _dotted(f.value.func) == "super":
                    parent = self.chain.method(f.attr, after=m.owner)
                    if parent is not None and depth < 3:
                        out += self._returned_classes(parent, depth + 1)
                    continue
                dotted = _dotted(f)
                parts = (dotted or "").split(".")
                if not dotted or parts[0] == "self" or not any(p[:1].isupper() for p in parts[-2:]):
                    continue  # a method or function call (copy(...), out.get_output()), not a class
                cls = self.chain._class_named(m.owner, dotted)
                if cls is None and "." in dotted:  # Class.factory(...)
                    cls = self.chain._class_named(m.owner, dotted.rpartition(".")[0])
                if any(o[0] == dotted and o[2] == m.at(n) for o in out):
                    continue
                sub = None
                if cls is not None:
                    sub = ClassChain.of(self.resolver, cls)
                out.append((dotted.split(".")[0] if cls is not None and "." in dotted else dotted, sub, m.at(n)))
        return out

    # -- V2 model state
    def model_state(self, v2: V2RunnerContract) -> None:
        ours_init = _declared(v2)
        # where the runner builds its state
        calls = [(m, n) for m in self.chain.live_methods() for n in ast.walk(m.node)
                 if isinstance(n, ast.Call) and (_dotted(n.func) or "").rpartition(".")[2] == v2.init_function]
        if not calls:
            self.add("model-state", v2.init_function, "drift", "model-state-not-consulted",
                     f"the runner builds its model state with {v2.init_function}(), consulting {v2.state_hook}",
                     f"no method of {self.chain.leaf.qualname}'s chain calls {v2.init_function}", ours_init,
                     self.chain.leaf.at())
        for m, call in calls[:1]:
            fn = self._function(m.owner.idx, _dotted(call.func) or v2.init_function)
            if fn is None:
                self.add("model-state", v2.init_function, "note", "unresolved", f"{v2.init_function} consults "
                         f"{v2.state_hook}", f"{v2.init_function} not resolvable from {m.owner.idx.module}",
                         ours_init, m.at(call))
                continue
            idx, node = fn
            hit = self._consults(idx, node, v2.state_hook)
            if hit:
                self.add("model-state", f"{v2.init_function} consults {v2.state_hook}", "clean", "ok",
                         f"{v2.init_function} consults the model's {v2.state_hook}()",
                         f"{idx.module}.{node.name} ({idx.rel}:{node.lineno}) -> {hit}", ours_init, hit)
            else:
                self.add("model-state", f"{v2.init_function} consults {v2.state_hook}", "drift",
                         "model-state-not-consulted", f"{v2.init_function} consults the model's {v2.state_hook}()",
                         f"{idx.module}.{node.name} never reads {v2.state_hook}: the omni model state is never "
                         f"built (called from {m.label})", ours_init, f"{idx.rel}:{node.lineno}")
        # vendor module-level replacement
        vendor_tops = sorted({c.idx.module.split(".")[0] for c in self.chain.classes} - {"vllm"})
        for top in vendor_tops:
            tree = self.resolver._tree_for(top)
            if tree is None:
                continue
            for rel in tree.python_files(top):
                try:
                    mod_tree = ast.parse(tree.read(rel))
                except SyntaxError:
                    continue
                for n in ast.walk(mod_tree):
                    if isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == v2.init_function
                                                         for t in n.targets):
                        target = next(ast.unparse(t) for t in n.targets if isinstance(t, ast.Attribute))
                        module = rel[:-3].replace("/", ".")
                        module = module[module.index(top + "."):] if (top + ".") in module else module
                        repl = self._function(self.resolver.index(module), _dotted(n.value) or "") \
                            if self.resolver.index(module) is not None else None
                        hit = self._consults(*repl, v2.state_hook) if repl else None
                        if hit:
                            self.add("model-state", f"{target} replaced", "note", "replaced-consults",
                                     f"{v2.init_function} consults {v2.state_hook}",
                                     f"{top} replaces {target} with {ast.unparse(n.value)}, which consults it",
                                     ours_init, f"{rel}:{n.lineno}")
                        else:
                            self.add("model-state", f"{target} replaced", "drift", "model-state-replaced",
                                     f"{v2.init_function} consults the model's {v2.state_hook}()",
                                     f"{top} replaces {target} at module level with {ast.unparse(n.value)}"
                                     + (f" ({repl[0].rel}:{repl[1].lineno})" if repl else "")
                                     + f", which never reads {v2.state_hook}: the omni model state is never built",
                                     ours_init, f"{rel}:{n.lineno}")
        # state seams: signatures against the state base, and called by the runner
        try:
            state_chain = ClassChain(self.resolver, v2.state_base.module, v2.state_base.attr)
        except (_Missing, _Unverifiable) as exc:
            self.add("model-state", v2.state_base.qualname, "drift", "missing-base", f"{v2.state_base.qualname} exists",
                     str(exc), _declared(v2.state_base))
            return
        called = self._state_calls()
        for s in v2.state_seams:
            first = len(self.facts)
            self.seam(s, state_chain, fact="model-state")
            sites = [site for n in (s.name, *s.alternatives) for site in called.get(n, [])]
            ours = _ours(self.contract, s.ours) or _declared(s)
            if s.name == "__init__":
                continue
            if sites:
                self.add("model-state", f"runner calls model_state.{s.name}", "clean", "ok",
                         f"the runner calls model_state.{s.name}()", ", ".join(sites[:4]) + (" ..." if len(sites) > 4 else ""),
                         ours, sites[0])
            else:
                self.add("model-state", f"runner calls model_state.{s.name}", "drift", "state-override-never-called",
                         f"the runner calls model_state.{s.name}() (the omni state overrides it)",
                         f"no call of model_state.{s.name}( in {', '.join(sorted(self._state_call_dirs()))}: the "
                         "override never runs", ours, self.chain.leaf.at())
            if s.fallback and not sites:  # the core does the seam's work elsewhere when the runner never calls it
                where = _ours(self.contract, s.fallback)
                for f in self.facts[first:]:
                    if f.status == "drift" and f.kind in ("missing-seam", "state-override-never-called"):
                        f.status, f.kind = "note", f"{f.kind}-fallback"
                        f.found += f"; the core falls back to {s.fallback.partition(':')[2]} ({where})"
        # abstract methods of the interface
        try:
            iface = ClassChain(self.resolver, v2.state_interface.module, v2.state_interface.attr)
        except (_Missing, _Unverifiable) as exc:
            self.add("model-state", v2.state_interface.qualname, "note", "missing-base", "exists", str(exc))
            return
        abstract = _abstract_methods(iface, iface.leaf)
        overridden = {n for s in v2.state_seams for n in (s.name, *s.alternatives)}
        for name, at in sorted(abstract.items()):
            impl = state_chain.method(name)
            concrete = impl is not None and impl.owner.node is not iface.leaf.node and not any(
                (_dotted(d) or "").endswith("abstractmethod") for d in impl.node.decorator_list)
            if name in overridden or concrete:
                self.add("model-state", f"abstract {name}", "clean", "ok", f"{name} implemented",
                         "by the omni state" if name in overridden else f"by {impl.label} ({impl.at()})",
                         _declared(v2), at)
            else:
                self.add("model-state", f"abstract {name}", "drift", "abstract-not-implemented", f"{name} implemented",
                         f"abstract in {iface.leaf.qualname}; neither {v2.state_base.attr} nor the omni state "
                         "implements it", _declared(v2), at)

    def _state_call_dirs(self) -> set[str]:
        return {os.path.dirname(c.idx.rel) for c in self.chain.classes}

    def _state_calls(self) -> dict[str, list[str]]:
        """model-state method name -> ``file:line`` of each ``….model_state.name(`` in the chain's packages."""
        out: dict[str, list[str]] = collections.defaultdict(list)
        for c in self.chain.classes:
            tree = self.resolver._tree_for(c.idx.module.split(".")[0])
            folder = os.path.dirname(c.idx.rel)
            if tree is None:
                continue
            for rel in tree.python_files(c.idx.module.split(".")[0]):
                if os.path.dirname(rel) != folder:
                    continue
                try:
                    t = ast.parse(tree.read(rel))
                except SyntaxError:
                    continue
                for n in ast.walk(t):
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                        recv = _dotted(n.func.value) or ""
                        if recv.rpartition(".")[2] == "model_state":
                            site = f"{rel}:{n.lineno}"
                            if site not in out[n.func.attr]:
                                out[n.func.attr].append(site)
        return out

    def _function(self, idx: _ModuleIndex | None, dotted: str) -> tuple[_ModuleIndex, ast.FunctionDef] | None:
        if idx is None or not dotted:
            return None
        try:
            head, *rest = dotted.split(".")
            m, d = self.resolver.lookup(idx.module, head)
            for r in rest:
                if d.kind != "module":
                    return None
                m, d = self.resolver.lookup(d.module, r)
        except (_Missing, _Unverifiable):
            return None
        return (m, d.node) if d.kind == "def" else None

    def _consults(self, idx: _ModuleIndex, fn: ast.FunctionDef, hook: str, depth: int = 0) -> str | None:
        """``file:line`` where ``fn`` (or a module-level function it calls) reads ``hook``."""
        for n in ast.walk(fn):
            if (isinstance(n, ast.Attribute) and n.attr == hook) or (isinstance(n, ast.Constant) and n.value == hook):
                return f"{idx.rel}:{n.lineno}"
        if depth >= 2:
            return None
        for n in ast.walk(fn):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                sub = self._function(idx, n.func.id)
                if sub is not None and sub[1] is not fn:
                    hit = self._consults(sub[0], sub[1], hook, depth + 1)
                    if hit:
                        return hit
        return None


# ------------------------------------------------------------------ entry point
def check_seams(contract: SeamContract, base: VendorSymbol, resolver: SourceResolver) -> list[SeamFact]:
    """Every fact of ``contract`` about the base runner ``base`` (a driver's
    ``model_runner_base`` symbol), read from ``resolver``'s sources.

    The chain decides which part applies: V1 when it contains
    ``contract.v1.marker`` (vLLM's V1 ``GPUModelRunner``), V2 when it contains
    ``contract.v2.marker``. Returns the facts (clean ones included); a base
    outside the sources gives one ``not-checked`` note."""
    try:
        chain = ClassChain(resolver, base.module, base.attr)
    except _Unverifiable as exc:
        return [SeamFact("?", base.qualname, "chain", base.qualname, "note", "not-checked", "in the sources", str(exc),
                         _declared(base))]
    except _Missing as exc:
        return [SeamFact("?", base.qualname, "chain", base.qualname, "drift", "missing-base", "exists", str(exc),
                         _declared(base), exc.where)]
    facts: list[SeamFact] = []
    parts: list[tuple[str, V1RunnerContract | V2RunnerContract]] = []
    if contract.v1 is not None and chain.has(*contract.v1.marker):
        parts.append(("v1", contract.v1))
    if contract.v2 is not None and chain.has(*contract.v2.marker):
        parts.append(("v2", contract.v2))
    if not parts:
        return [SeamFact("?", base.qualname, "chain", base.qualname, "note", "not-checked",
                         "a V1 or V2 vLLM runner in the chain",
                         " <- ".join(c.qualname for c in chain.classes)
                         + (f" (bases outside the sources: {', '.join(chain.external)})" if chain.external else ""),
                         _declared(base), chain.leaf.at())]
    for runner, part in parts:
        ck = _Checker(contract, resolver, runner, chain)
        ck.add("chain", "base runner chain", "clean", "ok", f"a {runner.upper()} runner",
               " <- ".join(c.qualname for c in chain.classes), _declared(base), chain.leaf.at())
        if isinstance(part, V1RunnerContract):
            for s in part.seams:
                ck.seam(s)
            ck.edges(part.edges)
        else:
            for s in part.runner_seams:
                ck.seam(s)
            ck.model_state(part)
        ck.model_calls(part.model_calls)
        ck.async_output(part.async_output)
        facts += ck.facts
    return facts


def check_worker_seams(contract: SeamContract, worker: VendorSymbol, resolver: SourceResolver) -> list[SeamFact]:
    """The contract's ``worker_edges`` (V1 part) on a driver's worker class chain: which
    worker methods reach the model runner's methods (``self.model_runner.<name>``), e.g.
    warm-up -> ``_dummy_run``. Facts with ``runner="worker"``."""
    edges = contract.v1.worker_edges if contract.v1 is not None else ()
    if not edges:
        return []
    try:
        chain = ClassChain(resolver, worker.module, worker.attr)
    except _Unverifiable as exc:
        return [SeamFact("worker", worker.qualname, "chain", worker.qualname, "note", "not-checked", "in the sources",
                         str(exc), _declared(worker))]
    except _Missing as exc:
        return [SeamFact("worker", worker.qualname, "chain", worker.qualname, "drift", "missing-base", "exists",
                         str(exc), _declared(worker), exc.where)]
    ck = _Checker(contract, resolver, "worker", chain)
    ck.add("chain", "worker chain", "clean", "ok", "a worker", " <- ".join(c.qualname for c in chain.classes),
           _declared(worker), chain.leaf.at())
    ck.edges(edges, via="model_runner")
    return ck.facts


__all__ = ["ENTRY_POINTS", "MODEL_CALL_FORMS", "SEAM_DRIFT_KINDS", "ClassChain", "SeamFact", "check_seams", "check_worker_seams"]
