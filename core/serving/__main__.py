"""``python -m core.serving [serve options]``: ``omni-backends serve`` without the installed entry point
(same options, errors and exit statuses)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from core.serving.cli import add_serve_command
    from omni_backends.cli import EXIT_INTERRUPTED, exit_status
    from omni_backends.errors import OmniBackendError

    parser = argparse.ArgumentParser(prog="omni-backends")
    add_serve_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OmniBackendError as exc:
        print(f"omni-backends: error: {exc}", file=sys.stderr)
        return exit_status(exc)


if __name__ == "__main__":
    sys.exit(main())
