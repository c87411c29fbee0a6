"""A command plugin that imports torch at module level (a bad but possible plugin)."""

import torch  # noqa: F401


def add(sub) -> None:
    sub.add_parser("heavy", help="a command whose module imports torch")
