"""pytest plugin (entry point ``pytest11: omni_backends``): ``--device NAME``.

Kept light: importing it imports neither torch nor vLLM.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("omni-backends")
    group.addoption(
        "--device",
        action="store",
        default=None,
        help="omni-backends driver the tests run on (cpu, cuda, npu, xpu, or an out-of-tree driver name)",
    )


@pytest.fixture(scope="session")
def device_name(request: pytest.FixtureRequest) -> str:
    """The ``--device`` value (default ``cpu``)."""
    return request.config.getoption("--device") or "cpu"
