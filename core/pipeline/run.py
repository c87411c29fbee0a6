"""``run_pipeline``: the main job end to end as an in-process client of the stage graph
(:class:`~core.pipeline.graph.StageGraph`) -- the declared pipeline (the demo, or the one a ``--model``
checkpoint's ``model_type`` names), the device, the checks, the graph started (its engines at once), one
request (the declaration's, made of the run's options: the same request the server makes of the same fields),
the outputs renamed into place only when everything succeeded."""

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

from core.models.writing import current_umask
from core.pipeline.config import GraphConfig, RunConfig
from omni_backends.backend import Backend

#: issue 25: a run's wall time (graph start + generation) may be at most this many times the slowest stage's
#: engine start plus the generation time -- what starting the stages concurrently buys
CONCURRENT_START_FACTOR = 1.25


def run_pipeline(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the main job on a stage graph; returns the summary (also written to ``summary.json``).

    The pipeline is the one declared for ``cfg.model`` (:func:`core.pipeline.declarations.resolve`; the demo
    without it). Before any engine starts (and before vLLM is imported) it raises
    :class:`BadInputError` (a ``ValueError``) for a bad value of ``cfg`` or a checkpoint no declaration serves,
    and the registry's errors for an unknown / unusable device; bad model files, a request the models cannot
    serve (the declaration's check), an unwritable ``out`` follow before the first engine.
    A package that raises while being imported (``torch_npu`` without CANN,
    reached through torch's backend autoload or transformers) is
    :class:`~omni_backends.errors.VendorImportError` naming it.
    A stage that fails (its engine did not start, its engine process died, the
    model raised -- which ends vLLM's engine core) is
    :class:`~omni_backends.errors.StageFailedError` naming the stage and the
    cause; every engine is shut down (their processes gone) before this returns
    or raises, and nothing is written to ``out`` on failure.

    Writes ``out.wav`` (mono 16-bit PCM at the pipeline's sample rate), ``codes.json`` (``[T][Q]``), the text
    stage's text (``<stage>.txt``, the demo's ``thinker.txt``) and ``summary.json``. The summary's
    ``stages.<stage>`` hold ``engine_start_seconds``, ``generation_seconds`` (the stage's requests, submit to
    finish) and ``seconds`` (their sum); ``wall_seconds`` is the graph's start plus the request
    (``shutdown_seconds`` the engines' release after it, ``total_seconds`` the whole call);
    ``concurrent_start`` compares it with ``CONCURRENT_START_FACTOR x (slowest start + generation)`` (issue 25).
    """
    cfg.check()  # values first: before the device, the file system or vLLM
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t_start = time.perf_counter()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the progress lines readable
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries only our result
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from core.pipeline.declarations import resolve
    from core.pipeline.graph import prepare_environment
    from core.pipeline.inputs import check_out_dir
    from omni_backends.probing import blame_import_failures
    from omni_backends.registry import select

    spec = resolve(cfg.model)  # cheap: the checkpoint's config.json only
    req = spec.request_of_run(cfg)
    sel = select(cfg.device)  # cheap: no vendor stack imported yet
    say(f"device: {sel.name} ({sel.rule}): {sel.reason}")
    gcfg = prepare_environment(GraphConfig.of_run(cfg), sel.backend, spec)  # device defaults, engine choices, vLLM env
    cfg = dataclasses.replace(cfg, multiprocess=gcfg.multiprocess, enforce_eager=gcfg.enforce_eager)
    with blame_import_failures():
        model = spec.load(gcfg, sel.backend, say)
        if gcfg.model is None:
            cfg.model_dir = model.model_dir
            gcfg = dataclasses.replace(gcfg, model_dir=model.model_dir)
        spec.check(model, req, ())
        check_out_dir(cfg.out)
        sel.backend.check_vllm_platform()
    out = os.path.abspath(cfg.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".omni-run-", dir=os.path.dirname(out))
    try:
        with blame_import_failures():
            summary = asyncio.run(_run_on_graph(cfg, gcfg, req, staging, say, sel.backend))
        summary["device"] = {"selected": sel.name, "rule": sel.rule, "reason": sel.reason, "versions": sel.versions}
        summary["total_seconds"] = round(time.perf_counter() - t_start, 3)
        with open(os.path.join(staging, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        if os.path.isdir(out):
            for name in os.listdir(staging):
                os.replace(os.path.join(staging, name), os.path.join(out, name))
            os.rmdir(staging)
        else:
            os.replace(staging, out)
            os.chmod(out, 0o777 & ~current_umask())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary["out_dir"] = out
    return summary


async def _run_on_graph(cfg: RunConfig, gcfg: GraphConfig, req: Any, staging: str, say: Callable[[str], None],
                        backend: Backend) -> dict[str, Any]:
    """Start the graph, synthesise ``req``, write ``out.wav`` / ``codes.json`` (and the text stage's text) into
    ``staging``; the graph is shut down before this returns or raises. A stage failure gets "No output was
    written." appended."""
    import torch

    from core.pipeline.audio import pcm16, wav_bytes
    from core.pipeline.graph import AudioChunk, StageGraph
    from omni_backends.errors import StageFailedError

    t0 = time.perf_counter()
    graph = await StageGraph.start(gcfg, backend, say)  # a start failure already says no output was written
    names = graph.spec.stage_names
    try:
        t_gen = time.perf_counter()
        say(f"[1/{len(names)}] {names[0]}: {names[0]} request submitted")
        pcm: list[bytes] = []
        result = None
        async for item in graph.synthesize(req):
            if isinstance(item, AudioChunk):
                if item.index == 0:
                    for i, name in enumerate(names[1:-1], 2):
                        say(f"[{i}/{len(names)}] {name}: streaming codec frames")
                    w = graph.spec.window(graph.model)
                    say(f"[{len(names)}/{len(names)}] {names[-1]}: synthesising chunks of {w.chunk_frames} frames "
                        f"(the first {w.first_chunk_frames})")
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
    if graph.spec.text_stage is not None:
        with open(os.path.join(staging, f"{graph.spec.text_stage}.txt"), "w") as f:
            f.write(result.text + "\n")
    codes = result.codes.to(torch.int64)
    with open(os.path.join(staging, "codes.json"), "w") as f:
        json.dump(codes.tolist(), f)
    say(f"done: {result.samples / sr:.2f} s of audio")
    summary = _summary(cfg, gcfg, graph, req, result, stats, generation, wall, len(pcm))
    summary["shutdown_seconds"] = round(shutdown, 3)
    summary["written"] = sorted([*os.listdir(staging), "summary.json"])
    return summary


def _summary(cfg: RunConfig, gcfg: GraphConfig, graph: Any, req: Any, result: Any, stats: dict[str, dict[str, Any]],
             generation: float, wall: float, chunks: int) -> dict[str, Any]:
    info, t, spec = graph.stage_info, result.timings, graph.spec
    sr = graph.sample_rate
    window = spec.window(graph.model)
    per_stage: dict[str, dict[str, Any]] = {}
    for i, stage in enumerate(spec.stages):
        if stage is spec.producer:
            per_stage[stage.name] = {"generated_tokens": int(result.codes.shape[0]),
                                     "codebooks": int(result.codes.shape[1]),
                                     "talker_mtp": stats[stage.name]["talker_mtp"],
                                     "talker_mtp_graph": stats[stage.name]["mtp_graph"]}
        elif stage is spec.audio:
            per_stage[stage.name] = {"frames": int(result.codes.shape[0]), "samples": result.samples,
                                     "sample_rate": sr, "audio_seconds": round(result.samples / sr, 3),
                                     "chunks": chunks, "chunk_frames": window.chunk_frames,
                                     "first_chunk_frames": window.first_chunk_frames,
                                     "left_context_frames": window.left_context_frames}
        else:
            per_stage[stage.name] = {"prompt_tokens": result.prompt_tokens,
                                     "generated_tokens": result.generated_tokens} if i == 0 else {}
    stages = {}
    for stage, extra in per_stage.items():
        st = {k: v for k, v in info[stage].items() if k not in ("started_at", "ready_at")}
        start = st["engine_start_seconds"]
        stages[stage] = {**extra, **st, "generation_seconds": t[stage],
                         "seconds": round(start + t[stage], 3),
                         "peak_device_memory_bytes": stats[stage]["peak_device_memory_bytes"]}
    slowest = max(info[s]["engine_start_seconds"] for s in per_stage)
    bound = CONCURRENT_START_FACTOR * (slowest + generation)
    return {"pipeline": spec.name, "model": gcfg.model or gcfg.model_dir, "prompt": cfg.prompt, "voice": cfg.voice,
            "seed": cfg.seed, "request": dataclasses.asdict(req) if dataclasses.is_dataclass(req) else repr(req),
            "text": result.text, "stages": stages,
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
                               "multiprocess": cfg.multiprocess, "chunk_frames": window.chunk_frames}}

