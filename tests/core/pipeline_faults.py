"""Run ``omni-backends run`` with a fault injected into stage 2 (talker); print a JSON verdict.

``python pipeline_faults.py DEMO_DIR WORK_DIR FAULT [FAULT ...]``, each FAULT one of

- ``kill``:  right after the talker's engine started (its ``AsyncLLM`` engine
  core is a process of its own), that process is killed (SIGKILL), as the
  kernel's OOM killer would;
- ``raise``: the talker model's forward raises on a real request
  (``RuntimeError``), in the talker's engine-core process;
- ``oom``:   the same, raising ``torch.OutOfMemoryError`` as a device would.

The stage graph's engine cores are processes vLLM starts with ``spawn``; a spawned child imports this file as
``__mp_main__`` before it runs the engine, so the model fault is installed there, at import, from
``OMNI_TEST_FAULT`` (set per run). Every fault runs the pipeline through ``omni_backends.cli.main`` in this one
process (the driver selection is per process). The verdict per fault: exit status, the engines started and the
ones the pipeline shut down, engine processes still alive, and what was left in ``--out``.
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


def _talker_class(demo_dir: str):
    from core.models import ARCHITECTURES

    with open(os.path.join(demo_dir, "talker", "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    module, _, name = ARCHITECTURES[arch].partition(":")
    return getattr(importlib.import_module(module), name)


def _install_model_fault(fault: str, demo_dir: str) -> None:
    """The talker model's forward raises on every real request (dummy / profile runs pass no request state)."""
    talker_cls = _talker_class(demo_dir)
    forward = talker_cls.forward

    def faulty_forward(self, *args, **kwargs):
        if kwargs.get("model_intermediate_buffer"):
            if fault == "raise":
                raise RuntimeError("injected fault in the talker's forward")
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return forward(self, *args, **kwargs)

    talker_cls.forward = faulty_forward


if __name__ == "__mp_main__" and os.environ.get("OMNI_TEST_FAULT") in ("raise", "oom"):  # an engine-core process
    _install_model_fault(os.environ["OMNI_TEST_FAULT"], os.environ["OMNI_TEST_FAULT_DEMO"])


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
    demo_dir, work, *faults = sys.argv[1:]
    import core.pipeline.release as release  # the graph's release -> release_engine -> its shutdown_engine
    import core.stage as stage
    from core.pipeline.release import engine_core_processes
    from omni_backends.cli import main as cli

    started: list[tuple[str, int]] = []
    engine_pids: list[int] = []
    released: list[int] = []
    make_async_engine = stage.make_async_engine
    shutdown_engine = release.shutdown_engine
    current = {"fault": None}

    def make_engine_then_fault(model, **kw):
        which = os.path.basename(model)
        engine = make_async_engine(model, **kw)
        started.append((which, id(engine)))
        procs = engine_core_processes(engine)
        engine_pids.extend(p.pid for p in procs)
        if which == "talker" and current["fault"] == "kill":
            (proc,) = procs
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)
        return engine

    def recording_shutdown(engine):
        released.append(id(engine))
        shutdown_engine(engine)

    stage.make_async_engine = make_engine_then_fault
    release.shutdown_engine = recording_shutdown
    os.environ["OMNI_TEST_FAULT_DEMO"] = demo_dir

    verdict = {}
    for fault in faults:
        started.clear(), released.clear(), engine_pids.clear()
        current["fault"] = fault
        os.environ["OMNI_TEST_FAULT"] = fault  # read by the engine-core processes this run spawns
        out = os.path.join(work, f"out-{fault}")
        args = ["run", "--model-dir", demo_dir, "--out", out, "--max-tokens", "2", "--prompt", "Hello omni"]
        print(f"=== fault {fault}", file=sys.stderr, flush=True)
        rc = cli(args)
        deadline = time.time() + 30
        while time.time() < deadline and _live_children():
            time.sleep(0.5)
        verdict[fault] = {
            "rc": rc,
            "started": sorted(s for s, _ in started),
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
