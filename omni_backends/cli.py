"""``omni-backends``: the command-line tool.

Built-in commands live here (``devices``); more commands are entry points in
the group ``omni_backends.commands`` (each a callable taking argparse's
sub-parsers object and adding one command with ``set_defaults(func=...)``),
loaded through stevedore. That keeps imports one way: the omni runner's
commands (``run``, ``demo-model``) live in ``core`` and register here.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from omni_backends.errors import OmniBackendError

COMMANDS_NAMESPACE = "omni_backends.commands"

DESCRIPTION = """\
omni-backends: one hardware backend layer for omni-modality model runners on vLLM.

A driver (cuda, npu/ascend, xpu, cpu, or a vendor's out-of-tree driver)
supplies what differs per device; one device-neutral omni runner does the rest.
Device selection: --device NAME > OMNI_BACKENDS_DEVICE > auto-detect (the
highest-priority usable driver; cpu is the embedded default).
"""


def _fmt_versions(versions: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" if v else f"{k} -" for k, v in versions.items()) or "-"


def render_devices_text(report: dict[str, Any]) -> str:
    lines = [f"omni-backends drivers (Backend interface v{report['interface_version']}):", ""]
    for d in report["drivers"]:
        probe = d.get("probe") or {}
        state = probe.get("state", "not loaded") if not d.get("problem") else "error"
        lines.append(f"  {d['name']:<6} {state:<14} priority {d['priority'] if d['priority'] is not None else '-'}"
                     f"   from {d['distribution']}")
        if d.get("problem"):
            lines.append(f"         problem:  {d['problem']}")
        if probe:
            lines.append(f"         reason:   {probe.get('reason')}")
            if probe.get("fix"):
                lines.append(f"         fix:      {probe['fix']}")
            if probe.get("error"):
                lines.append(f"         error:    {probe['error']}")
            lines.append(f"         versions: {_fmt_versions(probe.get('versions', {}))}")
        if d.get("verification"):
            lines.append(f"         verified: {', '.join(d['verification'])}")
        ident = d.get("identity")
        if ident:
            aliases = f" (alias {', '.join(ident['aliases'])})" if ident["aliases"] else ""
            lines.append(f"         identity: device_type={ident['device_type']}{aliases} dist={ident['dist_backend']} "
                         f"visible={ident['visible_devices_env'] or '-'}")
    for n in report.get("notes", []):
        lines.append(f"  note: {n}")
    sel = report["selection"]
    lines.append("")
    if sel.get("selected"):
        lines.append(f"would select: {sel['selected']}  (rule: {sel['rule']})")
        lines.append(f"  why: {sel['reason']}")
        for n in sel.get("notes", []):
            lines.append(f"  note: {n}")
    else:
        lines.append(f"would select: nothing -- {sel.get('error')}")
    return "\n".join(lines)


def _cmd_devices(args: argparse.Namespace) -> int:
    from omni_backends.registry import devices_report

    report = devices_report(args.device)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_devices_text(report))
    return 0


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """The shared ``--device`` option (``auto`` or a driver name / alias)."""
    parser.add_argument(
        "--device",
        default=None,
        metavar="NAME",
        help="driver to use: auto (default), cpu, cuda, npu (alias ascend), xpu, or an installed "
        "out-of-tree driver; overrides OMNI_BACKENDS_DEVICE",
    )


def _load_plugin_commands(sub: Any) -> list[str]:
    """Add commands registered under ``omni_backends.commands``; returns load errors."""
    from stevedore import ExtensionManager

    errors: list[str] = []

    def on_failure(_mgr: Any, ep: Any, exc: BaseException) -> None:
        errors.append(f"command {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}")

    try:
        mgr = ExtensionManager(COMMANDS_NAMESPACE, invoke_on_load=False, on_load_failure_callback=on_failure)
        for ext in sorted(mgr.extensions, key=lambda e: e.name):
            ext.plugin(sub)
    except Exception as exc:  # a broken command plugin must not take down `devices`
        errors.append(f"command plugins could not be loaded: {type(exc).__name__}: {exc}")
    return errors


def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(
        prog="omni-backends", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "devices",
        help="list installed drivers, their probe state, and which would be selected",
        description="Probe every installed driver (cheap: no vendor stack is imported) and show its state "
        "(not-installed / installed / importable / usable), reason, versions, priority, how this project "
        "verifies it, and which driver would be selected and why.",
    )
    add_device_argument(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_devices)
    errors = _load_plugin_commands(sub)
    return parser, errors


def main(argv: Sequence[str] | None = None) -> int:
    parser, load_errors = build_parser()
    args = parser.parse_args(argv)
    for e in load_errors:
        print(f"omni-backends: warning: {e}", file=sys.stderr)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except OmniBackendError as exc:
        print(f"omni-backends: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("omni-backends: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
