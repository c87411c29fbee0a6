"""``omni_backends.engine_lifetime``: the processes an engine owner starts end when it does, however it dies.

Without engines (the serve-level claim, with vLLM's real engine processes, is ``tests/serving/test_serve_killed.py``):
an owner forks one child (``multiprocessing``'s fork, as vLLM does on a GPU) and starts one fresh interpreter that
calls ``end_with_owner`` (as vLLM's spawned engine cores do through the general plugin), then is SIGKILLed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
ENV.pop("OMNI_BACKENDS_ENGINE_OWNER", None)

OWNER = r'''
import multiprocessing, subprocess, sys, time
from omni_backends.engine_lifetime import end_with_owner, own_engines
own_engines()
assert not end_with_owner()  # the owner never watches itself
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
child.start()
spawned = subprocess.Popen([sys.executable, "-c", "import time\nfrom omni_backends.engine_lifetime import end_with_owner\n"
                            "assert end_with_owner()\ntime.sleep(600)"])
time.sleep(1.0)  # the spawned one has started its watcher
print(child.pid, spawned.pid, flush=True)
time.sleep(600)
'''


def test_forked_and_spawned_children_end_within_seconds_of_their_owner_being_killed():
    from omni_backends.engine_lifetime import GRACE_S

    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, env=ENV)
    children = [psutil.Process(int(pid)) for pid in owner.stdout.readline().split()]
    try:
        assert len(children) == 2 and all(c.is_running() for c in children)
        owner.kill()
        owner.wait()
        t0 = time.monotonic()
        _, alive = psutil.wait_procs(children, timeout=GRACE_S + 5)
        assert not alive, f"still running {time.monotonic() - t0:.1f} s after the owner was killed: {alive}"
    finally:
        for c in children:
            try:
                c.kill()
            except psutil.Error:
                pass


def test_a_process_whose_owner_is_already_gone_ends_at_once():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    env = {**ENV, "OMNI_BACKENDS_ENGINE_OWNER": str(gone.pid)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import time\nfrom omni_backends.engine_lifetime import "
                           "end_with_owner\nend_with_owner()\ntime.sleep(60)"], env=env, timeout=30)
    assert proc.returncode == -15 and time.monotonic() - t0 < 10  # SIGTERM, not the minute of sleep
