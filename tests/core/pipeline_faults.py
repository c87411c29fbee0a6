"""Run ``omni-backends run`` with a fault injected into stage 2 (talker); print a JSON verdict.

``python pipeline_faults.py DEMO_DIR WORK_DIR FAULT [FAULT ...]``, each FAULT one of

- ``kill``:  the talker's engine core runs in its own process (vLLM's
  multiprocess mode, for this engine only); right after it started, that
  process is killed (SIGKILL), as the kernel's OOM killer would;
- ``raise``: the talker model's forward raises once its engine is up
  (``RuntimeError``);
- ``oom``:   the same, raising ``torch.OutOfMemoryError`` as a device would.

Run ``kill`` last (it toggles vLLM's multiprocess variable). Every fault runs the pipeline through ``omni_backends.cli.main`` in this one
process (engines are per run; the driver selection is per process). The
verdict per fault: exit status, the engines started and the ones the pipeline
shut down, engine processes still alive, and what was left in ``--out``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time

import psutil
import torch

FAULT = {"on": None}


def _talker_class(demo_dir: str):
    from core.models import ARCHITECTURES

    with open(os.path.join(demo_dir, "talker", "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    module, _, name = ARCHITECTURES[arch].partition(":")
    return getattr(importlib.import_module(module), name)


def _live_children() -> list[str]:
    """Child processes still running, as "pid name cmdline" (a zombie holds nothing but its
    pid; Python's multiprocessing resource tracker lives as long as this process)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            line = f"{p.pid} {p.name()} {' '.join(p.cmdline())[:200]}"
        except psutil.Error:
            continue
        if "resource_tracker" not in line:
            out.append(line)
    return out


def main() -> None:
    demo_dir, work, faults = sys.argv[1], sys.argv[2], sys.argv[3:]
    import core.pipeline.release as release  # StageEngines.release -> release_engine -> its shutdown_engine
    import core.stage as stage
    from omni_backends.cli import main as cli

    talker_cls = _talker_class(demo_dir)
    forward = talker_cls.forward

    def faulty_forward(self, *args, **kwargs):
        if FAULT["on"] == "raise":
            raise RuntimeError("injected fault in the talker's forward")
        if FAULT["on"] == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return forward(self, *args, **kwargs)

    talker_cls.forward = faulty_forward

    started: list[tuple[str, int]] = []
    engine_pids: list[int] = []
    released: list[int] = []
    make_engine = stage.make_engine
    shutdown_engine = release.shutdown_engine
    current = {"fault": None}

    def make_engine_then_fault(model, **kw):
        which = os.path.basename(model)
        if which == "talker" and current["fault"] == "kill":  # this one engine in its own process
            import vllm.envs

            vllm.envs.disable_envs_cache()  # the in-process thinker's EngineCore cached the variables
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
            try:
                llm = make_engine(model, **kw)
            finally:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
                vllm.envs.disable_envs_cache()
        else:
            llm = make_engine(model, **kw)
        started.append((which, id(llm)))
        manager = getattr(getattr(llm.llm_engine.engine_core, "resources", None), "engine_manager", None)
        engine_pids.extend(p.pid for p in getattr(manager, "processes", ()))
        if which == "talker":
            if current["fault"] == "kill":
                (proc,) = manager.processes
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(30)
            else:
                FAULT["on"] = current["fault"]
        return llm

    def recording_shutdown(llm):
        released.append(id(llm))
        shutdown_engine(llm)

    stage.make_engine = make_engine_then_fault
    release.shutdown_engine = recording_shutdown

    verdict = {}
    for fault in faults:
        started.clear(), released.clear(), engine_pids.clear()
        current["fault"], FAULT["on"] = fault, None
        out = os.path.join(work, f"out-{fault}")
        args = ["run", "--model-dir", demo_dir, "--out", out, "--max-tokens", "2", "--prompt", "Hello omni"]
        print(f"=== fault {fault}", file=sys.stderr, flush=True)
        rc = cli(args)
        deadline = time.time() + 30
        while time.time() < deadline and _live_children():
            time.sleep(0.5)
        verdict[fault] = {
            "rc": rc,
            "started": [s for s, _ in started],
            "unreleased": [s for s, i in started if i not in released],
            "children": _live_children(),
            "engine_pids_alive": [pid for pid in engine_pids if psutil.pid_exists(pid)
                                  and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE],
            "out_exists": os.path.exists(out),
            "leftovers": sorted(n for n in os.listdir(work) if n.startswith(".omni-run-")),
        }
    print(json.dumps(verdict))


if __name__ == "__main__":
    main()
