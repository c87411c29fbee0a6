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
import os
import sys
import textwrap
import traceback
from typing import Any, NoReturn, Sequence

from omni_backends.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    BadInputError,
    DriverLoadError,
    OmniBackendError,
    StageFailedError,
    UnknownDeviceError,
    VendorImportError,
)

COMMANDS_NAMESPACE = "omni_backends.commands"

#: the exit statuses (``omni_backends.errors.EXIT_*``) in words
EXIT_STATUS_HELP = """\
exit status: 0 success; 1 this environment cannot do it (device not usable,
no usable driver, a driver or vendor package fails to import, the system
refused: a full disk, no permission) or an unexpected error; 2 usage error
(bad option or value, argv not valid UTF-8, unknown device name, bad input
files); 3 a run failed after its engines started (nothing written); 130
interrupted. A failure is one 'omni-backends: error:' line; set
OMNI_BACKENDS_TRACEBACK=1 for the original traceback above it.
"""

#: set to ``1``: every command prints the original traceback above its ``omni-backends: error:`` line
TRACEBACK_ENV = "OMNI_BACKENDS_TRACEBACK"


def exit_status(exc: BaseException) -> int:
    """The exit status (see :data:`EXIT_STATUS_HELP`) for an error a command raised."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, StageFailedError):
        return EXIT_RUN_FAILED
    if isinstance(exc, (UnknownDeviceError, BadInputError)) and not isinstance(exc, VendorImportError):
        return EXIT_USAGE
    return EXIT_UNAVAILABLE  # the environment, the operating system (a full disk), or an unexpected error


#: errnos of a file system that has no room left: what to do about it
_NO_ROOM = {"ENOSPC", "EDQUOT", "EFBIG"}


def error_message(exc: BaseException) -> str:
    """The text of the one ``omni-backends: error:`` line for ``exc``: an
    :class:`~omni_backends.errors.OmniBackendError`'s own message; an ``OSError`` as what the system refused
    and on which file (with what to do when a disk is full); anything else as unexpected, with its type,
    pointing at :data:`TRACEBACK_ENV`."""
    if isinstance(exc, OmniBackendError):
        return str(exc)
    if isinstance(exc, OSError):
        import errno

        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        what = exc.strerror or str(exc) or type(exc).__name__
        hint = ("; the file system has no room for it (full, over quota, or a file-size limit): free space or "
                "write elsewhere (--out)" if errno.errorcode.get(exc.errno or 0) in _NO_ROOM else "")
        return f"the operating system refused: {what}{where}{hint}"
    if isinstance(exc, MemoryError):
        return "out of memory in this process (MemoryError); free memory or use a smaller model"
    return (f"unexpected {type(exc).__name__}: {exc}. This is a bug: set {TRACEBACK_ENV}=1 for the traceback "
            "and report it")


class CommandParser(argparse.ArgumentParser):
    """argparse with this tool's error format: ``omni-backends: error: ...`` and status 2."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"omni-backends: error: {message} (see `{self.prog} --help`)\n")

DESCRIPTION = """\
omni-backends: one hardware backend layer for omni-modality model runners on vLLM.

A driver (cuda, npu alias ascend, xpu, cpu, or a vendor's out-of-tree driver
registered under the entry-point group omni_backends.drivers) supplies what
differs per device; one device-neutral omni runner does the rest.

Device selection, first match wins:
  1. --device NAME          (a driver name or alias, any case; 'auto' or '' = rule 3)
  2. OMNI_BACKENDS_DEVICE   (same values; empty = unset)
  3. auto-detect            the highest-priority *usable* driver; equal
                            priorities break by name; cpu is the default
An explicit choice that cannot run here is an error that says why and what to
do; it never falls back silently. Start with `omni-backends devices`.
"""

DEVICES_DESCRIPTION = """\
Probe every installed driver and show, per driver: its probe state, the
reason and the fix, the vendor versions found, its priority, identity
(torch device type, distributed backend, visible-devices variable), its
capability flags (when the driver can be constructed cheaply), how this
project verifies it, and which driver would be selected, by which rule, and
why the others were skipped.

Probing is cheap: no vendor stack (vllm, torch_npu, IPEX) and not even torch
is imported, and no driver is bound.

probe states, in order:
  not-installed  a required vendor package is absent
  installed      packages present, but importing them fails
  importable     imports work, but no device is visible or versions mismatch
  usable         this driver can run here
"""

DEVICES_EPILOG = """\
exit status: 0 if a driver would be selected; 1 if none would, or the one
named cannot run here (the report says why); 2 on a usage error (an unknown
device name included).

examples:
  omni-backends devices                  what is installed, what auto-detect picks
  omni-backends devices --device ascend  would the Ascend (npu) driver run here?
  OMNI_BACKENDS_DEVICE=cpu omni-backends devices --json
"""


def _fmt_versions(versions: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" if v else f"{k} (absent)" for k, v in versions.items()) or "-"


def _fmt_flag(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return "+".join(str(v) for v in value) or "none"
    return str(value)


def _wrapped(label: str, text: str, indent: int = 4, width: int = 100) -> list[str]:
    """``label`` then ``text`` wrapped, continuation lines aligned under the text."""
    head = " " * indent + f"{label:<13} "
    return textwrap.wrap(text, width=width, initial_indent=head, subsequent_indent=" " * len(head),
                         break_on_hyphens=False) or [head.rstrip()]


def _verified_by(d: dict[str, Any]) -> str:
    levels = ", ".join(d.get("verification") or []) or "-"
    return f"{levels} (declared by vendor)" if d.get("verification_declared_by") else levels


def _state(d: dict[str, Any]) -> str:
    if d.get("problem"):
        return "error"
    return (d.get("probe") or {}).get("state", "not loaded")


def render_devices_text(report: dict[str, Any]) -> str:
    """The ``devices`` report (see :func:`omni_backends.registry.devices_report`) as text."""
    sel = report["selection"]
    selected = sel.get("selected")
    drivers = report["drivers"]
    rows = [("DRIVER", "STATE", "PRIORITY", "DISTRIBUTION", "VERIFIED BY")]
    for d in drivers:
        rows.append((
            d["name"] + (" *" if d["name"] == selected else ""),
            _state(d),
            "-" if d["priority"] is None else str(d["priority"]),
            d["distribution"] or "?",
            _verified_by(d),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [f"omni-backends drivers (Backend interface v{report['interface_version']}); * = would be selected", ""]
    lines += ["  " + "  ".join(f"{cell:<{w}}" for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    from omni_backends.backend import Verification

    lines += ["", *_wrapped("verified by", "; ".join(f"{v.value}: {v.meaning}" for v in Verification)
                            + " (the README's driver table: what ran where). omni-backends' own drivers: what "
                            "this project's CI backs; 'declared by vendor': an out-of-tree driver's own claim, "
                            "not checked by this project", indent=2)]
    for d in drivers:
        probe = d.get("probe") or {}
        lines += ["", f"  {d['name']}"]
        if d.get("problem"):
            lines += _wrapped("problem", d["problem"])
        if probe:
            lines += _wrapped("reason", str(probe.get("reason")))
            if probe.get("fix"):
                lines += _wrapped("fix", probe["fix"])
            if probe.get("error"):
                lines += _wrapped("error", probe["error"].strip().splitlines()[-1])
        for failure in d.get("vendor_import_errors") or ():
            how = " (via torch's backend autoload)" if failure.get("autoload") else ""
            where = (f"{failure['distribution']} {failure.get('version')}" if failure.get("distribution")
                     else f"{failure.get('path') or '?'}, no distribution metadata")
            lines += _wrapped("vendor error", f"{failure.get('package')} ({where}){how}: importable: no — "
                                              f"{failure.get('error')}")
            if failure.get("repair"):
                drop = (f"pip uninstall {failure['distribution']}" if failure.get("distribution")
                        else f"remove it from sys.path")
                lines += _wrapped("vendor fix", f"{failure['repair']}; or, if this machine does not use it, {drop}")
        if d.get("vendor_import_errors"):
            lines += _wrapped("versions", _fmt_versions(probe.get("versions", {})))
        ident = d.get("identity")
        if ident:
            aliases = ", ".join(ident["aliases"]) or "-"
            lines += _wrapped(
                "identity",
                f"torch device {ident['device_type']}; dist backend {ident['dist_backend']}; visible-devices "
                f"variable {ident['visible_devices_env'] or '-'}; aliases {aliases}",
            )
            if ident.get("vendor_requirements"):
                lines += _wrapped("supports", "; ".join(f"{dist}{spec}" for dist, spec in
                                                        ident["vendor_requirements"].items()))
        caps = d.get("capabilities")
        if caps:
            lines += _wrapped("capabilities", "; ".join(f"{k} {_fmt_flag(v)}" for k, v in caps.items()))
        elif d.get("capabilities_skipped"):
            lines += _wrapped("capabilities", f"not shown: {d['capabilities_skipped']}")
    if report.get("notes"):
        lines += ["", "  discovery notes:"]
        for n in report["notes"]:
            lines += _wrapped("-", n, indent=4, width=100)
    lines.append("")
    if selected:
        lines.append(f"would select: {selected}  (rule: {sel['rule']})")
        lines += _wrapped("why", sel["reason"], indent=2)
        for n in sel.get("notes", []):
            lines += _wrapped("note", n, indent=2)
    else:
        lines.append("would select: nothing")
        lines += _wrapped("error", str(sel.get("error")), indent=2)
        if sel.get("traceback"):
            lines += ["  original traceback:"] + ["    " + t for t in sel["traceback"].rstrip().splitlines()]
    return "\n".join(lines)


def _stdout_gone() -> None:
    """Point stdout at /dev/null: its reader went away (``| head``); what is left to print goes nowhere and
    the interpreter's final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def print_result(text: str) -> None:
    """Print a command's result on stdout. A reader that stops reading (``| head -c 100``) is not a
    failure: the rest is dropped, the command goes on and exits with its own status."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _stdout_gone()


def _cmd_devices(args: argparse.Namespace) -> int:
    from omni_backends.registry import devices_report

    report = devices_report(args.device)
    print_result(json.dumps(report, indent=2) if args.json else render_devices_text(report))
    sel = report["selection"]
    if sel.get("selected"):
        return EXIT_OK
    if sel.get("error"):  # the report says it on stdout; stderr gets the one error line every command gives
        message = str(sel["error"]).removeprefix(f"{sel.get('error_type')}: ")
        print(f"omni-backends: error: {message.splitlines()[0] if message else sel['error']}", file=sys.stderr)
    import omni_backends.errors as errors

    cls = getattr(errors, str(sel.get("error_type")), None)
    return exit_status(cls("")) if isinstance(cls, type) and issubclass(cls, OmniBackendError) else EXIT_UNAVAILABLE


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """The shared ``--device`` option (``auto`` or a driver name / alias)."""
    parser.add_argument(
        "--device",
        default=None,
        metavar="NAME",
        help="driver to use: auto (default), cpu, cuda, npu (alias ascend), xpu, or an installed "
        "out-of-tree driver; overrides OMNI_BACKENDS_DEVICE. An empty value means auto",
    )


def _load_plugin_commands(sub: Any) -> list[str]:
    """Add commands registered under ``omni_backends.commands``; returns warnings.

    Loaded like the drivers (:func:`omni_backends.registry.load_declared`): the installed metadata is the
    source of truth, so a stale or corrupt stevedore cache, or a stale ``.egg-info`` first on ``sys.path``,
    never hides an installed command (a warning says what was bypassed and what to delete). A plugin that
    fails to import or to add itself is a warning and never hides the others.
    """
    from omni_backends.registry import load_declared

    plugins, failures, notes = load_declared(COMMANDS_NAMESPACE)
    errors = list(notes)
    errors += [f"command {name!r} failed to load: {type(exc).__name__}: {exc}" for name, (exc, _) in sorted(failures.items())]
    for name in sorted(plugins):
        try:
            plugins[name](sub)
        except Exception as exc:  # one broken plugin must not hide the others (or a clash with a built-in)
            errors.append(f"command {name!r} failed to add itself: {type(exc).__name__}: {exc}")
    return errors


#: commands defined here; running one of them loads no command plugin.
BUILTIN_COMMANDS = ("devices",)


def build_parser(plugins: bool = True) -> tuple[argparse.ArgumentParser, list[str]]:
    """The argument parser and the command-plugin load errors.

    With ``plugins`` the commands registered under ``omni_backends.commands``
    are added too (imports their modules); without, only the built-in ones.
    """
    parser = CommandParser(
        prog="omni-backends", description=DESCRIPTION, epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "devices",
        help="list installed drivers, their probe state, and which would be selected and why",
        description=DEVICES_DESCRIPTION,
        epilog=DEVICES_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_device_argument(p)
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON (keys: interface_version, notes, drivers[], selection)")
    p.set_defaults(func=_cmd_devices)
    errors = _load_plugin_commands(sub) if plugins else []
    return parser, errors


def argv_not_utf8(argv: Sequence[str]) -> str | None:
    """The usage error for the first argument that is not valid UTF-8 (Python hands such bytes over as lone
    surrogates), naming its option, or None."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raw = os.fsencode(arg)
            bad = arg[exc.start].encode("utf-8", "surrogateescape") if 0xDC80 <= ord(arg[exc.start]) <= 0xDCFF else b""
            byte = f"byte 0x{bad.hex()}" if bad else f"character {arg[exc.start]!r}"
            pos = exc.start
            if arg.startswith("--") and "=" in arg:
                what = f"argument {arg.split('=', 1)[0]}"
                pos -= len(arg.split("=", 1)[0]) + 1
            elif arg.startswith("-"):
                what = f"option {arg.encode('utf-8', 'backslashreplace').decode()}"
            elif i and argv[i - 1].startswith("-") and "=" not in argv[i - 1]:
                what = f"argument {argv[i - 1]}"
            else:
                what = f"argument {i + 1} ({raw!r})"
            return f"{what}: not valid UTF-8 text ({byte} at position {pos}); pass it UTF-8 encoded (check the locale)"
    return None


def report_failure(exc: BaseException) -> int:
    """Print ``exc`` as one ``omni-backends: error:`` line on stderr (:func:`error_message`; the original
    traceback above it when a driver failed to import or :data:`TRACEBACK_ENV` is ``1``); returns its exit
    status (:func:`exit_status`). A package that raised while being imported is reported as that package's
    failure (:func:`omni_backends.probing.vendor_import_error`), never as the symptom."""
    from omni_backends.probing import vendor_import_error

    blamed = None
    if not isinstance(exc, (VendorImportError, DriverLoadError)) and isinstance(exc, Exception):
        try:
            blamed = vendor_import_error(exc)
        except Exception:  # finding the culprit must not hide the failure
            blamed = None
    err = blamed or exc
    try:
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            print("".join(traceback.format_exception(exc)).rstrip(), file=sys.stderr)
        elif isinstance(err, DriverLoadError) and err.__cause__ is not None:
            # the driver's own import error is what the user must fix: show where it happened
            print("".join(traceback.format_exception(err.__cause__)).rstrip(), file=sys.stderr)
        print(f"omni-backends: error: {error_message(err)}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr itself is gone: the status still says it
        pass
    return exit_status(err)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command (``args.func(args)``) and map whatever ends it to the exit-status table: its
    return value; 130 for Ctrl-C (``omni-backends: interrupted``); a reader of stdout that went away
    (``| head``): the rest of the output is dropped, status 0; any other failure one
    ``omni-backends: error:`` line (:func:`report_failure`), never a traceback unless asked for
    (:data:`TRACEBACK_ENV`)."""
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("omni-backends: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit:
        raise
    except BrokenPipeError as exc:  # e.g. `omni-backends devices --json | head`: stdout's reader is gone
        if exc.filename is None and _stdout_broken():
            _stdout_gone()
            return EXIT_OK
        return report_failure(exc)
    except BaseException as exc:  # noqa: BLE001 - every failure gets its line and status
        return report_failure(exc)


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader went away (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``omni-backends`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    The status follows :data:`EXIT_STATUS_HELP` (:func:`exit_status`): 0 success;
    1 the environment cannot do it (or an unexpected error); 2 usage error (an argument that is not valid
    UTF-8 included, naming its option); 3 a run failed after its engines started; 130 interrupted. Every
    failure is one ``omni-backends: error:`` line (:func:`run_command`); the original traceback only with
    :data:`TRACEBACK_ENV` ``=1`` (and always above a driver's own import error). A command plugin that
    fails to load is a warning, never fatal; built-in commands (``devices``) load no command plugin at all.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # a built-in command (devices) must not pay for, or break on, another command's imports
        parser, load_errors = build_parser(plugins=not (argv and argv[0] in BUILTIN_COMMANDS))
    except BaseException as exc:  # noqa: BLE001 - building the parser imports the command plugins
        if isinstance(exc, KeyboardInterrupt):
            print("omni-backends: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return report_failure(exc)
    bad = argv_not_utf8(argv)
    if bad:
        parser.error(bad)
    args = parser.parse_args(argv)
    for e in load_errors:
        print(f"omni-backends: warning: {e}", file=sys.stderr)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    return run_command(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
