"""Seam facts about the runner's own methods: signatures, call edges, model calls.

- ``seam``: every method the core overrides exists in the chain with the
  parameters it assumes (kinds from :func:`~omni_backends.drift.symbols.compare_signature`,
  plus ``missing-seam``);
- ``call-edge``: ``caller`` reaches ``callee`` (``self.x``, ``super().x``,
  ``Base.x(self``; through other methods of the chain, a few levels deep);
  ``missing-call-edge`` when a relied-on edge is gone;
- ``model-call``: every ``self.model(`` / ``partial(self.model`` / ``model(`` /
  ``<…model…>.forward(`` in a method the chain dispatches to, ``covered`` or
  ``uncovered-model-call`` per the contract's coverage, with the entry points
  (:data:`~omni_backends.drift.seam_facts.ENTRY_POINTS`) that reach it.
"""

from __future__ import annotations

import ast

from omni_backends.binding import ModelCallCoverage, Seam, VendorSymbol
from omni_backends.drift.chain import MAX_DEPTH, ClassChain, Method
from omni_backends.drift.seam_facts import ENTRY_POINTS, SeamCheck, declared_at, ours_line
from omni_backends.drift.sources import ast_params, dotted_name
from omni_backends.drift.symbols import compare_signature


def _model_call_form(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "model" and isinstance(f.value, ast.Name) and f.value.id == "self":
        return "self.model("
    if isinstance(f, ast.Name) and f.id == "model":
        return "model("
    if (dotted_name(f) or "").rpartition(".")[2] == "partial" and call.args:
        a = call.args[0]
        if isinstance(a, ast.Attribute) and a.attr == "model" and isinstance(a.value, ast.Name) and a.value.id == "self":
            return "partial(self.model"
    if isinstance(f, ast.Attribute) and f.attr == "forward":
        recv = dotted_name(f.value) or ""
        if "model" in recv.rpartition(".")[2].lower():
            return ".forward("
    return None


class RunnerSeamCheck(SeamCheck):
    """The ``seam``, ``call-edge`` and ``model-call`` facts of one runner (or worker) chain."""

    def seam(self, s: Seam, chain: ClassChain | None = None, fact: str = "seam") -> Method | None:
        """Seam ``s`` exists in ``chain`` (default ``self.chain``) with the parameters it assumes;
        returns the method that Python would dispatch to, or None (a ``missing-seam`` fact)."""
        chain = chain or self.chain
        ours = ours_line(self.contract, s.ours) or declared_at(s)
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
        params = ast_params(m.node, drop_first=True)
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

    def edges(self, edges: tuple, via: str | None = None) -> None:
        """Each :class:`~omni_backends.binding.CallEdge` holds: its caller reaches its callee (``via``:
        an attribute the callee is reached through, e.g. ``self.model_runner.<callee>`` on a worker)."""
        for e in edges:
            ours = declared_at(e)
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
                         f"{caller.label} does not reach {e.callee} (within {MAX_DEPTH} calls)", ours, caller.at())
            else:
                path, at = got
                self.add("call-edge", seam, "clean", "ok", f"{e.caller} reaches {e.callee}", " -> ".join(path), ours, at)

    def model_calls(self, cov: ModelCallCoverage) -> None:
        """Every model call in a method the chain dispatches to, covered by ``cov`` or drift."""
        ours = ours_line(self.contract, cov.ours) or declared_at(cov)
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

    def _reaches(self, entry: str, m: Method) -> bool:
        return self.chain.reach(entry, m.name) is not None


__all__ = ["RunnerSeamCheck"]
