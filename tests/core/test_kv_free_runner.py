"""A pipeline with a stage whose model has no KV cache (Qwen3-TTS's code2wav) on a vLLM whose V2 runner cannot run
one (vLLM 0.26, the H200 stack): left to vLLM the runner becomes V1 for every stage; ``--runner v2`` is refused
before any engine starts. On the H200 (2026-12-05) ``run --model`` on a 1.7B checkpoint with vLLM's defaults failed
with ``KVFreeModelUnsupportedError`` once the engines were up.

The rule is core logic over a driver's declared capabilities: a fake driver offering V2 here (the cpu driver offers
none), and the answer of ``v2_runs_models_without_kv_cache`` given both ways (the installed vLLM answers one; the
H200 run under ``ci/gpu/run.sh serve-qwen3`` shows the real one of vLLM 0.26)."""

from __future__ import annotations

import pytest

from core.pipeline.config import GraphConfig
from core.pipeline.declarations import declaration
from core.pipeline.graph.engines import prepare_environment
from omni_backends.errors import BadInputError
from tests.core.test_pipeline_options import FakeBackend

DEMO, QWEN3_TTS = declaration("demo"), declaration("qwen3_tts")


@pytest.fixture()
def env(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    return monkeypatch


def _v2_runs_kv_free(monkeypatch, answer: bool) -> None:
    import core.runner.v2

    monkeypatch.setattr(core.runner.v2, "v2_runs_models_without_kv_cache", lambda: answer)


def test_qwen3_tts_declares_its_code2wav_stage_kv_free_and_the_demo_none():
    assert [s.name for s in QWEN3_TTS.stages if not s.kv_cache] == ["code2wav"]
    assert all(s.kv_cache for s in DEMO.stages)


def test_left_to_vllm_the_runner_becomes_v1_for_every_stage_where_v2_cannot_run_the_kv_free_stage(env):
    import os

    _v2_runs_kv_free(env, False)
    cfg = prepare_environment(GraphConfig(device="gpu"), FakeBackend(), QWEN3_TTS)
    assert cfg.runner == "v1" and os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_asking_for_v2_there_is_one_error_naming_the_stage_and_the_fix(env, how):
    _v2_runs_kv_free(env, False)
    if how == "variable":
        env.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    cfg = GraphConfig(device="gpu", runner="v2" if how == "flag" else "auto")
    with pytest.raises(BadInputError) as e:
        prepare_environment(cfg, FakeBackend(), QWEN3_TTS)
    msg = str(e.value)
    assert "code2wav" in msg and "--runner v1" in msg and "0.32" in msg
    assert ("--runner v2" if how == "flag" else "VLLM_USE_V2_MODEL_RUNNER=1") in msg


@pytest.mark.parametrize("spec, answer", [(QWEN3_TTS, True), (DEMO, False), (None, False)])
def test_otherwise_the_runner_stays_vllms_choice(env, spec, answer):
    import os

    _v2_runs_kv_free(env, answer)
    cfg = prepare_environment(GraphConfig(device="gpu"), FakeBackend(), spec)
    assert cfg.runner == "auto" and "VLLM_USE_V2_MODEL_RUNNER" not in os.environ


def test_a_driver_without_v2_is_not_asked(env):
    import os

    def never():
        raise AssertionError("asked vLLM about V2 for a driver without V2")

    import core.runner.v2

    env.setattr(core.runner.v2, "v2_runs_models_without_kv_cache", never)
    cfg = prepare_environment(GraphConfig(device="gpu"), FakeBackend(v2_runner=False), QWEN3_TTS)
    assert cfg.runner == "auto" and "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
