"""Seam facts about vLLM's V2 model state (``model-state``): the runner builds the model's state, and calls it.

- the runner builds its state with ``init_model_state``; where the contract
  relies on the model's hook, it consults ``get_model_state_cls``
  (``model-state-not-consulted``) and no vendor reassigns it at module level
  (``model-state-replaced``); where it does not (``state_hook=None``: the
  core composes the omni state with whatever state was built), both are notes;
- each state method the omni state overrides has the parameters it assumes
  and is called by the runner (``state-override-never-called``; a note where
  the core falls back to doing its work elsewhere);
- every abstract method of the state interface is implemented
  (``abstract-not-implemented``).
"""

from __future__ import annotations

import ast
import collections
import os

from omni_backends.binding import V2RunnerContract
from omni_backends.drift.chain import ClassChain
from omni_backends.drift.seam_calls import RunnerSeamCheck
from omni_backends.drift.seam_facts import declared_at, ours_line
from omni_backends.drift.sources import dotted_name, Missing, ModuleIndex, Unverifiable


class ModelStateCheck(RunnerSeamCheck):
    """The ``model-state`` facts of one V2 runner chain (state seams are checked like runner seams)."""

    def model_state(self, v2: V2RunnerContract) -> None:
        """Every ``model-state`` fact of the V2 contract ``v2`` about ``self.chain`` (see the module docstring)."""
        self._init_consults(v2)
        self._vendor_replacements(v2)
        state_chain = self._state_seams(v2)
        if state_chain is not None:
            self._abstract_state_methods(v2, state_chain)

    def _init_consults(self, v2: V2RunnerContract) -> None:
        """Where the runner builds its state: ``init_model_state`` consults ``get_model_state_cls``."""
        ours_init = declared_at(v2)
        calls = [(m, n) for m in self.chain.live_methods() for n in ast.walk(m.node)
                 if isinstance(n, ast.Call) and (dotted_name(n.func) or "").rpartition(".")[2] == v2.init_function]
        if not calls:
            self.add("model-state", v2.init_function, "drift", "model-state-not-consulted",
                     f"the runner builds its model state with {v2.init_function}(), consulting {v2.state_hook}",
                     f"no method of {self.chain.leaf.qualname}'s chain calls {v2.init_function}", ours_init,
                     self.chain.leaf.at())
        if v2.state_hook is None:  # the omni state is composed with whatever the runner built
            for m, call in calls[:1]:
                self.add("model-state", f"runner builds its state with {v2.init_function}", "clean", "ok",
                         f"the runner builds its model state with {v2.init_function}() (the omni state is composed "
                         "with it after load_model)", f"{m.label} calls {v2.init_function}", ours_init, m.at(call))
            return
        for m, call in calls[:1]:
            fn = self._function(m.owner.idx, dotted_name(call.func) or v2.init_function)
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

    def _vendor_replacements(self, v2: V2RunnerContract) -> None:
        """A vendor package reassigning ``<module>.init_model_state`` at module level (vllm-ascend's patch)."""
        ours_init = declared_at(v2)
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
                        repl = self._function(self.resolver.index(module), dotted_name(n.value) or "") \
                            if self.resolver.index(module) is not None else None
                        if v2.state_hook is None:
                            self.add("model-state", f"{target} replaced", "note", "state-replaced-composed",
                                     "the omni state composes with the state the runner builds",
                                     f"{top} replaces {target} with {ast.unparse(n.value)}: its state is the base the "
                                     "omni hooks compose with", ours_init, f"{rel}:{n.lineno}")
                            continue
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

    def _state_seams(self, v2: V2RunnerContract) -> ClassChain | None:
        """Each state seam: its signature against the state base, and a runner call of it. Returns
        the state base's chain (None, with a ``missing-base`` fact, if it is not in the sources)."""
        try:
            state_chain = ClassChain(self.resolver, v2.state_base.module, v2.state_base.attr)
        except (Missing, Unverifiable) as exc:
            self.add("model-state", v2.state_base.qualname, "drift", "missing-base", f"{v2.state_base.qualname} exists",
                     str(exc), declared_at(v2.state_base))
            return None
        called = self._state_calls()
        for s in v2.state_seams:
            first = len(self.facts)
            self.seam(s, state_chain, fact="model-state")
            sites = [site for n in (s.name, *s.alternatives) for site in called.get(n, [])]
            ours = ours_line(self.contract, s.ours) or declared_at(s)
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
                where = ours_line(self.contract, s.fallback)
                for f in self.facts[first:]:
                    if f.status == "drift" and f.kind in ("missing-seam", "state-override-never-called"):
                        f.status, f.kind = "note", f"{f.kind}-fallback"
                        f.found += f"; the core falls back to {s.fallback.partition(':')[2]} ({where})"
        return state_chain

    def _abstract_state_methods(self, v2: V2RunnerContract, state_chain: ClassChain) -> None:
        """Every abstract method of the state interface is implemented by the state base or the omni state."""
        try:
            iface = ClassChain(self.resolver, v2.state_interface.module, v2.state_interface.attr)
        except (Missing, Unverifiable) as exc:
            self.add("model-state", v2.state_interface.qualname, "note", "missing-base", "exists", str(exc))
            return
        abstract = iface.abstract_methods()
        overridden = {n for s in v2.state_seams for n in (s.name, *s.alternatives)}
        for name, at in sorted(abstract.items()):
            impl = state_chain.method(name)
            concrete = impl is not None and impl.owner.node is not iface.leaf.node and not any(
                (dotted_name(d) or "").endswith("abstractmethod") for d in impl.node.decorator_list)
            if name in overridden or concrete:
                self.add("model-state", f"abstract {name}", "clean", "ok", f"{name} implemented",
                         "by the omni state" if name in overridden else f"by {impl.label} ({impl.at()})",
                         declared_at(v2), at)
            else:
                self.add("model-state", f"abstract {name}", "drift", "abstract-not-implemented", f"{name} implemented",
                         f"abstract in {iface.leaf.qualname}; neither {v2.state_base.attr} nor the omni state "
                         "implements it", declared_at(v2), at)

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
                        recv = dotted_name(n.func.value) or ""
                        if recv.rpartition(".")[2] == "model_state":
                            site = f"{rel}:{n.lineno}"
                            if site not in out[n.func.attr]:
                                out[n.func.attr].append(site)
        return out

    def _function(self, idx: ModuleIndex | None, dotted: str) -> tuple[ModuleIndex, ast.FunctionDef] | None:
        if idx is None or not dotted:
            return None
        try:
            head, *rest = dotted.split(".")
            m, d = self.resolver.lookup(idx.module, head)
            for r in rest:
                if d.kind != "module":
                    return None
                m, d = self.resolver.lookup(d.module, r)
        except (Missing, Unverifiable):
            return None
        return (m, d.node) if d.kind == "def" else None

    def _consults(self, idx: ModuleIndex, fn: ast.FunctionDef, hook: str, depth: int = 0) -> str | None:
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


__all__ = ["ModelStateCheck"]
