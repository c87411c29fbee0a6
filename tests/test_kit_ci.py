"""Per-device CI definitions (ci/*.yml, .ci/run) and skip-with-reason on absent devices (issue 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ("cpu", "cuda", "npu", "xpu")


@pytest.mark.parametrize("device", DEVICES)
def test_one_ci_file_per_device_runs_the_kit(device):
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((ROOT / "ci" / f"{device}.yml").read_text())
    (job,) = doc["jobs"].values()
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    if device == "cpu" and "bash scripts/test.sh" in runs:  # the README's test command: pytest --device cpu
        assert "--device cpu" in (ROOT / "scripts" / "test.sh").read_text()
    else:
        assert f"--device {device}" in runs
    assert "--omni-report reports/" in runs
    for tier in ("device_tier", "engine_tier") if device != "cpu" else ():
        assert f"-m {tier}" in runs, f"ci/{device}.yml has no {tier} step"
    assert "omni_backends.testing.suite" in runs
    assert job["timeout-minutes"] <= 90


def test_ci_entry_point_installs_and_checks_the_example_driver():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    run = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q --no-deps -e tests/example_driver" in setup
    assert "--pyargs omni_backends.testing.suite --device simdev" in run
    assert "--omni-report reports/kit-cpu.json" in run


@pytest.mark.parametrize(
    "device, why",
    [("cuda", "no cuda device visible to driver 'cuda'"), ("xpu", "no xpu device visible to driver 'xpu'"),
     ("npu", "driver 'npu' cannot be instantiated here")],
)
def test_absent_device_skips_every_device_test_with_its_reason(tmp_path, device, why):
    """On a host without the device each test that needs it skips and says why (the probe's reason and fix)."""
    report = tmp_path / f"{device}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--pyargs",
         "omni_backends.testing.suite.test_device_ops", "omni_backends.testing.suite.test_interface",
         "--device", device, "--omni-report", str(report)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    doc = json.loads(report.read_text())
    if doc["driver"]["device_present"]:
        pytest.skip(f"a {device} device is visible here; this test is for hosts without one")
    assert proc.returncode == 0, proc.stdout[-3000:]
    skipped = [t for t in doc["tests"] if t["outcome"] == "skipped"]
    assert len(skipped) >= 7
    for t in skipped:
        assert why in t["reason"] and "probe:" in t["reason"] and "to fix:" in t["reason"], t
    # what needs no device still runs: the driver's interface is complete
    passed = {t["nodeid"].split("::")[-1] for t in doc["tests"] if t["outcome"] == "passed"}
    assert {"test_every_abstract_method_is_implemented", "test_probe_returns_result"} <= passed
    assert "SKIPPED" in proc.stdout and why in proc.stdout
