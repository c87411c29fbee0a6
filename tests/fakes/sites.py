"""Build fake driver distributions on disk and run omni-backends against them.

A *site* is a temporary directory holding ``<dist>-<version>.dist-info``
directories (``METADATA`` + ``entry_points.txt``), i.e. real entry-point
metadata that ``importlib.metadata`` and stevedore discover once the directory
is on ``PYTHONPATH``. The driver modules themselves live in
``tests/fakes/modules`` (no metadata there, so nothing registers by accident).

Everything runs in a subprocess: that is the only way to give stevedore a
fresh ``$XDG_CACHE_HOME`` (its cache directory is fixed when stevedore is
imported) and to see what a fresh ``omni-backends`` process imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

MODULES = Path(__file__).resolve().parent / "modules"
GROUP = "omni_backends.drivers"
COMMANDS = "omni_backends.commands"


def make_site(root: Path, dists: Mapping[str, Mapping[str, str]],
              commands: Mapping[str, Mapping[str, str]] | None = None) -> Path:
    """Write one dist-info per distribution: ``{dist name: {driver name: "module:Class"}}``.

    ``commands`` adds ``omni_backends.commands`` entry points the same way.
    Returns the site directory (``root / "site"``).
    """
    site = root / "site"
    site.mkdir(parents=True, exist_ok=True)
    groups: dict[str, dict[str, Mapping[str, str]]] = {}
    for group, table in ((GROUP, dists), (COMMANDS, commands or {})):
        for dist, eps in table.items():
            groups.setdefault(dist, {})[group] = eps
    for dist, by_group in groups.items():
        info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = []
        for group, eps in by_group.items():
            lines += [f"[{group}]"] + [f"{name} = {target}" for name, target in eps.items()] + [""]
        (info / "entry_points.txt").write_text("\n".join(lines))
    return site


def env_for(site: Path, cache_home: Path | str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment: the site + fake modules on PYTHONPATH, a private stevedore cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_BACKENDS_")}
    # an inherited PYTHONPATH (a worktree under test) comes after the fakes
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(MODULES), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["XDG_CACHE_HOME"] = str(cache_home)
    env.update(extra or {})
    return env


def run(args: list[str], site: Path, cache_home: Path | str, extra_env: Mapping[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python <args>`` with cwd = site (so ``-m`` puts the site first on sys.path)."""
    return subprocess.run(
        [sys.executable, *args], cwd=site, env=env_for(site, cache_home, extra_env),
        capture_output=True, text=True, timeout=timeout,
    )


def cli(args: list[str], site: Path, cache_home: Path | str, extra_env: Mapping[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """``omni-backends <args>`` in a fresh process."""
    return run(["-m", "omni_backends.cli", *args], site, cache_home, extra_env)


def devices_json(site: Path, cache_home: Path | str, *flags: str, extra_env: Mapping[str, str] | None = None,
                 ) -> dict:
    """``omni-backends devices --json [flags]`` parsed; fails loudly on bad output."""
    proc = cli(["devices", "--json", *flags], site, cache_home, extra_env)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"devices --json printed no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from exc
    report["_returncode"] = proc.returncode
    report["_stderr"] = proc.stderr
    return report


def driver(report: dict, name: str) -> dict:
    """The report's entry for driver ``name``."""
    found = [d for d in report["drivers"] if d["name"] == name]
    assert len(found) == 1, f"driver {name!r} appears {len(found)} times in {[d['name'] for d in report['drivers']]}"
    return found[0]


def python(code: str, site: Path, cache_home: Path | str, extra_env: Mapping[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh process against the site."""
    return run(["-c", code], site, cache_home, extra_env)


def cache_file(site: Path, cache_home: Path | str) -> Path:
    """The stevedore cache file ``python -m omni_backends.cli`` uses with this site."""
    proc = run(["-m", "fake_cache_key"], site, cache_home)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())
