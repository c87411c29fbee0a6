"""``omni-backends check-drift``: running the checks and rendering the report."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
from typing import Any

from omni_backends.drift.declarations import driver_declarations
from omni_backends.drift.installed import InstalledResolver
from omni_backends.drift.sources import SourceResolver, SourceTree
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
