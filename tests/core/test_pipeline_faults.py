"""Issue 17, class 5: a pipeline stage that fails mid-run leaves nothing half-done.

Faults are injected into stage 2 (talker) of real runs on the cpu driver
(``tests/core/pipeline_faults.py``, one process for all three so the engine
starts are paid once per fault, not per test): its engine-core process killed,
its model raising in forward, its model running out of device memory. Each
must release every engine of the stage graph (the three start at once), write
nothing, and exit 3 with one line naming the stage and the cause. A model
error in a vLLM ``AsyncLLM`` engine core is fatal to that engine core (vLLM
logs the model's own error, the client gets ``EngineDeadError``): the line says
the talker's engine died, the log above it has the model's error. The graph's
start failure is also tested without engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from core.pipeline.faults import failure_cause
from omni_backends.errors import BadInputError, StageFailedError

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTS = ("raise", "oom", "kill")


@pytest.fixture(scope="module")
def faulted(demo_dir, tmp_path_factory):
    from tests.core.conftest import _need_vllm

    _need_vllm("cpu")  # the faults are injected into cpu runs (pipeline_faults.py)
    work = tmp_path_factory.mktemp("faults")
    env = dict(os.environ)
    env.pop("OMNI_BACKENDS_SELECTION", None)
    env["OMNI_BACKENDS_DEVICE"] = "cpu"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "pipeline_faults.py"), demo_dir, str(work), *FAULTS],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    # each fault's stderr: from its "=== fault" marker to the next
    parts = proc.stderr.split("=== fault ")[1:]
    stderr = {p.split("\n", 1)[0].strip(): p for p in parts}
    return verdict, stderr, work


CAUSES = {  # the talker's engine core died; killed: its process and the signal
    "raise": "stage talker failed while running: its engine",
    "oom": "stage talker failed while running: its engine",
    "kill": "stage talker failed while running: its engine process",
}
#: what the talker's engine core logged (vLLM's "EngineCore encountered a fatal error" with the model's error)
ENGINE_LOG = {"raise": "injected fault in the talker's forward", "oom": "CUDA out of memory. Tried to allocate"}


@pytest.mark.engine_tier
@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_stage_two_failure_releases_engines_writes_nothing_and_says_why(faulted, fault):
    verdict, stderr, work = faulted
    v = verdict[fault]
    assert v["rc"] == 3  # README: a run failed after its engines started
    assert v["started"] == ["code2wav", "talker", "thinker"]  # the stage graph starts all three at once
    assert v["unreleased"] == [], "engines left running: %s" % v["unreleased"]
    assert v["engine_pids_alive"] == [] and v["children"] == [], v
    assert not v["out_exists"] and v["leftovers"] == []
    errors = [line for line in stderr[fault].splitlines() if line.startswith("omni-backends: error:")]
    assert len(errors) == 1, stderr[fault][-3000:]
    assert CAUSES[fault] in errors[0] and errors[0].endswith("No output was written."), errors[0]
    assert "the stage graph is dead" in errors[0], errors[0]
    if fault == "kill":
        assert "was killed by signal SIGKILL" in errors[0]
    else:
        assert ENGINE_LOG[fault] in stderr[fault]
    assert "done:" not in stderr[fault]


# ------------------------------------------------------------- without engines
class _FakeEngine:
    """Stands in for an ``AsyncLLM`` at start: what ``engine_config`` reads; records ``shutdown()``."""

    def __init__(self, log: list[str], name: str) -> None:
        ns = types.SimpleNamespace
        self.vllm_config = ns(compilation_config=ns(mode="NONE", cudagraph_mode="NONE"),
                              model_config=ns(enforce_eager=True, dtype="float32"),
                              scheduler_config=ns(async_scheduling=False),
                              cache_config=ns(kv_cache_memory_bytes=1, gpu_memory_utilization=0.1))
        self.shutdown = lambda: log.append(name)


def test_a_stage_whose_engine_fails_to_start_is_named_and_every_started_engine_is_released(
        demo_dir, cpu_selected, monkeypatch):
    import asyncio

    import core.stage
    from core.pipeline.config import GraphConfig
    from core.pipeline.graph import StageGraph

    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_V2_MODEL_RUNNER"):  # start sets them: restored after
        monkeypatch.delenv(var, raising=False)
    log: list[str] = []

    def factory(model, **kw):
        name = os.path.basename(model)
        if name == "code2wav":
            raise ValueError("no room")
        return _FakeEngine(log, name)

    monkeypatch.setattr(core.stage, "make_async_engine", factory)
    with pytest.raises(StageFailedError) as info:
        asyncio.run(StageGraph.start(GraphConfig(model_dir=demo_dir, device="cpu"), cpu_selected))
    assert sorted(log) == ["talker", "thinker"]  # both started engines shut down
    assert info.value.stage == "code2wav"
    assert str(info.value) == ("stage code2wav failed while starting its engine: the engine raised ValueError: "
                               "no room. No output was written.")


def test_failure_cause_reads_out_of_memory_anywhere_in_the_chain():
    try:
        try:
            raise MemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        except MemoryError as exc:
            raise RuntimeError("EngineCore encountered an issue") from exc
    except RuntimeError as outer:
        assert failure_cause(outer, None).startswith("the device ran out of memory (MemoryError: CUDA out of memory")
    assert failure_cause(BadInputError("x"), None) == "the engine raised BadInputError: x"


@pytest.mark.parametrize("message", [
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "Free memory on device cuda:0 (1.94/139.8 GiB) on startup is less than desired GPU memory utilization",
])
def test_an_engine_start_on_a_full_device_is_named_as_device_memory(message):
    try:
        try:
            raise RuntimeError(message)
        except RuntimeError as exc:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from exc
    except RuntimeError as outer:
        cause = failure_cause(outer, None)
    assert cause.startswith("the device ran out of memory (RuntimeError: ") and "other processes" in cause, cause
