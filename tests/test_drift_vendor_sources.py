"""The drivers' bindings, the core's seam contract and the recorded stand-in signatures
against the real vendor sources (read with ``ast``; nothing installed).

Sources: vLLM 0.33.0, 0.26.0 and 0.23.0 wheels, the vllm-ascend 0.23.0.post1
sdist and 0.26.0rc1 wheel, the torch-npu 2.10.0.post4 wheel. ``scripts/fetch-vendor-sources.sh``
downloads them (``pip download --no-deps``, cached) into
``$OMNI_BACKENDS_VENDOR_DIR`` (default ``~/.cache/omni-backends/vendor-sources``)
and writes ``env.sh``; CI sources it. Without a source a test skips saying
which; with ``OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES=1`` (CI) it fails instead.
"""

from __future__ import annotations

import glob
import inspect
import os

import pytest

from omni_backends import drift
from omni_backends.binding import VendorSymbol
from omni_backends.drift.seams import check_seams
from simulated.vendor_signatures import STANDINS, Src

VENDOR_DIR = os.environ.get("OMNI_BACKENDS_VENDOR_DIR",
                            os.path.expanduser("~/.cache/omni-backends/vendor-sources"))
REQUIRE = os.environ.get("OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES") == "1"
#: name -> (subdirectory of VENDOR_DIR, file pattern, legacy location)
LAYOUT = {
    "vllm-0.33.0": ("vllm-0.33.0", "vllm-0.33.0-*.whl", "/tmp/vllm033/vllm-0.33.0-*.whl"),
    "vllm-0.26.0": ("vllm-0.26.0", "vllm-0.26.0-*.whl", os.path.expanduser("~/.cache/gpu-stack/0.26.0/vllm-whl/vllm-0.26.0-*.whl")),
    "vllm-0.23.0": ("vllm-0.23.0", "vllm-0.23.0-*.whl", "/tmp/vllm023/vllm-0.23.0-*.whl"),
    "vllm-ascend-0.23.0.post1": ("vllm-ascend-0.23.0.post1", "vllm_ascend-0.23.0.post1*",
                                 "/tmp/vllm_ascend_src/vllm_ascend-0.23.0*.whl"),
    "vllm-ascend-0.26.0rc1": ("vllm-ascend-0.26.0rc1", "vllm_ascend-0.26.0rc1*", ""),
    "torch-npu-2.10.0.post4": ("torch-npu-2.10.0.post4", "torch_npu-2.10.0.post4-*.whl",
                               "/tmp/torchnpu/torch_npu-2.10.0*.whl"),
}
_TREES: dict[str, drift.SourceTree] = {}


def _tree(name: str) -> drift.SourceTree:
    if name not in _TREES:
        sub, pattern, legacy = LAYOUT[name]
        found = sorted(glob.glob(os.path.join(VENDOR_DIR, sub, pattern))) or sorted(glob.glob(legacy))
        if not found:
            msg = (f"vendor source {name} not found under {VENDOR_DIR}/{sub} (run scripts/fetch-vendor-sources.sh "
                   "or set OMNI_BACKENDS_VENDOR_DIR)")
            if REQUIRE:
                pytest.fail(msg + "; OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES=1 makes this a failure")
            pytest.skip(msg)
        _TREES[name] = drift.SourceTree(found[0])
    return _TREES[name]


def _resolver(*names: str) -> drift.SourceResolver:
    return drift.SourceResolver([_tree(n) for n in names])


def _standin_params(fn) -> list[tuple[str, str, str | None]]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.default is inspect.Parameter.empty:
            default = None
        else:
            default = p.default.text if isinstance(p.default, Src) else repr(p.default)
        out.append((p.name, p.kind.name.lower(), default))
    return out


_STANDIN_SOURCE = {"vllm": "vllm-0.33.0", "vllm_ascend": "vllm-ascend-0.23.0.post1", "torch_npu": "torch-npu-2.10.0.post4"}


@pytest.mark.parametrize("key", list(STANDINS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_standin_signature_equals_vendor_source(key):
    module, attr, kind = key
    fn, recorded_from = STANDINS[key]
    resolver = _resolver(_STANDIN_SOURCE[module.split(".")[0]])
    where, params, _ = resolver.resolve(VendorSymbol(module, attr, required=(), kind=kind))
    real = [(p.name, p.kind, p.default) for p in params]
    assert real == _standin_params(fn), f"{recorded_from} changed at {where}: re-record the stand-in"


#: what each driver targets (docs/drift.md): cpu/cuda/xpu vLLM 0.33; npu vllm-ascend 0.23 on vLLM 0.23.
TARGETS = {
    "cpu": ("vllm-0.33.0",),
    "cuda": ("vllm-0.33.0",),
    "xpu": ("vllm-0.33.0",),
    "npu": ("vllm-0.23.0", "vllm-ascend-0.23.0.post1", "torch-npu-2.10.0.post4"),
}


@pytest.mark.parametrize("driver", sorted(TARGETS))
def test_driver_bindings_have_no_drift_against_vendor_sources(driver):
    from omni_backends.registry import discover

    resolver = _resolver(*TARGETS[driver])
    entries, _ = discover()
    report = drift.check_declarations(driver, drift.driver_declarations(entries[driver].cls), resolver)
    assert report.drift == [], drift.render_text({
        "mode": "source", "against": resolver.describe(), "date": "", "drift": True, "drivers": [report.to_json()]})
    assert report.checked > 0


# ------------------------------------------------------------------ the seam contract
def _contract():
    from core.seams import CONTRACT

    return CONTRACT


V1_GPU = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", kind="class")
V2_GPU = VendorSymbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", kind="class")


def _by(facts):
    return {(f.fact, f.seam): f for f in facts}


def test_the_two_h200_faults_are_reported_against_vllm_0_26_for_the_code_before_the_fix():
    """vLLM 0.26.0 on the H200 (docs/cuda.md): V1 ``TypeError: 'OmniOutput' object is not
    subscriptable`` in ``_dummy_run`` (from ``profile_run``), V2 ``'AsyncOutput' object has no
    attribute 'logprobs'`` in the scheduler. The contract as the code was at 1543e5a names both."""
    resolver = _resolver("vllm-0.26.0")
    from seam_contract_1543e5a import CONTRACT as old

    v1 = _by(check_seams(old, V1_GPU, resolver))
    dummy = v1[("model-call", "GPUModelRunner._dummy_run: self.model(")]
    assert dummy.kind == "uncovered-model-call" and dummy.vendor == "vllm/v1/worker/gpu_model_runner.py:6084"
    assert "reached from execute_model, profile_run, capture_model" in dummy.found
    assert v1[("model-call", "GPUModelRunner._model_forward: self.model(")].status == "covered"
    for facts in (v1, _by(check_seams(old, V2_GPU, resolver))):
        wrapper = facts[("async-output", "omni async wrapper")]
        assert wrapper.kind == "async-wrapper-unrecognised"
        assert wrapper.vendor == "vllm/v1/executor/uniproc_executor.py:93"
        assert "vllm/v1/executor/multiproc_executor.py:944" in wrapper.found
    v2 = _by(check_seams(old, V2_GPU, resolver))
    assert v2[("async-output", "sample_tokens returns AsyncOutput")].status == "clean"  # vLLM's own is recognised


def test_the_two_h200_faults_are_covered_by_the_contract_now():
    resolver = _resolver("vllm-0.26.0")
    contract = _contract()
    v1 = _by(check_seams(contract, V1_GPU, resolver))
    assert v1[("model-call", "GPUModelRunner._dummy_run: self.model(")].status == "covered"
    for facts in (v1, _by(check_seams(contract, V2_GPU, resolver))):
        assert facts[("async-output", "omni async wrapper")].status == "clean"


def _drift_kinds(facts) -> set[tuple[str, str]]:
    return {(f.kind, f.seam) for f in facts if f.drift}


def test_the_core_contract_on_vllm_0_33_v1_and_v2_is_clean():
    """vLLM 0.33.0: the cuda driver's V1 and V2 GPU runners and the xpu driver's XPU runners."""
    resolver = _resolver("vllm-0.33.0")
    for base in (V1_GPU, V2_GPU, VendorSymbol("vllm.v1.worker.xpu_model_runner", "XPUModelRunner", kind="class"),
                 VendorSymbol("vllm.v1.worker.xpu_model_runner", "XPUModelRunnerV2", kind="class")):
        facts = check_seams(_contract(), base, resolver)
        assert _drift_kinds(facts) == set(), (base.qualname, [f.to_json() for f in facts if f.drift])
    v2 = _by(check_seams(_contract(), V2_GPU, resolver))
    built = v2[("model-state", "runner builds its state with init_model_state")]  # composed with it after load
    assert built.status == "clean" and built.vendor.startswith("vllm/v1/worker/gpu/model_runner.py:")


def test_vllm_0_26_v2_state_seams_under_their_0_26_names():
    """vLLM 0.26.0's V2 runner builds its state with init_model_state (in load_model) and
    calls ``get_mm_embeddings`` where 0.32+ calls ``prepare_inputs_embeds`` (the contract's
    ``alternatives``); the core declares no capture_inner_cudagraphs / get_additional_cg_support
    (0.26 never calls them; the runner mixin's capture_model and hooks.no_full_graphs do that work)."""
    facts = check_seams(_contract(), V2_GPU, _resolver("vllm-0.26.0"))
    assert _drift_kinds(facts) == set(), [f.to_json() for f in facts if f.drift]
    by = _by(facts)
    assert by[("model-state", "prepare_inputs_embeds")].found.startswith("DefaultModelState.get_mm_embeddings(")
    assert by[("model-state", "runner calls model_state.prepare_inputs_embeds")].vendor == \
        "vllm/v1/worker/gpu/model_runner.py:1287"
    assert by[("model-state", "runner builds its state with init_model_state")].vendor == \
        "vllm/v1/worker/gpu/model_runner.py:317"


def test_vllm_ascend_0_23_v2_builds_its_own_state_but_never_calls_remove_request():
    """vllm-ascend 0.23.0.post1 on vLLM 0.23.0: vllm-ascend replaces ``init_model_state`` at module level
    (patch_model_state.py:26) to build its ``AscendModelState``: a fact, not drift, since the omni runner
    composes its state with whatever the runner built. But vLLM 0.23's V2 runner never calls
    ``model_state.remove_request`` (0.23's ModelState has none), where the omni hooks free a finished request's
    payloads: drift, so the npu driver reports ``v2_runner=False`` (omni_backends/ascend/driver.py)."""
    base = VendorSymbol("vllm_ascend.worker.v2.model_runner", "NPUModelRunner", kind="class")
    facts = check_seams(_contract(), base, _resolver("vllm-0.23.0", "vllm-ascend-0.23.0.post1"))
    by = _by(facts)
    assert by[("model-state", "runner builds its state with init_model_state")].kind == "ok"
    replaced = by[("model-state", "model_runner.init_model_state replaced")]
    assert replaced.kind == "state-replaced-composed" and replaced.status == "note"
    assert replaced.vendor.endswith("vllm_ascend/patch/worker/patch_v2/patch_model_state.py:26")
    never = {s for k, s in _drift_kinds(facts) if k == "state-override-never-called"}
    assert "runner calls model_state.remove_request" in never

    from omni_backends.ascend.driver import AscendBackend

    assert AscendBackend(load_vendor=False).capabilities().v2_runner is False


def test_vllm_ascend_v1_reaches_every_relied_on_seam():
    base = VendorSymbol("vllm_ascend.worker.model_runner_v1", "NPUModelRunner", kind="class")
    facts = check_seams(_contract(), base, _resolver("vllm-0.23.0", "vllm-ascend-0.23.0.post1"))
    assert _drift_kinds(facts) == set(), [f.to_json() for f in facts if f.drift]
    by = _by(facts)
    assert by[("call-edge", "execute_model -> _preprocess")].found.startswith("NPUModelRunner.execute_model")
    # the NPU runner calls the model only through partial(self.model, ...) inside its _model_forward
    calls = [f for f in facts if f.fact == "model-call"]
    assert [c.seam for c in calls] == ["NPUModelRunner._model_forward: partial(self.model"]


def test_check_drift_cli_on_the_npu_driver_with_its_vendor_sources(capsys):
    """The maintainer's command: bindings and seams of the npu driver, one report."""
    from omni_backends.cli import main

    paths = [_tree(n).path for n in ("vllm-0.23.0", "vllm-ascend-0.23.0.post1", "torch-npu-2.10.0.post4")]
    rc = main(["check-drift", "--driver", "npu", "--contract", "core.seams:CONTRACT", "--json"]
              + [a for p in paths for a in ("--source", p)])
    import json

    report = json.loads(capsys.readouterr().out)
    (npu,) = report["drivers"]
    assert rc == 1 and npu["drift"] == 0  # the bindings are clean; the V2 seams are not
    kinds = {f["kind"] for f in npu["seams"] if f["status"] == "drift"}
    assert "state-override-never-called" in kinds  # vLLM 0.23's runner never calls remove_request
    assert {f["runner"] for f in npu["seams"]} == {"v1", "v2", "worker"}


# ------------------------------------------------------------------ npu on V2: vllm-ascend 0.26.0rc1 on vLLM 0.26.0
ASCEND_0_26 = ("vllm-0.26.0", "vllm-ascend-0.26.0rc1", "torch-npu-2.10.0.post4")
NPU_V2 = VendorSymbol("vllm_ascend.worker.v2.model_runner", "NPUModelRunner", kind="class")


def test_vllm_ascend_0_26_v2_builds_ascend_model_state_and_vllm_0_26_calls_every_state_seam_on_it():
    """vllm-ascend 0.26.0rc1 (the newest release whose vLLM, 0.26.0, this suite already fetches) still builds
    ``AscendModelState(DefaultModelState)`` by replacing ``init_model_state`` at module level, and vLLM 0.26's V2
    runner calls add_request, remove_request, get_mm_embeddings (0.26's name for prepare_inputs_embeds),
    prepare_inputs and prepare_dummy_inputs -- from methods vllm-ascend's NPUModelRunner does not override, so the
    calls are the ones that run. Nothing drifts: the npu driver's V2 gate is True for this pair."""
    resolver = _resolver(*ASCEND_0_26)
    facts = check_seams(_contract(), NPU_V2, resolver)
    assert _drift_kinds(facts) == set(), [f.to_json() for f in facts if f.drift]
    by = _by(facts)
    replaced = by[("model-state", "model_runner.init_model_state replaced")]
    assert replaced.kind == "state-replaced-composed"
    assert replaced.vendor == "vllm_ascend/patch/worker/patch_v2/patch_model_state.py:26"
    assert "init_asecnd_model_state" in replaced.found
    calls = {name: by[("model-state", f"runner calls model_state.{name}")].vendor for name in (
        "add_request", "remove_request", "prepare_inputs_embeds", "prepare_inputs", "prepare_dummy_inputs")}
    assert calls == {
        "add_request": "vllm/v1/worker/gpu/model_runner.py:816",
        "remove_request": "vllm/v1/worker/gpu/model_runner.py:757",
        "prepare_inputs_embeds": "vllm/v1/worker/gpu/model_runner.py:1287",
        "prepare_inputs": "vllm/v1/worker/gpu/model_runner.py:1300",
        "prepare_dummy_inputs": "vllm/v1/worker/gpu/cudagraph_utils.py:479",
    }
    # the methods holding those calls are vLLM's, not overridden by vllm-ascend's runner or graph manager
    from omni_backends.drift.chain import ClassChain

    chain = ClassChain(resolver, NPU_V2.module, NPU_V2.attr)
    for method in ("load_model", "_remove_request", "add_requests", "execute_model", "capture_model", "sample_tokens"):
        assert chain.method(method).owner.qualname == "vllm.v1.worker.gpu.model_runner.GPUModelRunner", method
    graphs = ClassChain(resolver, "vllm_ascend.worker.v2.aclgraph_utils", "ModelAclGraphManager")
    assert graphs.method("capture").owner.qualname == "vllm_ascend.worker.v2.aclgraph_utils.ModelAclGraphManager"
    assert graphs.method("capture", after=graphs.leaf).owner.qualname == \
        "vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager"  # which it calls through super()
    # the state the omni hooks compose with, and the one method of it they must keep
    state = ClassChain(resolver, "vllm_ascend.worker.v2.model_states.default", "AscendModelState")
    assert [c.qualname for c in state.classes][:2] == ["vllm_ascend.worker.v2.model_states.default.AscendModelState",
                                                       "vllm.v1.worker.gpu.model_states.default.DefaultModelState"]
    assert state.method("prepare_attn").owner is state.leaf
    assert {state.method(n).owner.qualname for n in ("add_request", "prepare_inputs", "prepare_dummy_inputs")} == {
        "vllm.v1.worker.gpu.model_states.default.DefaultModelState"}


def test_npu_driver_bindings_and_v2_state_declarations_are_clean_on_vllm_ascend_0_26():
    from omni_backends.ascend import driver as ascend
    from omni_backends.registry import discover

    resolver = _resolver(*ASCEND_0_26)
    entries, _ = discover()
    report = drift.check_declarations("npu", drift.driver_declarations(entries["npu"].cls), resolver)
    assert report.drift == [], drift.render_text({
        "mode": "source", "against": resolver.describe(), "date": "", "drift": True, "drivers": [report.to_json()]})
    found = {s["symbol"]: s["vendor_at"] for s in report.to_json()["checked_symbols"]}
    assert found["ASCEND_MODEL_STATE"] == "vllm_ascend/worker/v2/model_states/default.py:32"
    assert found["ASCEND_PREPARE_ATTN"] == "vllm_ascend/worker/v2/model_states/default.py:35"
    assert found["ASCEND_INIT_MODEL_STATE"] == "vllm_ascend/worker/v2/model_states/__init__.py:26"
    assert found["ASCEND_MODEL_STATE_PATCH"] == "vllm_ascend/patch/worker/patch_v2/patch_model_state.py"
    assert ascend.ASCEND_MODEL_STATE_PATCH.qualname in {d.symbol.qualname for d in
                                                        drift.driver_declarations(entries["npu"].cls)}


@pytest.mark.parametrize("sources", [("vllm-0.23.0", "vllm-ascend-0.23.0.post1", "torch-npu-2.10.0.post4"), ASCEND_0_26],
                         ids=["vllm-ascend-0.23", "vllm-ascend-0.26"])
def test_the_npu_v2_gate_follows_from_the_static_facts_of_each_verified_stack(sources):
    """``capabilities().v2_runner`` is the stack's (omni_backends.ascend.driver.STACKS) exactly where the V2 seams of
    that stack's sources have no drift: False on 0.23 (remove_request never called), True on 0.26."""
    from omni_backends.ascend.driver import stack_of

    resolver = _resolver(*sources)
    versions = {}
    for tree in resolver.trees:
        versions.update(tree.versions)
    stack = stack_of({"vllm-ascend": versions["vllm_ascend"], "vllm": versions["vllm"], "torch": "2.10.0",
                      "torch-npu": versions["torch_npu"]})
    assert stack is not None, versions
    v2_drift = [f for f in check_seams(_contract(), NPU_V2, resolver) if f.drift]
    assert stack.v2_runner is (v2_drift == []), [f.to_json() for f in v2_drift]


def test_standin_signatures_equal_vllm_ascend_0_26_too():
    """The recording stand-ins (recorded from vllm-ascend 0.23.0.post1) have 0.26.0rc1's signatures as well, so the
    driver tests hold for both verified stacks."""
    resolver = _resolver(*ASCEND_0_26)
    for (module, attr, kind), (fn, recorded_from) in STANDINS.items():
        where, params, _ = resolver.resolve(VendorSymbol(module, attr, required=(), kind=kind))
        assert [(p.name, p.kind, p.default) for p in params] == _standin_params(fn), f"{recorded_from} vs {where}"


def test_check_drift_cli_on_the_npu_driver_with_vllm_ascend_0_26_is_clean(capsys):
    """The maintainer's command on the V2-capable stack: bindings and V1 / V2 / worker seams, no drift."""
    import json

    from omni_backends.cli import main

    rc = main(["check-drift", "--driver", "npu", "--contract", "core.seams:CONTRACT", "--json"]
              + [a for n in ASCEND_0_26 for a in ("--source", _tree(n).path)])
    (npu,) = json.loads(capsys.readouterr().out)["drivers"]
    assert rc == 0 and npu["drift"] == 0 and npu["seam_drift"] == 0
    assert {f["runner"] for f in npu["seams"]} == {"v1", "v2", "worker"}
