"""bench/bench_core_runner.py refuses out-of-range options in its argument parser, before any engine starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench", "bench_core_runner.py")


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=120, env=full_env)


@pytest.mark.parametrize("args, message", [
    (["--batches", "0"], "--batches takes distinct positive integers separated by commas (e.g. 1,8,64), got '0'"),
    (["--batches", "1,-8"], "--batches takes distinct positive integers"),
    (["--batches", "1,x"], "--batches takes distinct positive integers"),
    (["--rounds", "0"], "--rounds must be an integer >= 1, got '0'"),
    (["--rounds", "-3"], "--rounds must be an integer >= 1, got '-3'"),
    (["--max-tokens", "0"], "--max-tokens must be an integer 2..243, got '0'"),
    (["--max-tokens", "1"], "--max-tokens must be an integer 2..243, got '1'"),
    (["--max-tokens", "244"], "--max-tokens must be an integer 2..243, got '244'"),
    (["--iters", "0"], "--iters must be an integer >= 1"),
    (["--profile-reps", "0"], "--profile-reps must be an integer >= 1, got '0'"),
    (["--device", "tpu9"], "unknown device 'tpu9' (from --device). Installed drivers:"),
    (["--sync-debug", "--device", "cpu"], "--sync-debug counts CUDA host-device synchronisations: it needs "
                                          "--device cuda, not 'cpu'"),
], ids=["batch-0", "batch-negative", "batch-text", "rounds-0", "rounds-negative", "max-tokens-0", "max-tokens-1",
        "max-tokens-too-long", "iters-0", "profile-reps-0", "unknown-device", "sync-debug-off-cuda"])
def test_bad_option_is_one_parser_error_before_any_engine(args, message):
    proc = _run(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert message in proc.stderr, proc.stderr
    assert "usage:" in proc.stderr  # argparse's error: one message, the usage line, exit status 2
    assert "LLM engine" not in proc.stdout + proc.stderr  # no engine was started
    assert "Traceback" not in proc.stderr


def test_v2_on_a_driver_without_a_v2_runner_is_refused_before_any_engine():
    proc = _run("--device", "cpu", "--batches", "1", "--rounds", "1", env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert proc.returncode != 0
    assert "VLLM_USE_V2_MODEL_RUNNER=1 but driver 'cpu' cannot run vLLM's V2 model runner" in proc.stderr, proc.stderr
    assert "Initializing a V1 LLM engine" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_device_without_its_stack_is_one_parser_error_before_any_engine():
    """An installed driver that cannot run here (cuda on a CPU box): the registry's reason as argparse's error,
    not a ``DeviceNotUsableError`` traceback from the first engine start."""
    from omni_backends.registry import discover, safe_probe

    entries, _ = discover()
    name = next((n for n in ("cuda", "npu", "xpu") if entries.get(n) is not None and entries[n].cls is not None
                 and not safe_probe(entries[n].cls).usable), None)
    if name is None:
        pytest.skip("every installed driver is usable here")
    proc = _run("--device", name, "--batches", "1", "--rounds", "1")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert f"--device {name}: device '{name}' was requested (explicit --device) but is not usable here" in proc.stderr
    assert "Traceback" not in proc.stderr and "LLM engine" not in proc.stdout + proc.stderr


def test_repeated_profiles_give_each_functions_median():
    """``--profile-reps``: each function's figures are the median over the profiles (one profile with another
    process's pause in it moves nothing); a function missing from a profile counts 0 there."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        from bench_core_runner import _MedianStats
    finally:
        sys.path.remove(os.path.join(ROOT, "bench"))

    class Run:
        def __init__(self, stats):
            self.stats = stats

    f, g = ("core/x.py", 1, "f"), ("core/x.py", 9, "g")
    runs = [Run({f: (2, 2, 1.0, 1.5, {}), g: (1, 1, 0.2, 0.2, {})}), Run({f: (2, 2, 90.0, 95.0, {})}),
            Run({f: (2, 2, 3.0, 4.0, {}), g: (1, 1, 0.4, 0.4, {})})]
    med = _MedianStats(runs).stats
    assert med[f][:4] == (2, 2, 3.0, 4.0) and med[g][:4] == (1, 1, 0.2, 0.2)
