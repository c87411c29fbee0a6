"""Fixtures for the core-runner tests: demo models and engine scenarios.

Engine scenarios run in fresh subprocesses (vLLM engines and the driver
selection are per process); each scenario runs at most once per session.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _need_vllm() -> None:
    from omni_backends.cpu.driver import CpuBackend

    probe = CpuBackend.probe()
    if not probe.usable:
        pytest.skip(f"engine tests need the cpu driver's vLLM stack: {probe.reason}")


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Demo thinker/talker/code2wav created once per session (seed 1234)."""
    from core.models.create import create_demo_models

    d = str(tmp_path_factory.mktemp("omni") / "demo")
    create_demo_models(d)
    return d


class ScenarioRunner:
    def __init__(self, demo_dir: str, out_dir: str):
        self.demo_dir, self.out_dir = demo_dir, out_dir
        self._cache: dict[tuple, dict] = {}

    def __call__(self, scenario: str, *, multiprocess: bool = False, env: dict | None = None, timeout: int = 600) -> dict:
        import torch

        key = (scenario, multiprocess, tuple(sorted((env or {}).items())))
        if key in self._cache:
            return self._cache[key]
        out = os.path.join(self.out_dir, f"{scenario}-{'mp' if multiprocess else 'inproc'}-{len(self._cache)}.pt")
        e = dict(os.environ)
        e.update(env or {})
        e["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
        e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        e.pop("OMNI_BACKENDS_SELECTION", None)
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "engine_scenarios.py"), scenario, self.demo_dir, out],
            env=e, capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(f"scenario {scenario} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        res = torch.load(out, weights_only=False)
        self._cache[key] = res
        return res


@pytest.fixture(scope="session")
def run_scenario(demo_dir: str, tmp_path_factory: pytest.TempPathFactory) -> ScenarioRunner:
    _need_vllm()
    return ScenarioRunner(demo_dir, str(tmp_path_factory.mktemp("scenarios")))
