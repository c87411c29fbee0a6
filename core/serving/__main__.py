"""``python -m core.serving [serve options]``: ``omni-backends serve`` without the installed entry point
(same options, errors and exit statuses)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from core.serving.cli import add_serve_command
    from omni_backends.cli import CommandParser, argv_not_utf8, run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = CommandParser(prog="omni-backends")
    add_serve_command(parser.add_subparsers(dest="command"))
    bad = argv_not_utf8(argv)
    if bad:
        parser.error(bad)
    return run_command(parser.parse_args(["serve", *argv]))


if __name__ == "__main__":
    sys.exit(main())
