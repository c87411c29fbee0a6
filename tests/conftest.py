"""Shared pytest configuration (keep small and additive).

Puts ``tests/`` on ``sys.path`` so helpers such as ``fakes`` import the same
way whatever pytest's rootdir or import mode.
"""

import pathlib
import sys

# vLLM-Omni's wheel (test extra) registers a vLLM plugin whose import patches vLLM's classes; no test process, nor
# any engine a test starts, may load it (core.models.vllm_omni). Imported before tests/ goes on sys.path.
from core.models.vllm_omni import keep_plugin_out

keep_plugin_out()

_TESTS = str(pathlib.Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
