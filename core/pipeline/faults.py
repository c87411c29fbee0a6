"""Reading a stage's failure: the one-line cause (device out of memory, a dead engine process, the model's
error). (The stage graph's watchdog, ``StageGraph._watch``, reads vLLM's ``AsyncLLM.errored``.)"""

from __future__ import annotations

from typing import Any

from core.pipeline.release import engine_core_processes
from core.seams import ENGINE_DEAD_ERROR

# vLLM seam (declared in core.seams): ENGINE_DEAD_ERROR, what an engine client raises once its engine core died
# (``AsyncLLM.generate`` for every request in flight); :func:`failure_cause` reads it by name


def engine_process_fate(llm: Any) -> str | None:
    """"engine process 123 was killed by signal SIGKILL" if an engine-core process
    of ``llm`` has exited (multiprocess mode), else None."""
    import signal

    for proc in engine_core_processes(llm):
        code = getattr(proc, "exitcode", None)
        if code is None:
            continue
        if code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return f"its engine process {proc.pid} {how}" + (" (out of host memory? the kernel's OOM killer sends "
                                                           "SIGKILL)" if code == -signal.SIGKILL else "")
    return None


#: what an engine start on a device without free memory raises besides torch's OutOfMemoryError: cuBLAS's
#: ALLOC_FAILED and vLLM's ``request_memory`` check. (cuBLAS's ``CUBLAS_STATUS_INTERNAL_ERROR`` in ``cublasCreate``
#: is not one of them: the H200 raised it next to a full device, and also on an empty one, issue 21.)
DEVICE_MEMORY_SIGNS = ("CUBLAS_STATUS_ALLOC_FAILED", "Free memory on device")


def failure_cause(exc: BaseException, llm: Any) -> str:
    """One line: why a stage failed (device out of memory, a dead engine process, the model's error)."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    root = chain[-1]

    def line(x: BaseException) -> str:
        text = str(x).strip().splitlines()
        return f"{type(x).__name__}: {text[0][:300]}" if text else type(x).__name__

    oom = next((x for x in chain if type(x).__name__ == "OutOfMemoryError" or any(
        sign in str(x) for sign in DEVICE_MEMORY_SIGNS) or "out of memory" in str(x).lower()), None)
    if oom is not None:
        return (f"the device ran out of memory ({line(oom)}); lower --max-tokens or free device memory "
                f"(other processes on it)")
    fate = engine_process_fate(llm) if llm is not None else None
    if fate:
        return fate
    if type(root).__name__ == ENGINE_DEAD_ERROR.attr or "EngineCore" in str(root):
        return f"its engine core died ({line(root)}); vLLM's log above has the engine's own error"
    return f"the engine raised {line(root)}"
