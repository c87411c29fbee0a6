"""Engine tier: the omni runner built over the driver's bases runs the demo thinker
like stock vLLM on the same device (needs the device's vLLM stack and the omni core).

Each side runs in its own process (``python -m omni_backends.testing.engine_check``):
vLLM engines and the driver selection are per process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from omni_backends.testing.kit import expect, vllm_missing_reason

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]


@pytest.fixture(scope="module")
def engine_driver(driver_under_test, backend):
    probe = driver_under_test.probe
    if probe is None or not probe.usable:
        pytest.skip(f"driver {backend.name!r} is not usable for an engine here: "
                    f"{probe.reason if probe else 'not probed'}" + (f"; to fix: {probe.fix}" if probe and probe.fix else ""))
    missing = vllm_missing_reason()
    if missing:
        pytest.skip(f"{missing}; the engine tier starts a vLLM engine")
    if importlib.util.find_spec("core") is None:
        pytest.skip("the omni core runner (package 'core' of omni-backends) is not installed")
    commands = {ep.name for ep in importlib.metadata.entry_points(group="omni_backends.commands")}
    if "demo-model" not in commands:
        pytest.skip("`omni-backends demo-model` is not registered (omni_backends.commands); reinstall omni-backends")
    return backend


def _run(args, timeout=900):
    env = dict(os.environ)
    env.pop("OMNI_BACKENDS_SELECTION", None)
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{' '.join(args)} failed (rc={proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def demo(engine_driver, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine")
    _run(["-m", "omni_backends.cli", "demo-model", "create", str(tmp / "demo")])
    return tmp


def _side(driver: str, demo, side: str, mode: str = "NONE") -> dict:
    path = demo / f"{side}-{mode}.json"
    _run(["-m", "omni_backends.testing.engine_check", "--device", driver, "--model", str(demo / "demo" / "thinker"),
          "--side", side, "--out", str(path), "--graph-mode", mode])
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def sides(engine_driver, demo):
    return {side: _side(engine_driver.name, demo, side) for side in ("stock", "omni")}


def _same_outputs(stock: list, omni: list, what: str) -> None:
    expect(len(stock) == len(omni) == 6, "engine", f"{what}: {len(stock)} stock vs {len(omni)} omni outputs")
    for i, (s, o) in enumerate(zip(stock, omni)):
        expect(o["token_ids"] == s["token_ids"], "engine",
               f"{what}: request {i}: the omni runner generated {o['token_ids']}, stock vLLM {s['token_ids']}")
        for step, (ls, lo) in enumerate(zip(s["logprobs"], o["logprobs"])):
            expect(ls.keys() == lo.keys(), "engine", f"{what}: request {i} step {step}: top logprob ids differ")
            worst = max(abs(ls[k] - lo[k]) for k in ls)
            expect(worst <= 1e-4, "engine", f"{what}: request {i} step {step}: logprobs differ by {worst:.2e}")
    expect(any(len(o["token_ids"]) > 1 for o in omni), "engine", f"{what}: the thinker generated no multi-token output")


def test_omni_runner_is_built_over_the_driver_base(sides, engine_driver):
    omni = sides["omni"]
    base = omni["model_runner_base"]
    for rank in omni["ranks"]:
        mro = rank["runner_mro"]
        expect(rank["driver"] == engine_driver.name, "engine",
               f"a rank selected driver {rank['driver']!r}, the parent {engine_driver.name!r}")
        expect(mro and mro[0].startswith("Omni") and base in mro, "engine",
               f"the runner class {mro[:3] if mro else mro} is not the omni runner over the driver's base {base!r}")


def test_demo_thinker_matches_stock_vllm(sides):
    _same_outputs(sides["stock"]["outputs"], sides["omni"]["outputs"], "eager")


def test_declared_graph_modes_run_like_stock_vllm(engine_driver, capabilities, demo):
    """Each graph mode the driver declares (``static_graph_modes``): both sides run compiled with that
    ``cudagraph_mode``, vLLM resolves the mode asked for, and the omni runner equals stock vLLM in it. Where vLLM's
    platform runs no static graphs the mode is skipped with vLLM's reason (no engine starts)."""
    if not capabilities.static_graphs:
        pytest.skip(f"driver {engine_driver.name!r} declares no static graph modes: the engine tier runs eager only")
    skipped = []
    for mode in capabilities.static_graph_modes:
        stock = _side(engine_driver.name, demo, "stock", mode)
        if stock.get("skipped"):
            skipped.append(f"{mode}: {stock['skipped']}")
            continue
        omni = _side(engine_driver.name, demo, "omni", mode)
        for name, doc in (("stock", stock), ("omni", omni)):
            expect(doc["resolved_cudagraph_mode"] == mode, "engine",
                   f"{name} vLLM resolved cudagraph_mode {doc['resolved_cudagraph_mode']} for the declared {mode}: "
                   "the driver declares a mode its vLLM stack does not run")
        _same_outputs(stock["outputs"], omni["outputs"], f"cudagraph_mode {mode}")
    if len(skipped) == len(capabilities.static_graph_modes):
        pytest.skip("; ".join(skipped))
    for line in skipped:  # some modes ran; the others are reported (pytest -s / the log)
        print(f"skipped mode {line}")
