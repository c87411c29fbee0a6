"""``run_pipeline``: the main job end to end as an in-process client of the stage graph
(:class:`~core.pipeline.graph.StageGraph`) -- the device, the checks, the graph started (its three engines at
once), one request, the outputs renamed into place only when everything succeeded."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from core.pipeline.config import GraphConfig, RunConfig, default_model_dir

#: issue 25: a run's wall time (graph start + generation) may be at most this many times the slowest stage's
#: engine start plus the generation time -- what starting the stages concurrently buys
CONCURRENT_START_FACTOR = 1.25


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def run_pipeline(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the main job on a stage graph; returns the summary (also written to ``summary.json``).

    Before any engine starts (and before vLLM is imported) it raises
    :class:`BadInputError` (a ``ValueError``) for a bad value of ``cfg`` and the
    registry's errors for an unknown / unusable device; bad model files, an
    unwritable ``out`` and a too-long prompt follow before the first engine.
    A package that raises while being imported (``torch_npu`` without CANN,
    reached through torch's backend autoload or transformers) is
    :class:`~omni_backends.errors.VendorImportError` naming it.
    A stage that fails (its engine did not start, its engine process died, the
    model raised -- which ends vLLM's engine core) is
    :class:`~omni_backends.errors.StageFailedError` naming the stage and the
    cause; every engine is shut down (their processes gone) before this returns
    or raises, and nothing is written to ``out`` on failure.

    The summary's ``stages.<stage>`` hold ``engine_start_seconds``,
    ``generation_seconds`` (the stage's requests, submit to finish) and
    ``seconds`` (their sum); ``wall_seconds`` is the graph's start plus the
    request (``shutdown_seconds`` the engines' release after it, ``total_seconds``
    the whole call); ``concurrent_start`` compares it with
    ``CONCURRENT_START_FACTOR x (slowest start + generation)`` (issue 25).
    """
    cfg.check()  # values first: before the device, the file system or vLLM
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t_start = time.perf_counter()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the progress lines readable
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries only our result
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from core.pipeline.graph import prepare_environment
    from core.pipeline.inputs import validate
    from omni_backends.probing import blame_import_failures
    from omni_backends.registry import select

    sel = select(cfg.device)  # cheap: no vendor stack imported yet
    say(f"device: {sel.name} ({sel.rule}): {sel.reason}")
    gcfg = prepare_environment(GraphConfig.of_run(cfg), sel.backend)  # device defaults, engine choices, vLLM env
    cfg = dataclasses.replace(cfg, multiprocess=gcfg.multiprocess, enforce_eager=gcfg.enforce_eager)
    with blame_import_failures():
        if cfg.model_dir is None:
            cfg.model_dir = default_model_dir()
            if not os.path.isdir(cfg.model_dir):
                from core.models.create import create_demo_models

                say(f"creating demo models in {cfg.model_dir} (first run)")
                create_demo_models(cfg.model_dir)
        gcfg = dataclasses.replace(gcfg, model_dir=cfg.model_dir)
        configs = validate(cfg, sel.backend)
        sel.backend.check_vllm_platform()
    out = os.path.abspath(cfg.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".omni-run-", dir=os.path.dirname(out))
    try:
        with blame_import_failures():
            summary = asyncio.run(_run_on_graph(cfg, gcfg, configs, staging, say, sel.backend))
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


async def _run_on_graph(cfg: RunConfig, gcfg: GraphConfig, configs: dict[str, dict[str, Any]], staging: str,
                        say: Callable[[str], None], backend: Any) -> dict[str, Any]:
    """Start the graph, synthesise ``cfg``'s one request, write ``out.wav`` / ``thinker.txt`` / ``codes.json``
    into ``staging``; the graph is shut down before this returns or raises. A stage failure gets
    "No output was written." appended."""
    import torch

    from core.pipeline.audio import pcm16, wav_bytes
    from core.pipeline.graph import SpeechRequest, StageGraph
    from omni_backends.errors import StageFailedError

    t0 = time.perf_counter()
    graph = await StageGraph.start(gcfg, backend, say)  # a start failure already says no output was written
    try:
        t_gen = time.perf_counter()
        say(f"[1/3] thinker: generating up to {cfg.max_tokens} tokens")
        pcm: list[bytes] = []
        result = None
        async for item in graph.synthesize(SpeechRequest(cfg.prompt, voice=cfg.voice, seed=cfg.seed,
                                                         max_tokens=cfg.max_tokens)):
            if hasattr(item, "samples") and hasattr(item, "index"):
                if item.index == 0:
                    say(f"[2/3] talker: streaming codec frames (voice {cfg.voice})")
                    say(f"[3/3] code2wav: synthesising chunks of {gcfg.chunk_frames} frames")
                pcm.append(pcm16(item.samples))
            else:
                result = item
        generation = time.perf_counter() - t_gen
        wall = time.perf_counter() - t0  # the main job: the graph's start + the request
        stats = await graph.worker_stats()
    except StageFailedError as exc:
        raise StageFailedError(f"{exc}. No output was written.", stage=exc.stage) from exc
    finally:
        t_down = time.perf_counter()
        say("shutting down the engines")
        await graph.shutdown()
        shutdown = time.perf_counter() - t_down
    sr = graph.sample_rate
    with open(os.path.join(staging, "out.wav"), "wb") as f:
        f.write(wav_bytes(b"".join(pcm), sr))
    with open(os.path.join(staging, "thinker.txt"), "w") as f:
        f.write(result.thinker_text + "\n")
    codes = result.codes.to(torch.int64)
    with open(os.path.join(staging, "codes.json"), "w") as f:
        json.dump(codes.tolist(), f)
    say(f"done: {result.samples / sr:.2f} s of audio")
    summary = _summary(cfg, gcfg, configs, graph, result, stats, generation, wall, len(pcm))
    summary["shutdown_seconds"] = round(shutdown, 3)
    return summary


def _summary(cfg: RunConfig, gcfg: GraphConfig, configs: dict[str, dict[str, Any]], graph: Any, result: Any,
             stats: dict[str, dict[str, Any]], generation: float, wall: float, chunks: int) -> dict[str, Any]:
    info, t = graph.stage_info, result.timings
    sr = graph.sample_rate
    hidden_rows = result.prompt_tokens + result.thinker_tokens - 1
    per_stage = {
        "thinker": {"prompt_tokens": result.prompt_tokens, "generated_tokens": result.thinker_tokens,
                    "hidden_states": [hidden_rows, int(configs["thinker"].get("hidden_size", 0))]},
        "talker": {"prompt_embeds": hidden_rows, "generated_tokens": int(result.codes.shape[0]),
                   "codebooks": int(result.codes.shape[1]), "talker_mtp": stats["talker"]["talker_mtp"],
                   "talker_mtp_graph": stats["talker"]["mtp_graph"]},
        "code2wav": {"frames": int(result.codes.shape[0]), "samples": result.samples, "sample_rate": sr,
                     "audio_seconds": round(result.samples / sr, 3), "chunks": chunks,
                     "chunk_frames": gcfg.chunk_frames},
    }
    stages = {}
    for stage, extra in per_stage.items():
        st = {k: v for k, v in info[stage].items() if k not in ("started_at", "ready_at")}
        start = st["engine_start_seconds"]
        stages[stage] = {**extra, **st, "generation_seconds": t[stage],
                         "seconds": round(start + t[stage], 3),
                         "peak_device_memory_bytes": stats[stage]["peak_device_memory_bytes"]}
    slowest = max(info[s]["engine_start_seconds"] for s in per_stage)
    bound = CONCURRENT_START_FACTOR * (slowest + generation)
    return {"prompt": cfg.prompt, "voice": cfg.voice, "seed": cfg.seed, "max_tokens": cfg.max_tokens,
            "thinker_text": result.thinker_text, "stages": stages,
            "generation_seconds": round(generation, 3), "first_chunk_seconds": t["first_chunk"],
            "wall_seconds": round(wall, 3),
            "concurrent_start": {"graph_start_seconds": info["graph"]["start_seconds"],
                                 "slowest_start_seconds": slowest,
                                 "serial_start_seconds": round(sum(info[s]["engine_start_seconds"]
                                                                   for s in per_stage), 3),
                                 "overlapped": info["graph"]["overlapped"],
                                 "bound_seconds": round(bound, 3), "factor": CONCURRENT_START_FACTOR,
                                 "within_bound": wall <= bound},
            "engine_options": {"enforce_eager": cfg.enforce_eager, "graph_mode": cfg.graph_mode, "runner": cfg.runner,
                               "multiprocess": cfg.multiprocess, "chunk_frames": gcfg.chunk_frames}}
