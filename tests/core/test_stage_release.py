"""A stage's engine is released only when its engine processes have exited (``release_engine``, what the stage
graph's shutdown and a failed start use), so the next graph (or the next run) starts on a settled device.

vLLM's ``CoreEngineProcManager.shutdown`` terminates, waits 5 s, then SIGKILLs the tree and returns without
waiting; the next engine then started on a device still held by the dying one (issue 21: one main-job run in
three failed on the H200 with ``CUBLAS_STATUS_INTERNAL_ERROR`` at the talker's start). Here the engine is a
real process that takes a while to exit after SIGTERM and has a child of its own, and ``shutdown()`` behaves
like vLLM's (signals, does not wait)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from types import SimpleNamespace

import psutil

from core.pipeline.graph import release_all
from core.pipeline.release import wait_engine_released


def _slow_engine(ready) -> None:  # pragma: no cover - runs in the child
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,), daemon=False)
    child.start()
    ready.put(child.pid)

    def on_term(*_):
        time.sleep(1.5)  # tearing down (device context, compile workers)
        os.kill(child.pid, signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    time.sleep(60)


def _fake_llm(proc) -> SimpleNamespace:
    manager = SimpleNamespace(processes=[proc])
    client = SimpleNamespace(resources=SimpleNamespace(engine_manager=manager),
                             shutdown=lambda: proc.terminate())  # like vLLM's: signal, do not wait
    return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=client))


def test_release_returns_only_after_the_engine_processes_exited():
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Queue()
    proc = ctx.Process(target=_slow_engine, args=(ready,))
    proc.start()
    grandchild = ready.get(timeout=10)
    engines = {"talker": _fake_llm(proc)}
    t0 = time.monotonic()
    release_all(engines)  # the stage graph's release of its engines (each through release_engine)
    assert not proc.is_alive(), "release returned while the engine process was still exiting"
    assert time.monotonic() - t0 >= 1.0
    assert proc.exitcode == 0 and engines == {}
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_an_engine_process_that_will_not_exit_is_killed_and_named(capsys):
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=time.sleep, args=(60,))
    proc.start()
    t0 = time.monotonic()
    wait_engine_released([proc], "thinker", timeout=0.5)  # never signalled: only the deadline ends the wait
    assert not proc.is_alive() and time.monotonic() - t0 < 15
    assert f"stage thinker: engine processes [{proc.pid}] still running after shutdown; killing them" in \
        capsys.readouterr().err
