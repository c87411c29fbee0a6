"""The conformance kit passes the example out-of-tree driver and fails each broken copy of it,
naming the broken contract: the kit's own mutation test (issues 8, 38, 48). One broken variant per contract the
device tier checks (``tests/example_driver/broken/omni_simdev_broken.py``).

Each run is a real ``pytest --pyargs omni_backends.testing.suite --device NAME``, all of them in two Python
processes (``tests/kit_mutation.py``: ``pytest.main`` once per driver, torch and vLLM imported once). The broken variants (``tests/example_driver/broken``) are
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


#: contracts a variant breaks besides its own, as a consequence (a generator that ignores its seed also makes
#: seeded sampling repeat itself; simdev's graph wrapper replays through the graph primitive)
ALSO_BREAKS = {"simdev-broken-generator": {"sampler-equivalence"}, "simdev-broken-graph": {"graph-wrapping"}}


@pytest.fixture(scope="module")
def kit_runs(broken_module, tmp_path_factory):
    """device name -> the JSON report of one kit run (the good driver and every broken variant), with ``rc`` and
    ``stdout``. All runs happen in two Python processes (``tests/kit_mutation.py``: ``pytest.main`` per driver,
    torch and vLLM imported once per process), half of the drivers each, side by side."""
    tmp = tmp_path_factory.mktemp("kit")
    _register(tmp / "dists", broken_module.VARIANTS)
    names = ["simdev", *broken_module.VARIANTS]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "dists"), str(BROKEN), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["XDG_CACHE_HOME"] = str(tmp / "cache")  # stevedore's entry-point cache stays in tmp
    out = tmp / "reports"
    halves = [names[0::2], names[1::2]]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "kit_mutation.py"), str(out), *half], cwd=tmp,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for half in halves]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    docs = {}
    for name in names:
        report = out / f"{name}.json"
        assert report.exists(), f"no report for --device {name}:\n" + "\n".join(log[-3000:] for log in logs)
        doc = json.loads(report.read_text())
        doc["rc"], doc["stdout"] = int((out / f"{name}.rc").read_text()), (out / f"{name}.out").read_text()
        docs[name] = doc
    return docs


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
    assert doc["kit"]["version"] and doc["kit"]["interface_version"] == 1  # the kit it was certified against
    # the kit chose the graph tests from the declared capability: they ran, graph wrapping in the FULL mode too
    for test in ("test_graphs.py::test_replay_recomputes", "test_graphs.py::test_wrap_graph_captures_then_replays",
                 "test_device_ops.py::test_to_host_waits_for_queued_copies",
                 "test_device_ops.py::test_stream_context_sets_and_restores"):
        assert any(test in t["nodeid"] and t["outcome"] == "passed" for t in doc["tests"]), test
    # the ordering checks relied on copies the kit saw still in flight (simdev queues them on its streams)
    ordering = doc["ordering"]
    assert ordering["synchronous_copies"] is False
    checks = {c["nodeid"].split("::")[-1]: c for c in ordering["checks"]}
    assert set(checks) == {"test_to_host_waits_for_queued_copies", "test_stream_event_ordering"}, checks
    assert checks["test_to_host_waits_for_queued_copies"]["contract"] == "to-host"
    assert checks["test_stream_event_ordering"]["contract"] == "streams-events"
    for c in checks.values():
        assert c["outcome"] == "passed" and c["in_flight"] is True, c
        assert c["copies_queued"] == c["copies_in_flight"] >= 1, c
        assert c["evidence"] == ["destination"], c  # a host-memory device: only the destination counts


def _ordering(doc: dict) -> dict[str, dict]:
    return {c["nodeid"].split("::")[-1]: c for c in doc["ordering"]["checks"]}


def test_a_queue_copy_that_does_not_queue_fails_kit_ops_saying_what_to_write(kit_runs):
    """Issue 48: simdev with the shared base's ``queue_copy`` (it copies at once there) and a ``to_host`` that
    does not flush. The ordering checks would pass vacuously; the kit fails ``kit-ops`` before relying on the copy,
    says what to write, and the report shows the checks ran with nothing in flight."""
    doc = kit_runs["simdev-broken-queue-copy"]
    reasons = [t["reason"] or "" for t in _failures(doc)]
    named = [r for r in reasons if "conformance contract 'kit-ops' broken" in r]
    assert len(named) == 3, reasons  # the proof, then both ordering checks, each before relying on the copy
    for r in named:
        assert "left nothing in flight" in r and "GenericKitOps.queue_copy" in r, r
        assert "Write queue_copy with your device's own non-blocking copy" in r and "synchronous_copies=True" in r
    assert not any("'to-host' broken" in r or "'streams-events' broken" in r for r in reasons), reasons
    for c in _ordering(doc).values():
        assert c["outcome"] == "failed" and c["in_flight"] is False and c["copies_in_flight"] == 0, c
    # the same to_host fault with a queue_copy that queues is caught by the to-host check, the copy in flight
    to_host = _ordering(kit_runs["simdev-broken-to-host"])["test_to_host_waits_for_queued_copies"]
    assert to_host["outcome"] == "failed" and to_host["in_flight"] is True
    assert "conformance contract 'to-host' broken" in to_host["reason"]


def test_cpu_driver_reports_its_ordering_checks_skipped_with_the_reason(tmp_path):
    """The cpu driver declares ``synchronous_copies`` (host memory: its copies land when issued): its ordering
    checks say skipped and why instead of passing with nothing in flight, and the kit holds it to the
    declaration (``queue_copy`` has landed on return)."""
    report = tmp_path / "cpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--pyargs",
         "omni_backends.testing.suite.test_device_ops", "--device", "cpu", "--omni-report", str(report)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    doc = json.loads(report.read_text())
    assert doc["driver"]["capabilities"]["synchronous_copies"] is True
    assert doc["ordering"]["synchronous_copies"] is True
    checks = _ordering(doc)
    assert set(checks) == {"test_to_host_waits_for_queued_copies", "test_stream_event_ordering"}, checks
    for c in checks.values():
        assert c["outcome"] == "skipped" and c["in_flight"] is None and c["copies_queued"] == 0, c
        assert "declares Capabilities.synchronous_copies" in c["reason"] and c["contract"] in c["reason"], c
    outcomes = {t["nodeid"].split("::")[-1]: t["outcome"] for t in doc["tests"]}
    assert outcomes["test_queue_copy_follows_the_declared_copy_model"] == "passed"
    assert "declares Capabilities.synchronous_copies" in proc.stdout  # -rs prints the reason


def test_a_false_synchronous_copies_declaration_fails_kit_ops(tmp_path):
    """A driver that declares ``synchronous_copies`` to have its ordering checks skipped, while its
    ``queue_copy`` queues, fails ``kit-ops``: the declaration is checked, not trusted."""
    _simdev_installed()
    (tmp_path / "dists").mkdir()
    (tmp_path / "liar.py").write_text(textwrap.dedent("""
        import dataclasses
        from omni_simdev.driver import SimDevBackend

        class ClaimsSynchronousCopies(SimDevBackend):
            name = "simdev-claims-sync"

            def capabilities(self):
                return dataclasses.replace(super().capabilities(), synchronous_copies=True)
    """))
    dists = _register(tmp_path / "dists", {"simdev-claims-sync": ("liar:ClaimsSynchronousCopies", None, None)})
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(dists), str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    report = tmp_path / "liar.json"
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs",
                    "omni_backends.testing.suite.test_device_ops", "--device", "simdev-claims-sync",
                    "--omni-report", str(report)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    tests = {t["nodeid"].split("::")[-1]: t for t in json.loads(report.read_text())["tests"]}
    proof = tests["test_queue_copy_follows_the_declared_copy_model"]
    assert proof["outcome"] == "failed", proof
    assert "conformance contract 'kit-ops' broken" in proof["reason"] and "drop the flag" in proof["reason"]


def test_every_device_tier_contract_has_a_broken_variant(broken_module):
    from omni_backends.testing.kit import CONTRACTS

    covered = {contract for _, contract, _ in broken_module.VARIANTS.values()}
    # 'engine' is the engine tier's contract: the omni runner over the driver's bases equals stock vLLM
    # (omni_backends/testing/suite/test_engine_tier.py, on the cpu driver in scripts/test.sh)
    assert set(CONTRACTS) - covered == {"engine"}, sorted(set(CONTRACTS) - covered)


@pytest.mark.parametrize("variant", [
    "missing", "version", "kitops", "queue-copy", "probe", "memory", "events", "stream-restore", "stream-noop",
    "generator", "graph", "wrap-graph", "cuda-graphs", "copy", "to-host", "buffer", "fc-slots", "fc-tokens",
    "capture-sizes", "attn-metadata", "kv-padding", "sampler", "ties"])
def test_broken_variant_fails_naming_the_contract(kit_runs, broken_module, variant):
    """The kit fails the variant; the test the contract is about fails, naming that contract; every other
    failure names a contract too (never a raw error), the variant's own unless it is a stated consequence."""
    name = f"simdev-broken-{variant}"
    _target, contract, must_fail = broken_module.VARIANTS[name]
    doc = kit_runs[name]
    assert doc["rc"] == 1, doc["stdout"][-4000:]
    failures = _failures(doc)
    hit = [t for t in failures if t["nodeid"].endswith(must_fail) or must_fail in t["nodeid"]]
    assert hit, f"{must_fail} did not fail for {name}: {[t['nodeid'] for t in failures]}"
    assert any(f"conformance contract '{contract}' broken" in (t["reason"] or "") for t in hit), \
        [t["reason"] for t in hit]
    allowed = {contract} | ALSO_BREAKS.get(name, set())
    others = [(t["nodeid"], t["reason"]) for t in failures
              if not any(f"conformance contract '{c}' broken" in (t["reason"] or "") for c in allowed)]
    assert not others, f"failures of {name} not naming {sorted(allowed)}: {others}"
    assert f"conformance contract '{contract}' broken" in doc["stdout"]


def test_the_cuda_graph_bases_on_another_device_are_named_not_a_raw_error(kit_runs):
    reasons = " ".join(t["reason"] or "" for t in _failures(kit_runs["simdev-broken-cuda-graphs"]))
    assert "inherits VllmUpstreamBackend.wrap_graph" in reasons and "SimGraphWrapper" in reasons, reasons
    assert "TypeError" not in reasons


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
