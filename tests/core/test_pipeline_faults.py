"""Issue 17, class 5: a pipeline stage that fails mid-run leaves nothing half-done.

Faults are injected into stage 2 (talker) of real runs on the cpu driver
(``tests/core/pipeline_faults.py``, one process for all three so the engine
starts are paid once per fault, not per test): its engine-core process killed,
its model raising in forward, its model running out of device memory. Each
must release every engine already started, write nothing, and exit 3 with one
line naming the stage and the cause. The stage bookkeeping itself is also
tested without engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from core.pipeline.faults import failure_cause
from core.pipeline.stages import StageEngines
from omni_backends.errors import BadInputError, StageFailedError

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTS = ("raise", "oom", "kill")  # kill last: it switches vLLM to multiprocess for one engine


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


CAUSES = {
    "raise": "stage talker failed while running: the engine raised RuntimeError: injected fault in the talker's forward",
    "oom": "stage talker failed while running: the device ran out of memory (OutOfMemoryError: CUDA out of memory",
    "kill": "stage talker failed while running: its engine process",
}


@pytest.mark.engine_tier
@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_stage_two_failure_releases_engines_writes_nothing_and_says_why(faulted, fault):
    verdict, stderr, work = faulted
    v = verdict[fault]
    assert v["rc"] == 3  # README: a run failed after its engines started
    assert v["started"] == ["thinker", "talker"]
    assert v["unreleased"] == [], "engines left running: %s" % v["unreleased"]
    assert v["engine_pids_alive"] == [] and v["children"] == [], v
    assert not v["out_exists"] and v["leftovers"] == []
    errors = [line for line in stderr[fault].splitlines() if line.startswith("omni-backends: error:")]
    assert len(errors) == 1, stderr[fault][-3000:]
    assert CAUSES[fault] in errors[0] and errors[0].endswith("No output was written."), errors[0]
    if fault == "kill":
        assert "was killed by signal SIGKILL" in errors[0]
    assert "[3/3]" not in stderr[fault]  # code2wav never started


# ------------------------------------------------------------- without engines
class _FakeLLM:
    """Stands in for ``vllm.LLM``: records ``llm_engine.engine_core.shutdown()``."""

    def __init__(self, log: list[str], name: str) -> None:
        core = types.SimpleNamespace(shutdown=lambda: log.append(name))
        self.llm_engine = types.SimpleNamespace(engine_core=core)


def test_a_failing_stage_releases_every_started_engine_and_names_the_stage():
    log: list[str] = []
    stages = StageEngines()
    with pytest.raises(StageFailedError) as info:
        with stages.stage("thinker"):
            stages.start("thinker", lambda: _FakeLLM(log, "thinker"))
        with stages.stage("talker"):
            stages.start("talker", lambda: _FakeLLM(log, "talker"))
            raise RuntimeError("boom in forward")
    assert log == ["thinker", "talker"] and stages.engines == {}
    assert info.value.stage == "talker"
    assert str(info.value) == ("stage talker failed while running: the engine raised RuntimeError: boom in forward. "
                               "No output was written.")


def test_a_stage_whose_engine_fails_to_start_says_so_and_interrupts_pass_through():
    log: list[str] = []
    stages = StageEngines()
    stages.start("thinker", lambda: _FakeLLM(log, "thinker"))
    with pytest.raises(StageFailedError, match="stage code2wav failed while starting its engine: the engine raised "
                                               "ValueError: no room"):
        with stages.stage("code2wav"):
            stages.start("code2wav", lambda: (_ for _ in ()).throw(ValueError("no room")))
    assert log == ["thinker"]
    stages.start("talker", lambda: _FakeLLM(log, "talker"))
    with pytest.raises(KeyboardInterrupt):
        with stages.stage("talker"):
            raise KeyboardInterrupt
    assert log == ["thinker", "talker"] and stages.engines == {}


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
