"""Shared pytest configuration (keep small and additive).

Puts ``tests/`` on ``sys.path`` so helpers such as ``fakes`` import the same
way whatever pytest's rootdir or import mode.
"""

import pathlib
import sys

_TESTS = str(pathlib.Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
