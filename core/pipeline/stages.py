"""The three stages of a run (thinker -> talker (+MTP) -> code2wav), each on its own vLLM engine built by the
engine factory (:func:`core.stage.make_engine`); :class:`StageEngines` starts and releases them and turns a
failure into :class:`~omni_backends.errors.StageFailedError` naming the stage."""

from __future__ import annotations

import contextlib
import json
import os
import time
import wave
from typing import Any, Callable

from core.kinds import AR, GENERATION
from core.pipeline.config import (
    ENGINE_KW,
    TALKER_MAX_MODEL_LEN,
    THINKER_MAX_MODEL_LEN,
    RunConfig,
    engine_kw,
)
from core.pipeline.faults import failure_cause, watch_engine_process
from core.pipeline.release import release_engine
from omni_backends.engine_memory import engine_memory_kw


class StageEngines:
    """The engines of one run: started, released when their stage is done, and all
    released when a stage fails (then the failure is :class:`StageFailedError`).
    In multiprocess mode a watchdog thread per engine turns a dead engine process
    into an error instead of a hang (:func:`watch_engine_process`)."""

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
            threading.Thread(target=watch_engine_process, args=(llm, stop), daemon=True,
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
        from omni_backends.errors import (
            BadInputError,
            OmniBackendError,
            StageFailedError,
        )
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
            raise StageFailedError(f"stage {stage} failed {when}: {failure_cause(exc, llm)}. No output was "
                                   f"written.", stage=stage) from exc


def _start_stage(stage: str, model: str, kind: str, cfg: RunConfig, backend: Any, max_model_len: int,
                 **kw: Any) -> tuple[Any, dict[str, Any]]:
    """Start one stage's engine; returns it and its summary entries (engine start
    time, the memory it was given, what vLLM resolved)."""
    from core.stage import make_engine  # looked up per call: a wrapper set on core.stage.make_engine is used

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


def _write_wav(path: str, samples: Any, sample_rate: int) -> None:
    import numpy as np

    pcm = (np.clip(samples.numpy(), -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())


def run_stages(cfg: RunConfig, configs: dict[str, dict[str, Any]], staging: str, say: Callable[[str], None],
                backend: Any) -> dict[str, Any]:
    """The three stages; every engine is shut down before this returns or raises."""
    engines = StageEngines()
    try:
        return _run_stages_on(engines, cfg, configs, staging, say, backend)
    finally:
        engines.release_all()


def _run_stages_on(engines: StageEngines, cfg: RunConfig, configs: dict[str, dict[str, Any]], staging: str,
                   say: Callable[[str], None], backend: Any) -> dict[str, Any]:
    import torch
    from vllm.sampling_params import SamplingParams

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
