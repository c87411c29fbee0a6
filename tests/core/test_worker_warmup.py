"""The omni worker's warm-up on a model without a KV cache (core.worker.kv_free_kernel_warmup).

On the H200 (vLLM 0.26.0, V2, 2026-12-02) vLLM-Omni's Qwen3TTSCode2Wav -- no attention layer, so no KV cache
group -- failed engine start in vLLM's ``warmup_kernels``: ``ZeroDivisionError`` dividing the KV blocks by the
blocks per request (0). The stand-in below raises what vLLM 0.26's does for such a runner (before any forward);
the H200 run shows the real one (ci/logs).
"""

from __future__ import annotations

import types

import pytest

from core.seams import V2_KERNEL_WARMUP
from core.worker import kv_free_kernel_warmup


def _runner(groups):
    return types.SimpleNamespace(kv_cache_config=types.SimpleNamespace(kv_cache_groups=groups, num_blocks=1))


def _vllm_026_like_warmup(model_runner, worker_execute_model, worker_sample_tokens):
    blocks_per_req = len(model_runner.kv_cache_config.kv_cache_groups)  # sum of per-group counts: 0 without one
    n = (model_runner.kv_cache_config.num_blocks - 1) // blocks_per_req
    worker_execute_model(n)
    return "warmed"


def test_the_seam_is_what_vllms_gpu_worker_calls():
    import vllm.v1.worker.gpu_worker as gw

    assert V2_KERNEL_WARMUP.module == gw.__name__ and callable(getattr(gw, V2_KERNEL_WARMUP.attr))


def test_a_runner_without_kv_cache_skips_the_warmup_that_cannot_size_it_and_the_module_is_restored():
    module = types.SimpleNamespace(warmup_kernels=_vllm_026_like_warmup)
    calls = []
    with kv_free_kernel_warmup(module):
        assert module.warmup_kernels(_runner([]), calls.append, None) is None
    assert module.warmup_kernels is _vllm_026_like_warmup and calls == []
    with pytest.raises(ZeroDivisionError):  # outside the context: vLLM's own behaviour
        module.warmup_kernels(_runner([]), calls.append, None)


def test_a_runner_with_a_kv_cache_warms_up_unchanged_and_its_errors_propagate():
    module = types.SimpleNamespace(warmup_kernels=_vllm_026_like_warmup)
    calls = []
    with kv_free_kernel_warmup(module):
        assert module.warmup_kernels(_runner(["attn"]), calls.append, None) == "warmed"
    assert calls == [0]

    def broken(model_runner, *a):
        raise ZeroDivisionError("a real fault")

    module = types.SimpleNamespace(warmup_kernels=broken)
    with kv_free_kernel_warmup(module), pytest.raises(ZeroDivisionError, match="a real fault"):
        module.warmup_kernels(_runner(["attn"]), None, None)


def test_a_worker_module_without_the_seam_is_left_alone():
    module = types.SimpleNamespace()
    with kv_free_kernel_warmup(module):
        assert not hasattr(module, "warmup_kernels")
    with kv_free_kernel_warmup(None):
        pass
