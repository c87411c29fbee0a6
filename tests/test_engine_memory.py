"""Every engine this project starts is sized for its model (``omni_backends.engine_memory``), the conformance
kit's engine check included: at vLLM's default ``gpu_memory_utilization`` (0.9 of the card) the kit's engine
left the H200 with 1.9 GiB free, and engines starting beside it failed in ``cublasCreate`` (issue 21)."""

from __future__ import annotations

import pytest

from core.models.create import create_demo_models
from omni_backends.testing import engine_check


class _Stop(Exception):
    pass


def test_the_kit_engine_check_sizes_its_engine_for_the_model(tmp_path, monkeypatch):
    create_demo_models(str(tmp_path / "demo"))
    seen = {}

    def fake_llm(model, **kw):
        seen.update(kw)
        raise _Stop

    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(vllm, "LLM", fake_llm)
    for side in ("stock", "omni"):
        seen.clear()
        with pytest.raises(_Stop):
            engine_check.run("cpu", str(tmp_path / "demo" / "thinker"), side, engine_check.OMNI_WORKER_CLS,
                             engine_check.OMNI_SCHEDULER_CLS)
        assert seen["kv_cache_memory_bytes"] >= 64 << 20, seen
        assert 0 < seen["gpu_memory_utilization"] < 0.5, seen
