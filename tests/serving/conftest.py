"""The real-server tests' shared fixture: the demo models, made once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory):
    """The demo models (created once per session in a temporary folder)."""
    from core.models.create import create_demo_models

    path = str(tmp_path_factory.mktemp("serve-demo") / "demo")
    create_demo_models(path)
    return path
