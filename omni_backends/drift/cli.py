"""``omni-backends check-drift``: running the checks and rendering the report."""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import sys
from typing import Any

from omni_backends.binding import Patch, SeamContract
from omni_backends.drift.declarations import driver_declarations, runner_bases, undeclared_vendor_imports
from omni_backends.drift.model import Declared
from omni_backends.drift.installed import InstalledResolver
from omni_backends.drift.sources import SourceResolver, SourceTree
from omni_backends.drift.seams import SeamFact, check_seams, check_worker_seams
from omni_backends.drift.symbols import check_declarations, vendor_import_drift


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


#: entry-point group of seam contracts (``name = "module:ATTR"``, a :class:`~omni_backends.binding.SeamContract`).
CONTRACTS_GROUP = "omni_backends.seam_contracts"


def load_contracts(specs: list[str] | None = None) -> list[SeamContract]:
    """The seam contracts to check: ``specs`` (``"module:ATTR"``) when given,
    else every entry point of :data:`CONTRACTS_GROUP` (the core registers
    ``core.seams:CONTRACT``; ``omni_backends`` itself never imports ``core``).
    Raises ``OmniBackendError`` naming a spec that does not load."""
    from omni_backends.errors import OmniBackendError

    out: list[SeamContract] = []
    if specs:
        for spec in specs:
            module, _, attr = spec.partition(":")
            try:
                obj = getattr(importlib.import_module(module), attr or "CONTRACT")
            except (ImportError, AttributeError) as exc:
                raise OmniBackendError(f"--contract {spec!r} does not load ({type(exc).__name__}: {exc}); give "
                                       "MODULE:ATTR naming a SeamContract, e.g. core.seams:CONTRACT") from exc
            if not isinstance(obj, SeamContract):
                raise OmniBackendError(f"--contract {spec!r} is a {type(obj).__name__}, not a SeamContract")
            out.append(obj)
        return out
    for ep in importlib.metadata.entry_points(group=CONTRACTS_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin is a clear error, not a silent skip
            raise OmniBackendError(f"seam contract entry point {ep.name!r} ({ep.value}) failed to load: "
                                   f"{type(exc).__name__}: {exc}") from exc
        if isinstance(obj, SeamContract):
            out.append(obj)
    return out


def installed_sources(tops: set[str]) -> SourceResolver:
    """The installed packages ``tops`` as source trees (their directories, read with ``ast``)."""
    trees = []
    for top in sorted(tops):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):  # ValueError: loaded without a spec (e.g. the core's bare vllm_omni)
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else \
            list(getattr(sys.modules.get(top), "__path__", None) or [])
        if locations:
            trees.append(SourceTree(locations[0]))
    return SourceResolver(trees)


def check_driver_seams(driver_cls: type, contracts: list[SeamContract], resolver: SourceResolver) -> list[SeamFact]:
    """Every contract's facts about every base runner (and worker) the driver binds (:func:`runner_bases`)."""
    facts: list[SeamFact] = []
    for base in runner_bases(driver_cls):
        for contract in contracts:
            facts += check_seams(contract, base.symbol, resolver)
    for worker in runner_bases(driver_cls, "worker_base"):
        for contract in contracts:
            facts += check_worker_seams(contract, worker.symbol, resolver)
    return facts


def run_check(drivers: list[str] | None = None, sources: list[str] | None = None,
              contracts: list[SeamContract] | None = None) -> dict[str, Any]:
    """Check the named drivers (all installed drivers when ``None``) against
    ``sources`` (paths) or, when ``sources`` is empty, the installed stack:
    their bound symbols, and ``contracts`` (the seam contracts; ``None`` = the
    registered ones, ``[]`` = none) against each driver's base runners.
    Returns the JSON-able report (see :func:`render_text`)."""
    resolver: Any = SourceResolver([SourceTree(s) for s in sources]) if sources else InstalledResolver()
    classes = _drivers(drivers)
    declared = {n: driver_declarations(cls) for n, cls in classes.items()}
    reports = [check_declarations(n, decls, resolver) for n, decls in declared.items()]
    contracts = load_contracts() if contracts is None else contracts
    seam_resolver = None
    if contracts:
        seam_resolver = resolver if sources else installed_sources(
            {"vllm"} | {d.symbol.module.split(".")[0] for cls in classes.values()
                        for m in ("model_runner_base", "worker_base") for d in runner_bases(cls, m)}
            | {s.module.split(".")[0] for c in contracts for s in c.symbols})  # e.g. vllm_omni, where installed
    seams = {n: check_driver_seams(cls, contracts, seam_resolver) if contracts else [] for n, cls in classes.items()}
    # every vendor symbol a contract's code binds (the core's ``core.seams.SYMBOLS``), resolved like a driver's
    # (read from source, as the seams are: instance attributes and unbound signatures read as written)
    core_symbols = [check_declarations(c.name, [Declared(s.qualname, s, ()) for s in c.symbols], seam_resolver)
                    for c in contracts if c.symbols]
    patches = [check_patch(p, seam_resolver) for c in contracts for p in c.patches]
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
    out_drivers = []
    for r in reports:
        d = r.to_json()
        facts = seams[r.driver]
        d["seams"] = [f.to_json() for f in facts]
        d["seam_drift"] = sum(f.drift for f in facts)
        d["undeclared_imports"] = undeclared_vendor_imports(classes[r.driver])
        out_drivers.append(d)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "source" if sources else "installed",
        "against": resolver.describe(),
        "versions": versions,
        "contracts": [c.name for c in contracts],
        "drift": any(r.drift for r in reports) or any(f.drift for fs in seams.values() for f in fs)
                 or any(r.drift for r in core_symbols) or any(p["drift"] for p in patches),
        "drivers": out_drivers,
        "contract_symbols": [r.to_json() for r in core_symbols],
        "patches": patches,
    }


def check_patch(patch: Patch, resolver: Any) -> dict[str, Any]:
    """One patch of a live vendor object (:class:`~omni_backends.binding.Patch`) checked with ``resolver``:
    its declaration (name, module, what, why, versions, until) plus every check's status and the findings,
    each finding naming the patch."""
    report = check_declarations(patch.name, [Declared(s.qualname, s, (patch.module,)) for s in patch.checks], resolver)
    return {**patch.to_json(), "drift": len(report.drift), "checks": report.statuses, "checked": report.checked,
            "findings": [f.to_json() for f in report.findings]}


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
        lines += _render_seams(d.get("seams", []))
        for imp in d.get("undeclared_imports", []):
            lines.append(f"  [note: undeclared-import] {imp} -- NOT checked by check-drift: declare it as an "
                         "omni_backends.binding.VendorSymbol and call it through .resolve()")
    for d in report.get("contract_symbols", []):
        unchecked = d["symbols"] - d["checked"]
        status = "DRIFT" if d["drift"] else ("clean" if not unchecked else "no drift in the checked part")
        lines.append(f"\n{d['driver']} (the vendor symbols its code binds): {status} -- {d['checked']}/{d['symbols']} "
                     f"symbols checked, {d['drift']} drift" + (f"; {unchecked} NOT checked" if unchecked else ""))
        for f in d["findings"]:
            tag = f["kind"] if f["drift"] else f"note: {f['kind']}"
            lines.append(f"  [{tag}] {f['target']}: {f['message']}  declared at {f['declared_at']}")
    patches = report.get("patches", [])
    if patches:
        lines.append(f"\npatches of live vLLM objects ({len(patches)}; core/patches/, omni_backends/patches.py):")
    for p in patches:
        unchecked = len(p["checks"]) - p["checked"]
        status = "DRIFT" if p["drift"] else ("clean" if not unchecked else "no drift in the checked part")
        lines.append(f"  {p['patch']} ({p['module']}): {status} -- {p['checked']}/{len(p['checks'])} checks"
                     + (f", {p['drift']} drift" if p["drift"] else "") + f"; until: {p['until']}")
        for f in p["findings"]:
            tag = f["kind"] if f["drift"] else f"note: {f['kind']}"
            lines.append(f"    [{tag}] {f['target']}: {f['message']}" + (f"  vendor: {f['vendor_at']}" if f.get("vendor_at") else ""))
    for v in report.get("vendor_imports", []):
        broken = [f for f in v["findings"] if f["drift"]]
        lines.append(f"\nvendor {v['package']} ({v['source']}) imports vs {v['against']}: {len(broken)} broken "
                     f"import(s), {len(v['findings']) - len(broken)} guarded")
        for f in sorted(v["findings"], key=lambda f: (not f["drift"], f["declared_at"])):
            tag = f["kind"] if f["drift"] else f"note: {f['kind']}"
            lines.append(f"  [{tag}] {f['target']}: {f['message']}  at {f['declared_at']}")
    if "contracts" in report and not report["contracts"]:
        lines.append(f"\nseams: not checked (no seam contract: none registered under {CONTRACTS_GROUP}, or "
                     "--no-seams; the core registers core.seams:CONTRACT)")
    lines.append("")
    lines.append("result: " + ("DRIFT (exit 1)" if report["drift"] else "no drift"))
    return "\n".join(lines)


def _render_seams(facts: list[dict[str, Any]]) -> list[str]:
    """Per base runner: counts by status, then every fact that is not clean (covered model calls included)."""
    lines: list[str] = []
    by_base: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in facts:
        by_base.setdefault((f["base"], f["runner"]), []).append(f)
    for (base, runner), fs in by_base.items():
        counts = {st: sum(f["status"] == st for f in fs) for st in ("clean", "covered", "drift", "note")}
        lines.append(f"  seams of {base} ({runner}): " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
        for f in fs:
            if f["status"] == "clean":
                continue
            tag = f["kind"] if f["status"] == "drift" else f"{f['status']}" if f["status"] == "covered" else f"note: {f['kind']}"
            lines.append(f"    [{tag}] {f['fact']} {f['seam']}: expected {f['expected']}; found {f['found']}")
            lines.append(f"        ours: {f['ours'] or '-'}; vendor: {f['vendor'] or '-'}")
    return lines


def _cmd_check_drift(args: argparse.Namespace) -> int:
    contracts = [] if args.no_seams else load_contracts(args.contract)
    report = run_check(args.driver, args.source or None, contracts)
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
        help="check the vendor symbols the drivers bind and the core's seams in their base runners",
        description="Resolve every VendorSymbol declared by the drivers (omni_backends/<driver>/*.py and the shared "
        "modules they use, e.g. omni_backends/vllm_upstream.py) against the installed vendor stack (import + inspect) "
        "or against source trees / wheels / sdists (AST, nothing imported). Reports missing modules and symbols, "
        "removed or renamed parameters, newly required parameters and changed defaults, each with the driver's "
        "file:line. Then resolves the core's seam contract (entry points omni_backends.seam_contracts) against the "
        "base runner chain each driver binds: seams and their parameters, call edges, model calls outside the "
        "covered seams, the async output type and how executors recognise it, V2 model-state facts; each finding "
        "with file:line on both sides. Exit status: 0 no drift, 1 drift.",
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
    p.add_argument("--contract", action="append", metavar="MODULE:ATTR",
                   help="seam contract to check against each driver's base runners (repeatable); default: every "
                   f"entry point of {CONTRACTS_GROUP} (the core's core.seams:CONTRACT)")
    p.add_argument("--no-seams", action="store_true", help="check the bound symbols only, no seam contract")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON: every checked symbol and seam fact with its status, clean ones too")
    p.set_defaults(func=_cmd_check_drift_defaults)


def _cmd_check_drift_defaults(args: argparse.Namespace) -> int:
    if args.vendor_package is None:
        args.vendor_package = ["vllm_ascend"]
    return _cmd_check_drift(args)
