"""Fake installed-distribution metadata for version-gate tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def fake_dists(tmp_path: Path, monkeypatch: Any, versions: Mapping[str, str]) -> Path:
    """Write a real ``<dist>-<version>.dist-info/METADATA`` per entry and put the
    directory first on ``sys.path`` for this test, so ``importlib.metadata``
    reports these versions (shadowing what is really installed)."""
    site = tmp_path / "fake-site"
    for dist, version in versions.items():
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(site))
    return site
