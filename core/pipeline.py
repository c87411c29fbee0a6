"""The main job: thinker -> talker (+MTP) -> code2wav on real vLLM engines.

:func:`run_pipeline` validates every input first (so bad input fails before
any engine starts), then runs the three stages through the core runner on the
selected driver, and writes its outputs into a temporary folder that is
renamed into place only when everything succeeded:

- ``out.wav``       mono 16-bit PCM at the code2wav model's sample rate
- ``thinker.txt``   the thinker's text
- ``codes.json``    the talker's codec tokens, ``[T][K]`` (codebook 0 sampled,
  1..K-1 from the MTP head)
- ``summary.json``  driver and why, per-stage token counts and wall times
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import wave
from typing import Any, Callable

from core.kinds import AR, GENERATION
from core.stage import GRAPH_MODES, RUNNERS, check_engine_choices
from omni_backends.binding import VendorSymbol
from omni_backends.engine_memory import engine_memory_kw
from omni_backends.errors import BadInputError

STAGES = ("thinker", "talker", "code2wav")
#: engine settings shared by the three stages on every device. fp32: the demo weights are fp32 and the talker's
#: codes must equal the plain-PyTorch reference (vLLM's ``dtype="auto"`` would run an fp32 checkpoint in bf16).
ENGINE_KW: dict[str, Any] = dict(dtype="float32", max_num_seqs=8)
THINKER_MAX_MODEL_LEN = 512
TALKER_MAX_MODEL_LEN = 1024


def default_model_dir() -> str:
    """``$OMNI_BACKENDS_CACHE`` or ``~/.cache/omni-backends``, then ``demo-v<format>``."""
    from core.models.create import FORMAT_VERSION

    root = os.environ.get("OMNI_BACKENDS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "omni-backends"
    )
    return os.path.join(root, f"demo-v{FORMAT_VERSION}")


#: seeds reach ``numpy.random.seed`` (vLLM's ``set_random_seed``), which takes 0..2**32-1
MAX_SEED = 2**32 - 1


def _check_int(value: Any, name: str, flag: str, lo: int, hi: int | None = None) -> None:
    """Raise :class:`BadInputError` naming ``name`` (``flag``) unless ``lo <= value <= hi``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadInputError(f"{name} ({flag}) must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise BadInputError(f"{name} ({flag}) must be {rng}, got {value}")


@dataclasses.dataclass
class RunConfig:
    """What :func:`run_pipeline` runs. Every value is checked when the config is
    made (and again by :func:`run_pipeline`), before vLLM is imported:
    :class:`BadInputError` (a ``ValueError``) naming the argument and its flag.

    ``prompt``: non-empty text; ``device``: driver name / alias, ``"auto"``,
    ``""`` (= auto) or ``None`` (``OMNI_BACKENDS_DEVICE``, then auto);
    ``voice``: talker voice id, >= 0 (the upper bound is the talker's
    ``num_voices``, checked against its config); ``max_tokens``: thinker tokens,
    1..THINKER_MAX_MODEL_LEN-1; ``seed``: 0..2**32-1; ``out``: output directory;
    ``model_dir``: demo models (``None``: the cache); ``multiprocess``: one
    process per engine core.
    """

    prompt: str = "Hello! Tell me about omni models."
    device: str | None = None
    voice: int = 0
    max_tokens: int = 32
    seed: int = 0
    out: str = "out"
    model_dir: str | None = None
    #: vLLM's multiprocess engine (an engine-core process per stage); ``None``: the device's default
    #: (:func:`device_defaults`: multiprocess where the driver captures graphs, else in-process)
    multiprocess: bool | None = None
    #: ``enforce_eager``; ``None``: the device's default (:func:`device_defaults`: vLLM's defaults, compilation +
    #: graphs, where the driver captures graphs; else eager). ``True`` is ``--enforce-eager`` (talker MTP eager too).
    enforce_eager: bool | None = None
    #: vLLM's ``compilation_config.cudagraph_mode`` (``GRAPH_MODES``); ``None``: vLLM's default
    graph_mode: str | None = None
    #: ``v1`` / ``v2`` sets ``VLLM_USE_V2_MODEL_RUNNER``; ``auto`` keeps vLLM's choice (or the variable if set)
    runner: str = "auto"

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Check every value's type and range (no file system, no vLLM); raises :class:`BadInputError`."""
        if not isinstance(self.prompt, str):
            raise BadInputError(f"prompt (--prompt) must be text, got {type(self.prompt).__name__}")
        if not self.prompt.strip():
            raise BadInputError("the prompt is empty; pass some text with --prompt")
        if self.device is not None and not isinstance(self.device, str):
            raise BadInputError(f"device (--device) must be a driver name or None, got {self.device!r}")
        _check_int(self.voice, "voice", "--voice", 0)
        _check_int(self.max_tokens, "max_tokens", "--max-tokens", 1, THINKER_MAX_MODEL_LEN - 1)
        _check_int(self.seed, "seed", "--seed", 0, MAX_SEED)
        if not isinstance(self.out, str) or not self.out.strip():
            raise BadInputError(f"out (--out) must be a directory path, got {self.out!r}")
        if self.model_dir is not None and (not isinstance(self.model_dir, str) or not self.model_dir.strip()):
            raise BadInputError(f"model_dir (--model-dir) must be a directory path or None, got {self.model_dir!r}")
        for name, flag in (("multiprocess", "--multiprocess"), ("enforce_eager", "--enforce-eager")):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise BadInputError(f"{name} ({flag}) must be True, False or None (the device's default), "
                                    f"got {value!r}")
        if self.graph_mode is not None and (not isinstance(self.graph_mode, str)
                                            or self.graph_mode.strip().upper() not in GRAPH_MODES):
            raise BadInputError(f"graph_mode (--graph-mode) must be one of {', '.join(GRAPH_MODES)} or None, "
                                f"got {self.graph_mode!r}")
        if self.runner not in RUNNERS:
            raise BadInputError(f"runner (--runner) must be one of {', '.join(RUNNERS)}, got {self.runner!r}")


def device_defaults(cfg: RunConfig, backend: Any) -> RunConfig:
    """``cfg`` with the device-dependent ``None`` fields filled, from the driver's
    capabilities: a driver that captures graphs (``static_graph_modes``) gets
    vLLM's defaults for its device (multiprocess engine, compilation + graphs,
    async scheduling where vLLM turns it on); one without (the cpu driver)
    runs in-process and eager, as CI always has -- compilation there buys no
    graphs and costs minutes of torch.compile on a small box."""
    graphs = backend.capabilities().static_graphs
    return dataclasses.replace(
        cfg,
        multiprocess=graphs if cfg.multiprocess is None else cfg.multiprocess,
        enforce_eager=(not graphs) if cfg.enforce_eager is None else cfg.enforce_eager,
    )


def engine_kw(cfg: RunConfig) -> dict[str, Any]:
    """``vllm.LLM`` arguments every stage shares for ``cfg`` (after :func:`device_defaults`)."""
    kw = dict(ENGINE_KW, seed=cfg.seed)
    if cfg.enforce_eager:
        kw["enforce_eager"] = True
    if cfg.graph_mode is not None:
        kw["compilation_config"] = {"cudagraph_mode": cfg.graph_mode.strip().upper()}
    return kw

def _recreate(model_dir: str) -> str:
    return f"Recreate the demo models: omni-backends demo-model create {model_dir}"


def _load_config(stage_dir: str, stage: str, model_dir: str) -> dict[str, Any]:
    path = os.path.join(stage_dir, "config.json")
    if not os.path.isfile(path):
        raise BadInputError(f"{stage} model: {path} is missing. {_recreate(model_dir)}")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{stage} model: {path} is not valid JSON ({exc}). {_recreate(model_dir)}") from exc
    if not isinstance(cfg, dict):
        raise BadInputError(f"{stage} model: {path} must hold a JSON object. {_recreate(model_dir)}")
    return cfg


def _check_weights(stage_dir: str, stage: str, model_dir: str) -> None:
    path = os.path.join(stage_dir, "model.safetensors")
    if not os.path.isfile(path):
        raise BadInputError(f"{stage} model: weight file {path} is missing. {_recreate(model_dir)}")
    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            if not list(f.keys()):
                raise ValueError("no tensors")
    except Exception as exc:  # safetensors raises its own error types
        raise BadInputError(f"{stage} model: weight file {path} is unreadable ({exc}). {_recreate(model_dir)}") from exc


def _check_out_dir(out: str) -> str:
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    probe_dir = out if os.path.isdir(out) else parent
    if os.path.exists(out) and not os.path.isdir(out):
        raise BadInputError(f"output path {out} exists and is not a directory; choose another --out")
    if not os.path.isdir(probe_dir):
        raise BadInputError(f"output directory's parent {probe_dir} does not exist; create it or choose another --out")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".omni-write-test-", dir=probe_dir)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise BadInputError(
            f"cannot write the output --out {out}: creating a file in {probe_dir} failed ({exc.strerror}); "
            f"choose another --out"
        ) from exc
    return out


def validate(cfg: RunConfig, backend: Any) -> dict[str, dict[str, Any]]:
    """Check every input before an engine starts; returns stage -> config.json.

    Cheap checks first (no vLLM, no transformers): empty prompt, bad
    ``max_tokens``, missing/corrupt model files, voice id out of range,
    unwritable output directory. Then what needs the device stack: a head
    size the device cannot run (``Backend.check_model_config``) and a prompt
    longer than the thinker's context (its tokenizer). Raises
    :class:`BadInputError` saying what to do.
    """
    cfg.check()
    model_dir = cfg.model_dir
    if not os.path.isdir(model_dir):
        raise BadInputError(f"model directory {model_dir} does not exist; create it with: omni-backends demo-model create {model_dir}")
    configs = {}
    for stage in STAGES:
        d = os.path.join(model_dir, stage)
        configs[stage] = _load_config(d, stage, model_dir)
        _check_weights(d, stage, model_dir)
    n_voices = int(configs["talker"].get("num_voices", 1))
    if not 0 <= cfg.voice < n_voices:
        raise BadInputError(f"voice id {cfg.voice} is out of range: the talker has voices 0..{n_voices - 1}")
    _check_out_dir(cfg.out)
    for stage in STAGES:
        backend.check_model_config(configs[stage])
    n_prompt = len(_thinker_tokenizer(model_dir)(cfg.prompt)["input_ids"])
    if n_prompt + cfg.max_tokens > THINKER_MAX_MODEL_LEN:
        raise BadInputError(
            f"prompt is {n_prompt} tokens; with --max-tokens {cfg.max_tokens} that exceeds the thinker's context of "
            f"{THINKER_MAX_MODEL_LEN} tokens. Shorten the prompt or lower --max-tokens."
        )
    return configs


def _thinker_tokenizer(model_dir: str) -> Any:
    path = os.path.join(model_dir, "thinker")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises ValueError / OSError / JSONDecodeError for broken files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInputError(
            f"thinker model: the tokenizer in {path} is missing or unreadable ({first[:200]}). Recreate the demo "
            f"models: omni-backends demo-model create {model_dir}"
        ) from exc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_wav(path: str, samples: Any, sample_rate: int) -> None:
    import numpy as np

    pcm = (np.clip(samples.numpy(), -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())


def run_pipeline(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the three stages; returns the summary (also written to ``summary.json``).

    Before any engine starts (and before vLLM is imported) it raises
    :class:`BadInputError` (a ``ValueError``) for a bad value of ``cfg`` and the
    registry's errors for an unknown / unusable device; bad model files, an
    unwritable ``out`` and a too-long prompt follow before the first engine.
    A package that raises while being imported (``torch_npu`` without CANN,
    reached through torch's backend autoload or transformers) is
    :class:`~omni_backends.errors.VendorImportError` naming it.
    A stage that fails once running (its engine process died, out of memory,
    the model raised) is :class:`~omni_backends.errors.StageFailedError`
    naming the stage and the cause; then every engine already started is shut
    down and nothing is written to ``out``. Engines are also shut down when
    their stage is done.
    """
    cfg.check()  # values first: before the device, the file system or vLLM
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t_start = time.perf_counter()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the progress lines readable
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries only our result
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from omni_backends.probing import blame_import_failures
    from omni_backends.registry import select

    sel = select(cfg.device)  # cheap: no vendor stack imported yet
    say(f"device: {sel.name} ({sel.rule}): {sel.reason}")
    mp_given = cfg.multiprocess is not None
    cfg = device_defaults(cfg, sel.backend)
    runner = check_engine_choices(cfg, sel.backend)
    if runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    if mp_given:  # explicit: also over an in-process run earlier in this process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.multiprocess else "0"
    else:  # the device's default, unless the user's environment says otherwise
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if cfg.multiprocess else "0")
    with blame_import_failures():
        if cfg.model_dir is None:
            cfg.model_dir = default_model_dir()
            if not os.path.isdir(cfg.model_dir):
                from core.models.create import create_demo_models

                say(f"creating demo models in {cfg.model_dir} (first run)")
                create_demo_models(cfg.model_dir)
        configs = validate(cfg, sel.backend)
        sel.backend.check_vllm_platform()
    out = os.path.abspath(cfg.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".omni-run-", dir=os.path.dirname(out))
    try:
        with blame_import_failures():
            summary = _run_stages(cfg, configs, staging, say, sel.backend)
        summary["device"] = {"selected": sel.name, "rule": sel.rule, "reason": sel.reason, "versions": sel.versions}
        summary["total_seconds"] = round(time.perf_counter() - t_start, 3)
        with open(os.path.join(staging, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        if os.path.isdir(out):
            for name in ("out.wav", "thinker.txt", "codes.json", "summary.json"):
                if os.path.exists(os.path.join(out, name)):
                    os.unlink(os.path.join(out, name))
            for name in os.listdir(staging):
                os.replace(os.path.join(staging, name), os.path.join(out, name))
            os.rmdir(staging)
        else:
            os.replace(staging, out)
            os.chmod(out, 0o777 & ~_umask())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary["out_dir"] = out
    return summary


def shutdown_engine(llm: Any) -> None:
    """Shut down a ``vllm.LLM``'s engine core (its process, in multiprocess mode)
    through ``LLMEngine.engine_core.shutdown()``; never raises."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # an engine that died already may fail to shut down: nothing left to release
        print(f"omni-backends: warning: shutting down an engine failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)


#: seconds to wait for a shut-down engine's processes to exit before killing what is left
ENGINE_RELEASE_TIMEOUT = 60.0


def _engine_core_processes(llm: Any) -> list[Any]:
    """vLLM's ``multiprocessing`` handles of ``llm``'s engine-core processes
    (``client.resources.engine_manager.processes``); none in-process."""
    manager = getattr(getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "resources", None),
                      "engine_manager", None)
    return list(getattr(manager, "processes", None) or ())


def engine_processes(llm: Any) -> list[Any]:
    """The engine-core processes of ``llm`` (vLLM's ``multiprocessing`` handles, multiprocess mode; in-process:
    none) and their descendants (``psutil.Process``), read before shutdown so that a child of a killed engine
    process is still known."""
    import psutil

    out: list[Any] = []
    for proc in _engine_core_processes(llm):
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


def release_engine(llm: Any, stage: str) -> None:
    """Shut ``llm`` down (:func:`shutdown_engine`) and return once its engine processes have exited
    (:func:`wait_engine_released`). Never raises."""
    procs = engine_processes(llm)
    shutdown_engine(llm)
    wait_engine_released(procs, stage)


def _engine_process_fate(llm: Any) -> str | None:
    """"engine process 123 was killed by signal SIGKILL" if an engine-core process
    of ``llm`` has exited (multiprocess mode), else None."""
    import signal

    for proc in _engine_core_processes(llm):
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


def _failure_cause(exc: BaseException, llm: Any) -> str:
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
    fate = _engine_process_fate(llm) if llm is not None else None
    if fate:
        return fate
    if type(root).__name__ == "EngineDeadError" or "EngineCore" in str(root):
        return f"its engine core died ({line(root)}); vLLM's log above has the engine's own error"
    return f"the engine raised {line(root)}"


# vLLM seams the fault handling relies on (multiprocess engine client, vLLM 0.26-0.33):
#: raised by ``SyncMPClient.get_output`` for an error put on its output queue once the engine is dead
ENGINE_DEAD_ERROR = VendorSymbol("vllm.v1.engine.exceptions", "EngineDeadError", kind="class")
#: the queue ``SyncMPClient.get_output`` blocks on (``queue.Queue``, no timeout)
SYNC_MP_OUTPUTS_QUEUE = VendorSymbol("vllm.v1.engine.core_client", "SyncMPClient.outputs_queue", kind="attribute")
#: the engine-core processes of a multiprocess client (``client.resources.engine_manager.processes``)
ENGINE_CORE_PROCESSES = VendorSymbol("vllm.v1.engine.utils", "CoreEngineProcManager.processes", kind="attribute")
#: ``LLM.llm_engine.engine_core.shutdown()``: in-process and multiprocess clients alike
ENGINE_CORE_SHUTDOWN = VendorSymbol("vllm.v1.engine.core_client", "EngineCoreClient.shutdown", required=())


def _watch_engine_process(llm: Any, stop: Any) -> None:
    """Until ``stop`` is set: if an engine-core process of ``llm`` exits, wake the caller.

    vLLM 0.32's ``SyncMPClient`` notices a dead engine process
    (``MPClient.start_engine_core_monitor``) and shuts its output thread down
    without telling a caller blocked in ``get_output()`` (``outputs_queue.get()``
    with no timeout): ``LLM.generate`` would wait forever. This puts vLLM's
    ``EngineDeadError`` on that queue, which ``get_output`` raises."""
    client = llm.llm_engine.engine_core
    while not stop.wait(0.5):
        if _engine_process_fate(llm) is None:
            continue
        queue = getattr(client, SYNC_MP_OUTPUTS_QUEUE.attr.rpartition(".")[2], None)
        if queue is not None:
            queue.put_nowait(ENGINE_DEAD_ERROR.resolve()())
        return


class _Stages:
    """The engines of one run: started, released when their stage is done, and all
    released when a stage fails (then the failure is :class:`StageFailedError`).
    In multiprocess mode a watchdog thread per engine turns a dead engine process
    into an error instead of a hang (:func:`_watch_engine_process`)."""

    def __init__(self) -> None:
        self.engines: dict[str, Any] = {}
        self.watchdogs: dict[str, Any] = {}

    def start(self, stage: str, make: Callable[[], Any]) -> Any:
        import threading

        self.engines[stage] = None  # starting: a failure here is this stage's
        res = make()  # the engine, or (engine, its summary entries)
        llm = res[0] if isinstance(res, tuple) else res
        self.engines[stage] = llm
        if getattr(getattr(llm.llm_engine.engine_core, "resources", None), "engine_manager", None) is not None:
            stop = threading.Event()
            threading.Thread(target=_watch_engine_process, args=(llm, stop), daemon=True,
                             name=f"omni-{stage}-engine-watchdog").start()
            self.watchdogs[stage] = stop
        return res

    def release(self, stage: str) -> None:
        """Shut the stage's engine down and return only once its engine processes have exited
        (:func:`wait_engine_released`): the next stage (or the next run) measures a settled device."""
        stop = self.watchdogs.pop(stage, None)
        if stop is not None:
            stop.set()
        llm = self.engines.pop(stage, None)
        if llm is not None:
            release_engine(llm, stage)

    def release_all(self) -> None:
        for stage in list(self.engines):
            self.release(stage)

    @contextlib.contextmanager
    def stage(self, stage: str) -> Any:
        """Run one stage; any failure becomes :class:`StageFailedError` naming it
        (a vendor import failure stays what it is), after releasing every engine."""
        from omni_backends.errors import BadInputError, OmniBackendError, StageFailedError
        from omni_backends.probing import vendor_import_error

        try:
            yield
        except BaseException as exc:
            llm = self.engines.get(stage)
            self.release_all()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(exc, OmniBackendError) and not isinstance(exc, BadInputError):
                raise  # already says what is wrong (device, driver, vendor import)
            blamed = vendor_import_error(exc)
            if blamed is not None:
                raise blamed from exc
            when = "while starting its engine" if llm is None else "while running"
            raise StageFailedError(f"stage {stage} failed {when}: {_failure_cause(exc, llm)}. No output was "
                                   f"written.", stage=stage) from exc


def _start_stage(stage: str, model: str, kind: str, cfg: RunConfig, backend: Any, max_model_len: int,
                 **kw: Any) -> tuple[Any, dict[str, Any]]:
    """Start one stage's engine; returns it and its summary entries (engine start
    time, the memory it was given, what vLLM resolved)."""
    from core.stage import make_engine

    mem = engine_memory_kw(backend, model, max_model_len=max_model_len, max_num_seqs=ENGINE_KW["max_num_seqs"],
                          dtype=ENGINE_KW["dtype"])
    t0 = time.perf_counter()
    llm = make_engine(model, kind=kind, device=cfg.device, max_model_len=max_model_len, **engine_kw(cfg), **mem, **kw)
    info = {"engine_start_seconds": round(time.perf_counter() - t0, 3), **mem, "engine": engine_config(llm)}
    return llm, info


def engine_config(llm: Any) -> dict[str, Any]:
    """What vLLM resolved for an engine: runner, graphs, scheduling, process layout."""
    cfg = llm.llm_engine.vllm_config
    cc = cfg.compilation_config
    return {
        "model_runner": "v2" if getattr(cfg, "use_v2_model_runner", False) else "v1",
        "enforce_eager": bool(cfg.model_config.enforce_eager),
        "compilation_mode": getattr(cc.mode, "name", str(cc.mode)),
        "cudagraph_mode": getattr(cc.cudagraph_mode, "name", str(cc.cudagraph_mode)),
        "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
        "multiprocess": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0",
        "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
        # as vLLM applied them (vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE override the KV size)
        "kv_cache_memory_bytes": cfg.cache_config.kv_cache_memory_bytes,
        "gpu_memory_utilization": cfg.cache_config.gpu_memory_utilization,
    }


def _worker_stats(llm: Any) -> dict[str, Any]:
    """Rank 0's ``omni_state``: peak device memory of the stage's worker, talker MTP mode and graph use."""
    state = llm.collective_rpc("omni_state")[0]
    return {"peak_device_memory_bytes": state.get("peak_memory_bytes"), "talker_mtp": state.get("mtp_mode"),
            "mtp_graph": state.get("mtp_graph")}


def _run_stages(cfg: RunConfig, configs: dict[str, dict[str, Any]], staging: str, say: Callable[[str], None],
                backend: Any) -> dict[str, Any]:
    """The three stages; every engine is shut down before this returns or raises."""
    engines = _Stages()
    try:
        return _run_stages_on(engines, cfg, configs, staging, say, backend)
    finally:
        engines.release_all()


def _run_stages_on(engines: _Stages, cfg: RunConfig, configs: dict[str, dict[str, Any]], staging: str,
                   say: Callable[[str], None], backend: Any) -> dict[str, Any]:
    import torch
    from vllm import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack

    stages: dict[str, Any] = {}
    md = cfg.model_dir

    # 1. thinker: text -> text tokens + per-token hidden states
    t0 = time.perf_counter()
    with engines.stage("thinker"):
        say("[1/3] thinker: starting engine")
        thinker, info = engines.start("thinker", lambda: _start_stage(
            "thinker", os.path.join(md, "thinker"), AR, cfg, backend, THINKER_MAX_MODEL_LEN))
        say(f"[1/3] thinker: generating up to {cfg.max_tokens} tokens")
        params = SamplingParams(max_tokens=cfg.max_tokens, temperature=0.8, top_p=0.95, seed=cfg.seed)
        (th,) = thinker.generate([cfg.prompt], params, use_tqdm=False)
        hidden = th.multimodal_outputs["hidden"]
        text = th.outputs[0].text
        stats = _worker_stats(thinker)
    engines.release("thinker")
    stages["thinker"] = {"prompt_tokens": len(th.prompt_token_ids), "generated_tokens": len(th.outputs[0].token_ids),
                         "hidden_states": list(hidden.shape), **info,
                         "peak_device_memory_bytes": stats["peak_device_memory_bytes"],
                         "seconds": round(time.perf_counter() - t0, 3)}
    with open(os.path.join(staging, "thinker.txt"), "w") as f:
        f.write(text + "\n")

    # 2. talker: prompt_embeds from thinker hidden states + voice -> codec tokens (+ MTP residuals)
    t0 = time.perf_counter()
    n_frames = max(1, min(cfg.max_tokens * 2, TALKER_MAX_MODEL_LEN - hidden.shape[0] - 1))
    with engines.stage("talker"):
        say(f"[2/3] talker: starting engine ({hidden.shape[0]} prompt embeddings, voice {cfg.voice})")
        talker, info = engines.start("talker", lambda: _start_stage(
            "talker", os.path.join(md, "talker"), AR, cfg, backend, TALKER_MAX_MODEL_LEN, skip_tokenizer_init=True))
        say(f"[2/3] talker: generating {n_frames} codec frames")
        payload = pack({"thinker_hidden": hidden, "voice": cfg.voice})
        # one token more than frames: a frame is a token plus its MTP residuals, made at the next decode step
        tparams = SamplingParams(max_tokens=n_frames + 1, temperature=0.0, ignore_eos=True, detokenize=False,
                                 extra_args={EXTRA_ARGS_KEY: payload})
        (tk,) = talker.generate([{"prompt_token_ids": [0] * hidden.shape[0]}], tparams, use_tqdm=False)
        codes = tk.multimodal_outputs["codes.audio"].to(torch.int64)
        codes = codes[codes[:, 0] >= 0]  # prompt rows carry -1
        stats = _worker_stats(talker)
    engines.release("talker")
    stages["talker"] = {"prompt_embeds": hidden.shape[0], "generated_tokens": int(codes.shape[0]),
                        "codebooks": int(codes.shape[1]), "talker_mtp": stats["talker_mtp"],
                        "talker_mtp_graph": stats["mtp_graph"], **info,
                        "peak_device_memory_bytes": stats["peak_device_memory_bytes"],
                        "seconds": round(time.perf_counter() - t0, 3)}
    with open(os.path.join(staging, "codes.json"), "w") as f:
        json.dump(codes.tolist(), f)

    # 3. code2wav: codes [T, K] -> waveform, one forward (generation runner)
    t0 = time.perf_counter()
    with engines.stage("code2wav"):
        say("[3/3] code2wav: starting engine")
        c2w, info = engines.start("code2wav", lambda: _start_stage(
            "code2wav", os.path.join(md, "code2wav"), GENERATION, cfg, backend, TALKER_MAX_MODEL_LEN,
            skip_tokenizer_init=True))
        say(f"[3/3] code2wav: synthesising {codes.shape[0]} frames")
        cparams = SamplingParams(max_tokens=1, detokenize=False, extra_args={EXTRA_ARGS_KEY: pack({"codes": codes})})
        (cw,) = c2w.generate([{"prompt_token_ids": [0] * codes.shape[0]}], cparams, use_tqdm=False)
        wav = cw.multimodal_outputs["waveform"].reshape(-1)
        stats = _worker_stats(c2w)
    engines.release("code2wav")
    sr = int(configs["code2wav"].get("sample_rate", 16000))
    _write_wav(os.path.join(staging, "out.wav"), wav, sr)
    stages["code2wav"] = {"frames": int(codes.shape[0]), "samples": int(wav.numel()), "sample_rate": sr,
                          "audio_seconds": round(wav.numel() / sr, 3), **info,
                          "peak_device_memory_bytes": stats["peak_device_memory_bytes"],
                          "seconds": round(time.perf_counter() - t0, 3)}
    say(f"done: {wav.numel() / sr:.2f} s of audio")
    return {"prompt": cfg.prompt, "voice": cfg.voice, "seed": cfg.seed, "max_tokens": cfg.max_tokens,
            "thinker_text": text, "stages": stages,
            "engine_options": {"enforce_eager": cfg.enforce_eager, "graph_mode": cfg.graph_mode, "runner": cfg.runner,
                               "multiprocess": cfg.multiprocess}}
