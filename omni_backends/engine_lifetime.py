"""Engine processes end with the process that started them, however it dies (SIGKILL, the OOM killer).

vLLM's engine-core processes (and their workers) wait for their front end over ZMQ; when the front end is
killed outright nothing tells them, and they stay, re-parented to init, holding their memory (and a device).
Here:

- :func:`own_engines`, called in a process before it starts engines (``core.stage.prepare_device``, the kit's
  engine check), names it the *engine owner*: ``OMNI_BACKENDS_ENGINE_OWNER=<its pid>`` in its environment
  (inherited by every process it starts) and an ``os.register_at_fork`` hook, so that every child it *forks*
  (vLLM's ``fork`` start method, the default on a GPU; the hook is inherited by the child's own forks)
  starts the watcher at once;
- :func:`end_with_owner`, called in a process that may be a descendant of an owner (the ``vllm.general_plugins``
  entry point ``core.models:register``, which vLLM runs in every engine-core and worker process it *spawns*:
  ``EngineCore.__init__`` and ``WorkerWrapperBase.init_worker`` call ``load_general_plugins``, declared in
  ``core.seams``), starts the watcher unless this process is the owner itself;
- the watcher: a daemon thread blocked on a pidfd of the owner (``os.pidfd_open``, Linux >= 5.3: readable when
  the owner exits; no polling) that then sends this process SIGTERM (vLLM's engine core and workers shut down
  on it) and SIGKILL :data:`GRACE_S` seconds later if it is still there. Without pidfds it checks the owner
  every :data:`FALLBACK_POLL_S` seconds.

vLLM's ``multiprocessing`` resource tracker needs nothing: it exits when the last process holding its pipe
(the owner and the engine processes) is gone. Device-neutral; standard library only.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import MutableMapping

#: the pid of the process that started the engines, inherited by every process it starts
ENV_OWNER = "OMNI_BACKENDS_ENGINE_OWNER"
#: seconds between SIGTERM (clean shutdown) and SIGKILL once the owner is gone
GRACE_S = 2.0
#: seconds between checks of the owner where the kernel has no pidfds
FALLBACK_POLL_S = 0.5

_lock = threading.Lock()
_watching: int | None = None  # the pid this process watches (None: none)
_at_fork_registered = False


def owner_pid(env: MutableMapping[str, str] | None = None) -> int | None:
    """The engine owner named in ``env`` (default ``os.environ``), or None (unset or not a pid)."""
    value = (os.environ if env is None else env).get(ENV_OWNER, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def own_engines() -> int:
    """Make this process the engine owner (see the module doc): every process it starts from now on, forked
    or spawned, ends within :data:`GRACE_S` seconds (plus the kernel's signal delivery) of this process
    ending. Idempotent; returns this process's pid."""
    global _at_fork_registered
    pid = os.getpid()
    os.environ[ENV_OWNER] = str(pid)
    with _lock:
        if not _at_fork_registered:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _at_fork_registered = True
    return pid


def _after_fork_in_child() -> None:
    global _lock, _watching
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork: never wait for it
    _watching = None  # the parent's watcher thread did not survive the fork
    end_with_owner()


def end_with_owner() -> bool:
    """In a descendant of the engine owner (:data:`ENV_OWNER` set to another pid): start the watcher (see the
    module doc) and return True; in the owner itself, or with no owner named, do nothing and return False.
    Idempotent. If the owner is already gone, this process is ended at once."""
    global _watching
    owner = owner_pid()
    if owner is None or owner == os.getpid():
        return False
    with _lock:
        if _watching == owner:
            return True
        _watching = owner
    threading.Thread(target=_watch, args=(owner,), name="omni-backends-engine-owner-watch", daemon=True).start()
    return True


def _watch(owner: int) -> None:
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:  # gone before we looked
        _end_self()
        return
    except (AttributeError, OSError):  # no pidfds here (old kernel, another OS): check now and then
        while _alive(owner):
            time.sleep(FALLBACK_POLL_S)
        _end_self()
        return
    try:
        select.select([fd], [], [])  # readable once the owner has exited
    finally:
        os.close(fd)
    _end_self()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _end_self() -> None:
    """SIGTERM this process; SIGKILL it :data:`GRACE_S` seconds later if it is still running."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["ENV_OWNER", "GRACE_S", "end_with_owner", "own_engines", "owner_pid"]
