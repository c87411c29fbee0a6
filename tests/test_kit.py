"""The conformance kit passes the example out-of-tree driver and fails each broken copy of it,
naming the broken contract (issue 8).

Each run is a real ``pytest --pyargs omni_backends.testing.suite --device NAME``
in a subprocess. The broken variants (``tests/example_driver/broken``) are
registered the way any third-party driver is: a ``.dist-info`` with an
``omni_backends.drivers`` entry point, found through ``importlib.metadata`` /
stevedore on ``PYTHONPATH``. The good driver, ``simdev``, is the installed
``omni-backends-simdev`` distribution (``pip install tests/example_driver``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from omni_backends.testing.kit import CONTRACTS, ContractViolation, check_interface, missing_methods

ROOT = Path(__file__).resolve().parents[1]
BROKEN = ROOT / "tests" / "example_driver" / "broken"


def _simdev_installed() -> None:
    try:
        importlib.metadata.version("omni-backends-simdev")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the example driver is not installed: pip install -e tests/example_driver (scripts/setup.sh does)")


@pytest.fixture(scope="module")
def broken_module():
    _simdev_installed()
    spec = importlib.util.spec_from_file_location("omni_simdev_broken", BROKEN / "omni_simdev_broken.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _register(tmp: Path, variants: dict) -> Path:
    """Write a .dist-info declaring every variant as an ``omni_backends.drivers`` entry point."""
    info = tmp / "omni_simdev_broken-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omni-simdev-broken\nVersion: 0.0.0\n")
    lines = ["[omni_backends.drivers]"] + [f"{name} = {target}" for name, (target, _, _) in variants.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return tmp


def _kit(device: str, tmp: Path, extra_path: list[Path]) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    report = tmp / f"report-{device}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in extra_path] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["XDG_CACHE_HOME"] = str(tmp / "cache")  # stevedore's entry-point cache stays in tmp
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--pyargs",
           "omni_backends.testing.suite", "-m", "device_tier", "--device", device, "--omni-report", str(report)]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=400)
    assert report.exists(), f"no report for --device {device}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    doc = json.loads(report.read_text())
    doc["rc"], doc["stdout"] = proc.returncode, proc.stdout
    return doc


@pytest.fixture(scope="module")
def kit_runs(broken_module, tmp_path_factory):
    """device name -> the JSON report of one kit run (the good driver and every broken variant)."""
    tmp = tmp_path_factory.mktemp("kit")
    _register(tmp / "dists", broken_module.VARIANTS)
    names = ["simdev", *broken_module.VARIANTS]
    with ThreadPoolExecutor(max_workers=3) as pool:
        docs = pool.map(lambda n: _kit(n, tmp / n, [tmp / "dists", BROKEN]), names)
        return dict(zip(names, docs))


def _failures(doc: dict) -> list[dict]:
    return [t for t in doc["tests"] if t["outcome"] in ("failed", "error")]


def test_example_driver_passes_the_device_tier(kit_runs):
    doc = kit_runs["simdev"]
    assert doc["rc"] == 0, doc["stdout"][-4000:]
    assert not _failures(doc)
    passed = [t for t in doc["tests"] if t["outcome"] == "passed"]
    assert len(passed) >= 40 and all(t["tier"] == "device_tier" for t in doc["tests"])
    for t in doc["tests"]:
        if t["outcome"] == "skipped":
            assert t["reason"], f"{t['nodeid']} skipped without a reason"
    driver = doc["driver"]
    assert driver["driver"] == "simdev" and driver["distribution"] == "omni-backends-simdev"
    assert driver["interface_version"] == 1 and driver["driver_interface_versions"] == [1]
    assert driver["versions"]["torch"] and driver["capabilities"]["static_graph_modes"] == ["FULL"]
    # the kit chose the graph tests from the declared capability: they ran
    assert any("test_graphs.py::test_replay_recomputes" in t["nodeid"] and t["outcome"] == "passed"
               for t in doc["tests"])


@pytest.mark.parametrize(
    "variant, detail",
    [("missing", "abstract method(s) to_host"), ("graph", "left the captured output stale"),
     ("copy", "an in-flight source was reused"), ("sampler", "on tied logits"), ("ties", "on tied maxima"),
     ("version", "version(s) [99]")],
)
def test_broken_variant_fails_naming_the_contract(kit_runs, broken_module, variant, detail):
    name = f"simdev-broken-{variant}"
    _target, contract, must_fail = broken_module.VARIANTS[name]
    doc = kit_runs[name]
    assert doc["rc"] == 1, doc["stdout"][-4000:]
    failures = _failures(doc)
    assert any(t["nodeid"].endswith(must_fail) or must_fail in t["nodeid"] for t in failures), (
        f"{must_fail} did not fail for {name}: {[t['nodeid'] for t in failures]}"
    )
    named = [t for t in failures if f"conformance contract '{contract}' broken" in (t["reason"] or "")]
    others = [(t["nodeid"], t["reason"]) for t in failures if t not in named]
    assert named and not others, f"failures not naming '{contract}': {others}"
    assert f"conformance contract '{contract}' broken" in doc["stdout"]
    assert any(detail in t["reason"] for t in named), [t["reason"] for t in named]


def test_a_broken_variant_breaks_only_its_contract(kit_runs):
    # the copy and graph variants still pass everything else, the interface included
    for name, spared in (("simdev-broken-copy", "test_graphs.py"), ("simdev-broken-graph", "test_buffers.py")):
        tests = kit_runs[name]["tests"]
        assert all(t["outcome"] in ("passed", "skipped") for t in tests if spared in t["nodeid"])
        assert all(t["outcome"] == "passed" for t in tests if "test_interface.py" in t["nodeid"])


def test_missing_method_is_named_in_process(broken_module):
    cls = broken_module.MissingMethod
    assert missing_methods(cls) == ["to_host"]
    with pytest.raises(ContractViolation, match="interface-completeness.*to_host"):
        check_interface(cls)
    check_interface(broken_module.SimDevBackend)  # the good driver is complete


def test_contract_names_are_checked():
    with pytest.raises(ValueError, match="unknown contract"):
        ContractViolation("no-such-contract", "x")
    assert {"graph-replay", "copy-ordering", "sampler-equivalence", "interface-completeness"} <= set(CONTRACTS)


def test_device_markers_skip_with_a_reason(tmp_path):
    (tmp_path / "test_marked.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.device_cuda
        def test_cuda_only():
            pass

        @pytest.mark.device("simdev")
        def test_simdev_only():
            pass

        @pytest.mark.device_npu
        def test_npu_alias():
            pass
    """))
    def run(device):
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q",
                               "--device", device, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True)
    out = run("cpu").stdout
    assert "needs --device cuda; this run uses --device cpu" in out
    assert "needs --device simdev; this run uses --device cpu" in out
    assert "3 skipped" in out
    out = run("ascend").stdout  # alias of npu
    assert "1 passed, 2 skipped" in out, out


def test_simdev_graph_wrapper_captures_then_replays():
    """The example driver's wrap_graph (its CUDAGraphWrapper twin): first call in FULL
    mode captures, later calls replay on the persistent input, keyed by BatchDescriptor."""
    _simdev_installed()
    pytest.importorskip("vllm")
    import torch
    from omni_simdev.driver import SimDevBackend
    from vllm.config import CUDAGraphMode, VllmConfig
    from vllm.forward_context import BatchDescriptor

    backend, cfg = SimDevBackend(), VllmConfig()
    calls = []

    def runnable(x):
        calls.append(1)
        return torch.relu(x * 2 - 1).cumsum(0)

    wrapped = backend.wrap_graph(runnable, cfg, CUDAGraphMode.FULL)
    assert backend.wrap_graph(runnable, cfg, CUDAGraphMode.NONE) is runnable
    x = torch.linspace(-1, 1, 8)
    outs = []
    for step in range(3):
        x.copy_(torch.linspace(-1, 1, 8) * (step + 1))
        with backend.forward_context(None, cfg, num_tokens=8, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                                     batch_descriptor=BatchDescriptor(num_tokens=8)):
            outs.append(wrapped(x).clone())
        torch.testing.assert_close(outs[-1], torch.relu(x * 2 - 1).cumsum(0))
    assert len(calls) == 1, "the runnable ran more than once: replays must not call it"
    assert not torch.equal(outs[0], outs[2])


def test_the_plugin_registers_every_marker_the_suite_uses(tmp_path):
    """A vendor's repository has none of this repository's pytest ini: the kit's plugin must register each marker
    the suite uses, or ``--strict-markers`` stops collection."""
    import re

    suite = ROOT / "omni_backends" / "testing" / "suite"
    used = {m for f in suite.glob("*.py") for m in re.findall(r"pytest\.mark\.(\w+)", f.read_text())}
    used -= {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}
    assert {"device_tier", "engine_tier", "slow"} <= used
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir",
                           str(tmp_path), "--markers"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    registered = set(re.findall(r"^@pytest\.mark\.(\w+)", proc.stdout, re.M))
    assert used <= registered, f"used but not registered by the plugin: {sorted(used - registered)}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir",
                           str(tmp_path), "--strict-markers", "--co", "-q", "--pyargs", "omni_backends.testing.suite",
                           "--device", "cpu"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "tests collected" in proc.stdout


def test_sampler_advice_does_not_suggest_what_is_installed():
    """A sampler-equivalence failure's advice follows what the sampler has: 'install the one-token rule' only
    where it is not installed."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.sampler import Sampler

    from omni_backends.testing.suite.test_sampler import one_token_advice
    from omni_backends.patches import install_one_token_greedy

    plain = one_token_advice(Sampler())
    assert "install the one-token rule" in plain
    installed = one_token_advice(install_one_token_greedy(Sampler()))
    assert "is installed on this sampler" in installed and "install the one-token rule" not in installed
    assert "cannot wrap it" in one_token_advice(object())
