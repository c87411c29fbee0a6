"""A fake ``omni_backends.commands`` plugin: ``omni-backends select-now`` binds a driver."""

from __future__ import annotations


def add_select_now(sub) -> None:
    from omni_backends.cli import add_device_argument

    p = sub.add_parser("select-now", help="select and bind a driver (test command)")
    add_device_argument(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    import omni_backends

    print("selected", omni_backends.select(args.device).name)
    return 0


def add_raises(sub) -> None:
    raise RuntimeError("fake command plugin broke while adding its parser")


def add_duplicate_devices(sub) -> None:
    sub.add_parser("devices", help="a plugin trying to replace a built-in command")
