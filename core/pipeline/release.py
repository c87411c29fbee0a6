"""Releasing a stage's engine: shut it down, then wait until vLLM's engine-core processes (and their
children) have exited, so that the next engine starts on a settled device."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from core.seams import ASYNC_LLM_SHUTDOWN, ENGINE_CORE_PROCESSES, ENGINE_CORE_SHUTDOWN

# vLLM seams (declared in core.seams): ENGINE_CORE_PROCESSES, the engine-core processes of a multiprocess client
# (``client.resources.engine_manager.processes``); ENGINE_CORE_SHUTDOWN, ``LLM.llm_engine.engine_core.shutdown()``;
# ASYNC_LLM_SHUTDOWN, ``AsyncLLM.shutdown()``


def shutdown_engine(llm: Any) -> None:
    """Shut down an engine: a ``vllm.LLM``'s engine core (its process, in multiprocess mode) through
    ``LLMEngine.engine_core.shutdown()``; an ``AsyncLLM`` through ``AsyncLLM.shutdown()`` (its engine core,
    then its output handler task cancelled). Never raises."""
    try:
        if hasattr(llm, "llm_engine"):
            llm.llm_engine.engine_core.shutdown()
        else:
            llm.shutdown()
    except Exception as exc:  # an engine that died already may fail to shut down: nothing left to release
        print(f"omni-backends: warning: shutting down an engine failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)


#: seconds to wait for a shut-down engine's processes to exit before killing what is left
ENGINE_RELEASE_TIMEOUT = 60.0


def engine_core_processes(llm: Any) -> list[Any]:
    """vLLM's ``multiprocessing`` handles of the engine-core processes of ``llm`` (a ``vllm.LLM`` or an
    ``AsyncLLM``: ``client.resources.engine_manager.processes``); none in-process."""
    engine = getattr(llm, "llm_engine", llm)
    manager = getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", None) or ())


def engine_processes(llm: Any) -> list[Any]:
    """The engine-core processes of ``llm`` (vLLM's ``multiprocessing`` handles, multiprocess mode; in-process:
    none) and their descendants (``psutil.Process``), read before shutdown so that a child of a killed engine
    process is still known."""
    import psutil

    out: list[Any] = []
    for proc in engine_core_processes(llm):
        out.append(proc)
        try:
            out += psutil.Process(proc.pid).children(recursive=True)
        except (psutil.Error, TypeError, ValueError):  # gone already, or never started
            continue
    return out


def wait_engine_released(procs: list[Any], stage: str, timeout: float | None = None) -> None:
    """Block until every process in ``procs`` (:func:`engine_processes`) has exited.

    vLLM's ``CoreEngineProcManager.shutdown`` sends SIGTERM, waits 5 s, then SIGKILLs the process tree without
    waiting for it to die: the killed engine may still hold its device context (and memory) when the caller
    starts the next engine, which then measures and allocates on a device in flux. Our own children are joined
    (``multiprocessing`` reaps them), their descendants polled. After ``timeout`` seconds
    (:data:`ENGINE_RELEASE_TIMEOUT`) what is left is killed and waited for; a warning names it. Never raises."""
    import psutil

    if not procs:
        return
    deadline = time.monotonic() + (ENGINE_RELEASE_TIMEOUT if timeout is None else timeout)
    own = [p for p in procs if not isinstance(p, psutil.Process)]
    others = [p for p in procs if isinstance(p, psutil.Process)]
    for p in own:
        p.join(max(0.0, deadline - time.monotonic()))
    _, alive = psutil.wait_procs(others, timeout=max(0.0, deadline - time.monotonic()))
    left = [p for p in own if p.is_alive()] + alive
    if not left:
        return
    print(f"omni-backends: warning: stage {stage}: engine processes {[p.pid for p in left]} still running "
          f"after shutdown; killing them", file=sys.stderr)
    for p in left:
        with contextlib.suppress(Exception):
            p.kill()
    for p in left:
        with contextlib.suppress(Exception):
            p.join(10) if not isinstance(p, psutil.Process) else p.wait(10)


#: packages whose modules may keep an exception of an optional import in a module global
PINNING_PACKAGES = ("vllm", "vllm_omni")


def unpin_stored_import_errors(packages: tuple[str, ...] = PINNING_PACKAGES) -> int:
    """Drop the traceback of every exception kept in a module global of ``packages``; returns how many.

    vLLM keeps the error of an optional import for a later message (``vllm.multimodal.media.audio`` keeps
    ``ModuleNotFoundError: torchcodec``). Its traceback holds the frame that ran the import, and through
    ``f_back`` every frame that was calling it: when the module is first imported while an engine is being
    built, that is ``AsyncLLM.__init__`` with its ``self``. The engine then lives as long as the module, to
    interpreter exit, where ``AsyncLLM.__del__`` runs ``shutdown()`` with vLLM's module globals already gone
    ("Exception ignored in AsyncLLM.__del__ ... TypeError: 'NoneType' object is not callable"). The exception
    and its message stay; only the frames go. Never raises."""
    dropped = 0
    for name, module in list(sys.modules.items()):
        if module is None or name.partition(".")[0] not in packages:
            continue
        try:
            values = list(vars(module).values())
        except TypeError:
            continue
        for value in values:
            if isinstance(value, BaseException) and value.__traceback__ is not None:
                value.__traceback__ = None
                dropped += 1
    return dropped


def release_engine(llm: Any, stage: str) -> None:
    """Shut ``llm`` down (:func:`shutdown_engine`), return once its engine processes have exited
    (:func:`wait_engine_released`), and leave nothing of vLLM's pinning it
    (:func:`unpin_stored_import_errors`), so it is freed now, not at interpreter exit. Never raises."""
    procs = engine_processes(llm)
    shutdown_engine(llm)
    wait_engine_released(procs, stage)
    unpin_stored_import_errors()
