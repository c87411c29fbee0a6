"""The main job's device defaults (``core.pipeline``), per-stage memory sizing and the engine factory's
engine-choice checks (``core.stage``), without starting an engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.pipeline import RunConfig, device_defaults, engine_kw
from core.pipeline.spec import ChunkWindow, PipelineModel
from core.stage import EngineChoices, check_engine_choices
from omni_backends.engine_memory import STAGE_HEADROOM_BYTES, engine_memory_kw
from omni_backends.backend import Capabilities
from omni_backends.errors import BadInputError

GiB = 1 << 30


class FakeBackend:
    """Just what the pipeline reads from a driver: name, device type, capabilities, memory."""

    def __init__(self, name="gpu", device_type="cuda", free=130 * GiB, total=140 * GiB, **caps):
        self.name, self.device_type, self._mem = name, device_type, (free, total)
        self._caps = Capabilities(**{"static_graph_modes": ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE"),
                                     "v1_runner": True, "v2_runner": True, **caps})

    def capabilities(self):
        return self._caps

    def memory_info(self):
        return self._mem


@pytest.fixture()
def model_dir(tmp_path):
    d = tmp_path / "thinker"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                               "num_key_value_heads": 2, "hidden_size": 128, "head_dim": 32}))
    return str(d)


def test_a_gpu_stage_gets_a_kv_cache_sized_for_its_model_not_for_the_card(model_dir):
    kw = engine_memory_kw(FakeBackend(), model_dir, max_model_len=512, max_num_seqs=8, dtype="float32")
    per_token = 2 * 2 * 2 * 32 * 4  # K and V, 2 layers, 2 kv heads, head_dim 32, fp32
    assert kw["kv_cache_memory_bytes"] == max(64 << 20, 2 * per_token * 512 * 8)
    assert kw["kv_cache_memory_bytes"] % (1 << 20) == 0
    # vLLM checks utilization x total is free at start: just the KV cache plus the headroom, ~1.5 % of 140 GiB
    assert 0.014 < kw["gpu_memory_utilization"] < 0.02
    assert kw["gpu_memory_utilization"] * 140 * GiB >= kw["kv_cache_memory_bytes"] + STAGE_HEADROOM_BYTES
    # three stages fit on one card with room to spare
    assert 3 * kw["gpu_memory_utilization"] < 0.1


def test_a_long_context_scales_the_kv_cache(model_dir):
    small = engine_memory_kw(FakeBackend(), model_dir, max_model_len=512, max_num_seqs=8)
    big = engine_memory_kw(FakeBackend(), model_dir, max_model_len=32768, max_num_seqs=64)
    assert big["kv_cache_memory_bytes"] == 2 * (2 * 2 * 2 * 32 * 4) * 32768 * 64 > small["kv_cache_memory_bytes"]


def test_a_full_device_is_refused_before_the_engine_starts(model_dir):
    with pytest.raises(BadInputError, match=r"thinker stage needs about 2\.\d\d GiB of gpu device memory but only "
                                            r"1\.00 GiB of 140\.00 GiB is free; free the device"):
        engine_memory_kw(FakeBackend(free=1 * GiB), model_dir, max_model_len=512, max_num_seqs=8)


def _platform_graphs(monkeypatch, supported: bool) -> None:
    """vLLM's resolved platform says it does (not) run static graphs (``support_static_graph_mode``)."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "support_static_graph_mode", classmethod(lambda cls: supported))


def test_device_defaults_eager_in_process_on_cpu_vllm_defaults_elsewhere(monkeypatch):
    cpu = device_defaults(RunConfig(), FakeBackend("cpu", "cpu", static_graph_modes=()))
    assert (cpu.enforce_eager, cpu.multiprocess) == (True, False)
    _platform_graphs(monkeypatch, True)
    gpu = device_defaults(RunConfig(), FakeBackend())
    assert (gpu.enforce_eager, gpu.multiprocess) == (False, True)
    assert "enforce_eager" not in engine_kw(gpu) and "compilation_config" not in engine_kw(gpu)
    forced = device_defaults(RunConfig(enforce_eager=True, multiprocess=False), FakeBackend())
    assert (forced.enforce_eager, forced.multiprocess) == (True, False) and engine_kw(forced)["enforce_eager"]
    graphs = device_defaults(RunConfig(graph_mode="piecewise"), FakeBackend())
    assert engine_kw(graphs)["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}
    assert "dtype" not in engine_kw(gpu)  # a stage's dtype is its declaration's: the demo's fp32 on every stage
    from core.pipeline.declarations.demo import DEMO

    model = PipelineModel(model_dir="/demo", sample_rate=16000, samples_per_frame=160, voices=[],
                          window=ChunkWindow(16, 16))
    assert {s.engine_args(model, gpu)["dtype"] for s in DEMO.stages} == {"float32"}


def test_declared_graphs_on_a_platform_without_graphs_stay_eager_in_process(monkeypatch):
    """A driver declaring static graphs over a vLLM platform that runs none (simdev: FULL declared, vLLM's cpu
    platform) gets what vLLM resolves -- no graphs -- so run/serve stay eager and in-process instead of paying
    for compilation and a multiprocess engine that capture nothing."""
    from omni_backends.vllm_upstream import engine_static_graph_modes

    _platform_graphs(monkeypatch, False)
    declared = FakeBackend("simdev", "cpu", static_graph_modes=("FULL",))
    assert engine_static_graph_modes(declared) == ()
    cfg = device_defaults(RunConfig(), declared)
    assert (cfg.enforce_eager, cfg.multiprocess) == (True, False)
    _platform_graphs(monkeypatch, True)
    assert engine_static_graph_modes(declared) == ("FULL",)


def test_runner_the_driver_cannot_run_names_the_fix():
    cpu = FakeBackend("cpu", "cpu", static_graph_modes=(), v2_runner=False)
    with pytest.raises(BadInputError, match=r"--runner asks for vLLM's V2 model runner but the cpu driver cannot run "
                                            r"it .*use --runner v1 or unset VLLM_USE_V2_MODEL_RUNNER"):
        check_engine_choices(RunConfig(runner="v2"), cpu, env={})
    with pytest.raises(BadInputError, match=r"VLLM_USE_V2_MODEL_RUNNER=1 asks for vLLM's V2 model runner"):
        check_engine_choices(RunConfig(), cpu, env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    with pytest.raises(BadInputError, match=r"VLLM_USE_V2_MODEL_RUNNER='maybe' is not 0 or 1"):
        check_engine_choices(RunConfig(), cpu, env={"VLLM_USE_V2_MODEL_RUNNER": "maybe"})
    assert check_engine_choices(RunConfig(), cpu, env={"VLLM_USE_V2_MODEL_RUNNER": "0"}) == "v1"
    assert check_engine_choices(RunConfig(runner="v1"), cpu, env={"VLLM_USE_V2_MODEL_RUNNER": "1"}) == "v1"
    assert check_engine_choices(RunConfig(), FakeBackend(), env={}) == "auto"
    assert check_engine_choices(RunConfig(runner="v2"), FakeBackend(), env={}) == "v2"
    with pytest.raises(BadInputError, match=r"V1 model runner but the npu driver cannot run it"):
        check_engine_choices(RunConfig(runner="v1"), FakeBackend("npu", "npu", v1_runner=False), env={})


def test_graph_mode_the_driver_cannot_capture_names_the_fix():
    cpu = FakeBackend("cpu", "cpu", static_graph_modes=(), v2_runner=False)
    with pytest.raises(BadInputError, match=r"--graph-mode FULL is not supported by the cpu driver \(it captures no "
                                            r"graphs\); drop --graph-mode or use NONE"):
        check_engine_choices(RunConfig(graph_mode="full"), cpu, env={})
    check_engine_choices(RunConfig(graph_mode="NONE"), cpu, env={})
    partial = FakeBackend(static_graph_modes=("PIECEWISE",))
    with pytest.raises(BadInputError, match=r"FULL_AND_PIECEWISE is not supported by the gpu driver \(it captures "
                                            r"PIECEWISE\); use one of PIECEWISE or NONE"):
        check_engine_choices(RunConfig(graph_mode="FULL_AND_PIECEWISE"), partial, env={})
    with pytest.raises(BadInputError, match=r"graph_mode \(--graph-mode\) must be one of NONE, PIECEWISE"):
        check_engine_choices(RunConfig(graph_mode="sometimes"), partial, env={})
    with pytest.raises(BadInputError, match=r"needs graphs but enforce_eager \(--enforce-eager\) turns them off"):
        check_engine_choices(RunConfig(graph_mode="PIECEWISE", enforce_eager=True), partial, env={})


def test_the_engine_factory_checks_engine_choices_of_its_own():
    """``make_engine``'s choices (:class:`EngineChoices`) and the demo app's ``RunConfig`` meet the same checks."""
    cpu = FakeBackend("cpu", "cpu", static_graph_modes=(), v2_runner=False)
    source = "compilation_config cudagraph_mode"
    assert check_engine_choices(EngineChoices(), cpu, env={}) == "auto"
    assert check_engine_choices(EngineChoices(graph_mode="NONE", enforce_eager=True), cpu, env={}) == "auto"
    with pytest.raises(BadInputError, match=r"^compilation_config cudagraph_mode FULL is not supported by the cpu "
                                            r"driver \(it captures no graphs\); drop compilation_config"):
        check_engine_choices(EngineChoices(graph_mode="full"), cpu, env={}, graph_source=source)
    with pytest.raises(BadInputError, match=r"^compilation_config cudagraph_mode must be one of NONE, PIECEWISE"):
        check_engine_choices(EngineChoices(graph_mode="sometimes"), FakeBackend(), env={}, graph_source=source)
    with pytest.raises(BadInputError, match=r"^--runner must be one of auto, v1, v2, got 'v3'"):
        check_engine_choices(EngineChoices(runner="v3"), FakeBackend(), env={})


@pytest.mark.parametrize("args,expect", [
    (["--runner", "v2"], "--runner asks for vLLM's V2 model runner but the cpu driver cannot run it"),
    (["--graph-mode", "FULL"], "--graph-mode FULL is not supported by the cpu driver"),
])
def test_cli_refuses_engine_choices_before_any_engine_starts(tmp_path, args, expect):
    from omni_backends.cpu.driver import CpuBackend

    if not CpuBackend.probe().usable:
        pytest.skip(f"needs the cpu driver: {CpuBackend.probe().reason}")
    env = {k: v for k, v in os.environ.items() if k not in ("OMNI_BACKENDS_DEVICE", "OMNI_BACKENDS_SELECTION")}
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "omni_backends.cli", "run", "--device", "cpu", "--out", str(out),
                        "--model-dir", str(tmp_path / "models"), *args],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("omni-backends: error:")]
    assert len(errors) == 1 and expect in errors[0], p.stderr[-2000:]
    assert not out.exists() and not (tmp_path / "models").exists(), "nothing may be created before the refusal"


def test_make_engine_refuses_a_runner_or_graph_mode_the_driver_cannot_run_before_vllm_starts(tmp_path):
    from omni_backends.cpu.driver import CpuBackend

    if not CpuBackend.probe().usable:
        pytest.skip(f"needs the cpu driver: {CpuBackend.probe().reason}")
    code = (
        "import sys\n"
        "from omni_backends.errors import BadInputError\n"
        "from core.stage import make_engine\n"
        "for kw in ({}, {'compilation_config': {'cudagraph_mode': 'FULL'}}):\n"
        "    try:\n"
        "        make_engine('/nonexistent-model', device='cpu', **kw)\n"
        "    except BadInputError as e:\n"
        "        print('ERR', e)\n"
        "print('DONE')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMNI_BACKENDS_DEVICE", "OMNI_BACKENDS_SELECTION")}
    env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    # the model path does not exist: had vLLM's LLM() been reached, it would raise something else and crash the loop
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    errors = [line for line in p.stdout.splitlines() if line.startswith("ERR")]
    assert p.returncode == 0 and "DONE" in p.stdout and len(errors) == 2, p.stdout + p.stderr[-2000:]
    assert all("VLLM_USE_V2_MODEL_RUNNER=1 asks for vLLM's V2 model runner but the cpu driver cannot run it" in e
               for e in errors)
    env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode != 0, "with a runner the driver can run, the first call reaches vLLM (no model there)"
    env.pop("VLLM_USE_V2_MODEL_RUNNER")
    code_modes = code.replace("for kw in ({}, {'compilation_config': {'cudagraph_mode': 'FULL'}}):",
                              "for kw in ({'compilation_config': {'cudagraph_mode': 'FULL'}},"
                              " {'compilation_config': {'cudagraph_mode': 'sometimes'}}):")
    p = subprocess.run([sys.executable, "-c", code_modes], capture_output=True, text=True, env=env, timeout=120)
    full, unknown = [line for line in p.stdout.splitlines() if line.startswith("ERR")]
    assert "compilation_config cudagraph_mode FULL is not supported by the cpu driver (it captures no graphs)" in full
    # an unknown mode is named as the argument make_engine was given, not as the demo app's --graph-mode flag
    assert "ERR compilation_config cudagraph_mode must be one of NONE, PIECEWISE, FULL" in unknown, unknown
    assert "--graph-mode" not in unknown, unknown
