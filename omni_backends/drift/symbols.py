"""Comparing declarations with vendor signatures; a vendor's own imports vs its upstream."""

from __future__ import annotations

import ast
from typing import Any, Iterable

from omni_backends.binding import VendorSymbol
from omni_backends.drift.model import VAR_KINDS, DRIFT_KINDS, Declared, DriverReport, Finding, Param, rel_defined_at
from omni_backends.drift.sources import SourceResolver, SourceTree, Missing, Unverifiable


def compare_signature(sym: VendorSymbol, params: list[Param]) -> list[tuple[str, str]]:
    """(kind, message) for every mismatch between a declaration and a vendor signature."""
    problems: list[tuple[str, str]] = []
    by_name = {p.name: p for p in params if p.kind not in VAR_KINDS}
    order = [p.name for p in params if p.kind not in VAR_KINDS]
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


def _source_facts(sym: VendorSymbol, resolver: Any, names: tuple[str, ...], present: bool,
                  where: str | None) -> list[tuple[str, str, str | None]]:
    """What the vendor source of ``sym`` says about ``names``: each must be in it (``present``: the
    symbol's ``mentions``, a behaviour relied on) or must not (its ``absent``, a layout relied on)."""
    text = resolver.source_text(sym)
    if text is None:
        return [("unverifiable", f"cannot read the source of {sym.qualname} to check it "
                                 f"{'mentions' if present else 'has no'} {', '.join(names)}", where)]
    wrong = [n for n in names if (n in text) != present]
    if not wrong:
        return []
    if present:
        return [("missing-behaviour", f"{sym.qualname} no longer mentions {', '.join(wrong)}: the behaviour the "
                                      "binding relies on is gone", where)]
    return [("changed-layout", f"{sym.qualname} now has {', '.join(wrong)}: the layout the binding relies on "
                               "changed", where)]


def _check_symbol(sym: VendorSymbol, resolver: Any) -> tuple[bool, str | None, list[tuple[str, str, str | None]]]:
    """(checked, vendor file:line, [(kind, message, vendor_at)]) for one spelling of a declaration."""
    try:
        where, params, _what = resolver.resolve(sym)
    except Missing as exc:
        return True, None, [(exc.kind, str(exc), exc.where)]
    except Unverifiable as exc:
        kind = "not-checked" if "not in the given sources" in str(exc) or "not installed" in str(exc) else "unverifiable"
        return False, None, [(kind, str(exc), None)]
    out: list[tuple[str, str, str | None]] = []
    if params is not None:
        out += [(kind, message, where) for kind, message in compare_signature(sym, params)]
    for names, present in ((sym.absent, False), (sym.mentions, True)):
        if names:
            out += _source_facts(sym, resolver, names, present, where)
    return True, where, out


def check_declarations(driver: str, declared: Iterable[Declared], resolver: Any) -> DriverReport:
    """Resolve every declaration with ``resolver`` (:class:`InstalledResolver` / :class:`SourceResolver`).

    A declaration with ``alternatives`` passes when one spelling resolves
    without drift (first its own, then the alternatives in order); a note
    (``alternative``) says which one. Otherwise its own spelling's findings
    are reported, naming the alternatives tried.

    The report's ``statuses`` lists every declaration with its status
    (``clean``, ``drift``, ``not-checked``, ``unverifiable``, ``note``) and
    the vendor ``file:line`` where it was found, so two reports can be diffed."""
    findings: list[Finding] = []
    statuses: list[dict[str, Any]] = []
    checked = 0
    declared = list(declared)
    for d in declared:
        first = len(findings)

        def add(kind: str, message: str, vendor_at: str | None = None, d: Declared = d) -> None:
            findings.append(
                Finding(driver, d.name, d.symbol.qualname, kind, message, rel_defined_at(d.symbol.defined_at),
                        list(d.used_at), vendor_at)
            )

        main_checked, main_where, main = _check_symbol(d.symbol, resolver)
        sym, was_checked, where, out = d.symbol, main_checked, main_where, main
        if any(kind in DRIFT_KINDS for kind, _, _ in main):
            for alt in d.symbol.alternatives:
                alt_checked, alt_where, alt_out = _check_symbol(alt, resolver)
                if alt_checked and not any(kind in DRIFT_KINDS for kind, _, _ in alt_out):
                    sym, was_checked, where, out = alt, alt_checked, alt_where, alt_out
                    break
        checked += int(was_checked)
        if sym is not d.symbol:
            add("alternative", f"{d.symbol.qualname} is absent here; the seam resolves as {sym.qualname} "
                               f"(declared alternative)", where)
        for kind, message, at in out:
            if sym is d.symbol and d.symbol.alternatives and kind in DRIFT_KINDS:
                message += f" (alternatives tried: {', '.join(a.qualname for a in d.symbol.alternatives)})"
            add(kind, message, at)
        mine = findings[first:]
        status = ("drift" if any(f.drift for f in mine) else mine[0].kind if mine and len(mine) == 1
                  and mine[0].kind in ("not-checked", "unverifiable") else "note" if mine else "clean")
        statuses.append({"symbol": d.name, "target": sym.qualname, "status": status,
                         "kinds": [f.kind for f in mine], "declared_at": rel_defined_at(d.symbol.defined_at),
                         "vendor_at": where or next((f.vendor_at for f in mine if f.vendor_at), None)})
    return DriverReport(driver, len(declared), checked, findings, statuses)


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
                except Missing as exc:
                    add(exc.kind, f"{node.module}.{a.name}", str(exc))
                except Unverifiable:
                    pass
    return out
