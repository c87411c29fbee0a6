"""``omni-backends serve`` under load, measured as vLLM-Omni measures its server (``vllm bench serve --omni``): the
demo pipeline against the same requests one by one through ``run``, or a Qwen3-TTS checkpoint (``--model DIR``)
against the same stage graph driven in a process of its own without HTTP (what the server itself costs).

Starts a server (``python -m core.serving``, resident stage graph) unless ``--url`` names one, then for each
concurrency level sends ``max(--min-requests, level)`` streamed (SSE) speech requests, ``level`` at a time,
over HTTP on 127.0.0.1 and measures per request, on the client's clock:

- time to first audio (TTFA): request sent -> first ``speech.audio.delta`` received;
- real-time factor (RTF): request sent -> ``speech.audio.done``, divided by the audio's duration;
- underruns: chunks that arrived after a player started at the first chunk would have run dry;

and per level: audio seconds delivered per wall second (audio-s/s), p50 / p99 of TTFA and RTF.

- The demo (no ``--model``): OpenAI's request (``voice-N``, ``max_tokens`` thinker tokens); the baseline is the
  one-shot path, ``omni-backends run`` (a fresh process: three engines started, one request, exit), timed
  ``--run-baseline`` times; "run, one by one" = requests x its median wall time; ratio = that / the level's wall.
- ``--model DIR`` (Qwen3-TTS, released layout): vLLM-Omni's request (``voice`` a speaker, ``language``,
  ``stream: true`` -> ``speech.audio.*`` events) with a fixed length -- ``--frames`` codec frames per request
  (``max_new_tokens = frames + 1`` and ``--stage-overrides``: the talker's ``ignore_eos`` and no stop token); the
  talker's other sampling, the chunking (the deploy's window, or ``--chunk-frames``) and code2wav's work (the
  deploy's ``async_chunk`` incremental decode) are the pipeline's. Beside the served rows, unless
  ``--no-inproc``: the in-process rows, from a child process (this script with ``--inproc-only``, after the
  server stopped) that starts the same stage graph as the server (``ServeConfig.graph_config``, then
  ``StageGraph.start``) and sends the same request bodies, at the same levels, through the server's request
  path minus HTTP (``graph.spec.speech.parse`` -> ``StageGraph.check`` -> ``StageGraph.synthesize``), measured the same
  way on its own clock (TTFA: the body taken -> the first ``AudioChunk`` received; RTF; audio-s/s); vLLM's
  per-stage stats loggers (the server's ``/metrics``) are off there, as SSE encoding and HTTP are. Columns
  ``inproc_ttfa_ms`` / ``inproc_rtf`` / ``inproc_audio_s_per_s`` (p50 / p50 / per level) and the ratios served /
  in-process (``ttfa_vs_inproc``, ``rtf_vs_inproc``, ``audio_s_per_s_vs_inproc``): 1.0 is a free server; the
  server's cost shows as TTFA / RTF ratios above 1 and an audio-s/s ratio below 1 (issue 40's goal: within 10 %).
  ``bench/bench_qwen3_tts.py`` measures the two engines alone (talker ms per frame, code2wav ms per chunk).

    python bench/bench_serve.py [--device cpu] [--concurrency 1 8 32] [--max-tokens 16] [--run-baseline 2]
                                [--url http://127.0.0.1:8000] [--json OUT.json]
    python bench/bench_serve.py --model DIR [--device cpu] [--concurrency 1 8 64] [--frames 48]
                                [--no-inproc | --inproc-only]

Prints a markdown table and a JSON report (paste into bench/RESULTS.md); writes its record under
``bench/results/`` (``bench/record.py``: command, commit, date, device, model size, figures).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: ``--stage-overrides`` fixing a request's length at its ``max_new_tokens``: the talker (stage 0) ignores EOS and
#: has no stop token (vLLM-Omni's per-stage ``default_sampling_params``)
FIXED_LENGTH = {"0": {"default_sampling_params": {"ignore_eos": True, "stop_token_ids": []}}}
PROMPTS = ["Hello! Tell me about omni models.", "What is the weather like today?", "Read me a short poem.",
           "Explain pipelines in one sentence.", "Count from one to five.", "Say something nice."]


def pct(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest-rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def request_body(i: int, args: argparse.Namespace) -> dict:
    """The ``i``-th request: the demo's (``voice-N``, thinker tokens) or vLLM-Omni's Qwen3-TTS request."""
    if args.model is None:
        return {"model": "omni-demo", "input": PROMPTS[i % len(PROMPTS)], "voice": f"voice-{i % 2}", "seed": i,
                "max_tokens": args.max_tokens, "stream_format": "sse"}
    body = {"model": args.model_name, "input": PROMPTS[i % len(PROMPTS)], "voice": args.speakers[i % len(args.speakers)],
            "language": "English", "seed": i, "max_new_tokens": args.frames + 1, "stream": True,
            "response_format": "pcm"}
    if args.unseeded:  # the deploy's sampling with no per-request seed (vLLM-Omni's clients may send none)
        del body["seed"]
    return body


async def one(client, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    arrivals, durations, sr, done = [], [], 16000, None
    async with client.stream("POST", f"{url}/v1/audio/speech", json=body) as r:
        if r.status_code != 200:
            return {"ok": False, "status": r.status_code, "error": (await r.aread()).decode()[:300]}
        sr = int(r.headers["x-sample-rate"])
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                arrivals.append(time.perf_counter())
                durations.append(len(base64.b64decode(event["audio"])) / 2 / sr)
            elif event["type"] == "speech.audio.done":
                done = event
            else:
                return {"ok": False, "status": 200, "error": json.dumps(event)[:300]}
    return request_figures(t0, time.perf_counter(), arrivals, durations, done is not None)


def request_figures(t0: float, t1: float, arrivals: list[float], durations: list[float], done: bool) -> dict:
    """One request's figures from its clock readings (``time.perf_counter()`` s): sent at ``t0``, chunks
    received at ``arrivals`` holding ``durations`` s of audio, ended at ``t1`` (``done``: with its last event /
    result). The same for the served and the in-process side."""
    audio = sum(durations)
    if not arrivals:
        return {"ok": False, "status": 200, "error": "no audio chunk"}
    underruns, played = 0, 0.0
    for arrival, dur in zip(arrivals, durations):
        if arrival > arrivals[0] + played + 1e-9:
            underruns += 1
        played += dur
    return {"ok": done and audio > 0, "ttfa": arrivals[0] - t0, "latency": t1 - t0, "audio": audio,
            "rtf": (t1 - t0) / audio if audio else None, "underruns": underruns, "chunks": len(arrivals)}


async def one_inproc(graph, body: dict, model_name: str) -> dict:
    """``body`` through the server's request path minus HTTP (the declaration's ``graph.spec.speech.parse``, then
    ``graph.check`` and ``graph.synthesize`` under a fresh request id, as ``core.serving.app.SpeechHandler``),
    measured as :func:`one` measures a served request: ``t0`` when the body is taken, an arrival per
    ``AudioChunk`` received, the end at the ``SpeechResult``."""
    from core.pipeline.graph import AudioChunk

    sr = int(graph.sample_rate)
    t0 = time.perf_counter()
    arrivals, durations, done = [], [], False
    try:
        rid = f"speech-{uuid.uuid4().hex}"
        opts = graph.spec.speech.parse(body, model_name=model_name, model=graph.model, request_id=rid)
        graph.check(opts.request, request_id=rid)
        async for item in graph.synthesize(opts.request, request_id=rid):
            if isinstance(item, AudioChunk):
                arrivals.append(time.perf_counter())
                durations.append(len(item.samples) / sr)
            else:
                done = True
    except Exception as exc:  # a refused body or a failed stage: this request's error, the level goes on
        return {"ok": False, "status": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return request_figures(t0, time.perf_counter(), arrivals, durations, done)


async def level(send, concurrency: int, n: int, args: argparse.Namespace) -> dict:
    """``n`` requests (:func:`request_body` 0..n-1), ``concurrency`` at a time, each through ``send(body)`` (a
    coroutine giving :func:`request_figures`' dict): the level's row."""
    sem = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> dict:
        async with sem:
            return await send(request_body(i, args))

    t0 = time.perf_counter()
    results = await asyncio.gather(*(limited(i) for i in range(n)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    row = {"concurrency": concurrency, "requests": n, "ok": len(ok), "wall_s": round(wall, 3)}
    if ok:
        ttfa = [r["ttfa"] for r in ok]
        rtf = [r["rtf"] for r in ok]
        row.update(ttfa_p50_s=round(pct(ttfa, 0.5), 4), ttfa_p99_s=round(pct(ttfa, 0.99), 4),
                   rtf_p50=round(pct(rtf, 0.5), 4), rtf_p99=round(pct(rtf, 0.99), 4),
                   audio_s_per_s=round(sum(r["audio"] for r in ok) / wall, 3),
                   audio_s=round(sum(r["audio"] for r in ok), 3),
                   underruns=sum(r["underruns"] for r in ok), chunks=sum(r["chunks"] for r in ok))
    errors = [r for r in results if not r["ok"]]
    if errors:
        row["errors"] = errors[:3]
    return row


async def served_levels(url: str, args: argparse.Namespace) -> list[dict]:
    """The served side: a warm-up level (1 at a time, 2 requests; not counted), then each ``--concurrency``
    level over HTTP to ``url``."""
    import httpx

    async def at(concurrency: int, n: int) -> dict:
        limits = httpx.Limits(max_connections=concurrency + 4)
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            return await level(lambda body: one(client, url, body), concurrency, n, args)

    await at(1, 2)
    return [await at(c, max(args.min_requests, c)) for c in args.concurrency]


async def inproc_levels(args: argparse.Namespace) -> tuple[list[dict], float]:
    """The in-process side, in this process: the stage graph the server starts for these options
    (``core.serving.server.ServeConfig.graph_config``, ``StageGraph.start``), the warm-up and the levels of
    :func:`served_levels` through :func:`one_inproc`; the graph is shut down before this returns. Returns the
    rows and the graph's start seconds."""
    from core.models import register
    from core.pipeline.config import parse_stage_overrides
    from core.pipeline.graph import StageGraph
    from core.serving.server import ServeConfig
    from omni_backends.registry import select

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # as the server
    cfg = ServeConfig(device=args.device, model=args.model, chunk_frames=args.chunk_frames,
                      stage_overrides=parse_stage_overrides(json.dumps(FIXED_LENGTH)))  # as `serve` reads it
    sel = select(cfg.device)
    register()  # as the server, before the engines start in their threads
    t0 = time.perf_counter()
    graph = await StageGraph.start(cfg.graph_config(sel.name), sel.backend,
                                   say=lambda line: print(line, file=sys.stderr, flush=True))
    startup = time.perf_counter() - t0
    try:
        def send(body: dict):
            return one_inproc(graph, body, args.model_name)

        await level(send, 1, 2, args)
        return [await level(send, c, max(args.min_requests, c), args) for c in args.concurrency], startup
    finally:
        await graph.shutdown()


def run_baseline(times: int, device: str, model_dir: str | None, max_tokens: int) -> list[float]:
    """Wall seconds of ``times`` one-shot ``omni-backends run`` processes (from this checkout)."""
    walls = []
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for i in range(times):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "omni_backends.cli", "run", "--device", device, "--out",
                   os.path.join(tmp, "out"), "--prompt", PROMPTS[i % len(PROMPTS)], "--voice", str(i % 2),
                   "--seed", str(i), "--max-tokens", str(max_tokens)] + (["--model-dir", model_dir] if model_dir else [])
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t0)
    return walls


def inproc_rows(args: argparse.Namespace) -> tuple[list[dict], str, float | None]:
    """The in-process rows (:func:`inproc_levels`) from a child process: this script with ``--inproc-only`` and
    the same checkpoint, device, levels, frames and chunking (``BENCH_RECORD_NESTED``: it writes no record of
    its own). Returns its rows, the command run and its graph's start seconds; a failure is returned as an
    ``error`` row (the served figures stand on their own)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "inproc.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--inproc-only", "--model", args.model, "--device",
               args.device, "--frames", str(args.frames), "--min-requests", str(args.min_requests),
               "--concurrency", *map(str, args.concurrency), "--json", out]
        cmd += ["--chunk-frames", str(args.chunk_frames)] if args.chunk_frames else []
        cmd += ["--unseeded"] if args.unseeded else []
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "BENCH_RECORD_NESTED": "1"}
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        shown = " ".join(cmd[1:-2])  # without the temporary --json
        if not os.path.isfile(out):  # it ended before its report (a failed request is in its rows: exit 1)
            return [{"error": f"exit status {p.returncode}: " + (p.stdout + p.stderr)[-1500:]}], shown, None
        with open(out) as f:
            report = json.load(f)
        return report["levels"], shown, report.get("graph_start_s")


def compare(row: dict, inproc: dict) -> None:
    """Add the in-process row's figures to the served ``row`` (p50 TTFA in ms, p50 RTF, audio-s/s) and the
    ratios served / in-process (rounded to 3 places; absent where either side has no figure)."""
    if "ttfa_p50_s" not in inproc:
        return
    row.update(inproc_ttfa_ms=round(inproc["ttfa_p50_s"] * 1000, 1), inproc_rtf=inproc["rtf_p50"],
               inproc_audio_s_per_s=inproc["audio_s_per_s"])
    for key, served, mine in (("ttfa_vs_inproc", "ttfa_p50_s", "ttfa_p50_s"), ("rtf_vs_inproc", "rtf_p50", "rtf_p50"),
                              ("audio_s_per_s_vs_inproc", "audio_s_per_s", "audio_s_per_s")):
        if row.get(served) is not None and inproc.get(mine):
            row[key] = round(row[served] / inproc[mine], 3)


def check_model(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The checkpoint's facts (``core.models.qwen3_tts.read_checkpoint``: its name, speakers, size), or
    ``ap.error`` naming what is wrong with it -- before any server starts."""
    from core.models.qwen3_tts import read_checkpoint
    from omni_backends.errors import BadInputError

    try:
        ckpt = read_checkpoint(args.model)
    except BadInputError as exc:
        ap.error(f"--model {args.model}: {exc}")
    if not ckpt.speakers:
        ap.error(f"--model {args.model}: a {ckpt.tts_model_type} checkpoint has no speakers; this benchmark sends "
                 "CustomVoice requests (use a CustomVoice checkpoint)")
    return {"name": ckpt.name, "tts_model_type": ckpt.tts_model_type, "speakers": list(ckpt.speakers),
            "tts_model_size": ckpt.config.get("tts_model_size"), "talker_dtype": ckpt.talker_dtype}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, metavar="DIR",
                    help="a Qwen3-TTS checkpoint (released layout) to serve; default: the demo")
    ap.add_argument("--model-dir", default=None, help="the demo models (without --model)")
    ap.add_argument("--url", default=None, help="an already running server (default: start one)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=None,
                    help="default: 1 8 32 (the demo), 1 8 64 (--model, as vLLM-Omni reports)")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16, help="the demo's thinker tokens per request")
    ap.add_argument("--frames", type=int, default=48, help="--model: codec frames per request (fixed length)")
    ap.add_argument("--chunk-frames", type=int, default=None)
    ap.add_argument("--run-baseline", type=int, default=2, help="the demo: one-shot `run` processes to time (0: none)")
    ap.add_argument("--unseeded", action="store_true", help="--model: requests without a seed (default: seed = index)")
    ap.add_argument("--no-inproc", action="store_true", help="--model: the served rows only")
    ap.add_argument("--inproc-only", action="store_true",
                    help="--model: the in-process rows only (the stage graph in this process, no server)")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args()
    from arg_checks import require_in_range, require_usable_device
    from core.pipeline.declarations.demo import TALKER_MAX_MODEL_LEN, THINKER_MAX_MODEL_LEN

    args.concurrency = args.concurrency or ([1, 8, 32] if args.model is None else [1, 8, 64])
    require_in_range(ap, "--concurrency", args.concurrency, 1)
    require_in_range(ap, "--min-requests", args.min_requests, 1)
    require_in_range(ap, "--max-tokens", args.max_tokens, 1, THINKER_MAX_MODEL_LEN - 1)
    require_in_range(ap, "--frames", args.frames, 1, 4095)
    require_in_range(ap, "--run-baseline", args.run_baseline, 0)
    if args.chunk_frames is not None:
        require_in_range(ap, "--chunk-frames", args.chunk_frames, 1, TALKER_MAX_MODEL_LEN)
    if args.model is not None and args.model_dir is not None:
        ap.error("--model (a checkpoint) and --model-dir (the demo models) exclude each other")
    if args.inproc_only and (args.model is None or args.no_inproc or args.url is not None):
        ap.error("--inproc-only needs --model and excludes --no-inproc and --url (it starts no server)")
    model = check_model(ap, args) if args.model is not None else None
    if args.url is None or (args.run_baseline and model is None) or (model and not args.no_inproc):
        require_usable_device(ap, args.device)  # this machine starts engines: its driver must be usable
    if model is not None:
        args.model_name, args.speakers = model["name"], model["speakers"]
    if args.inproc_only:
        return inproc_main(args, model)

    from core.serving.process import ServerProcess

    server = None
    url = args.url
    t_start = time.perf_counter()
    if url is None:
        extra = ["--device", args.device, "--max-concurrency", str(max(args.concurrency) + 8)]
        extra += ["--model-dir", args.model_dir] if args.model_dir else []
        extra += ["--model", args.model, "--stage-overrides", json.dumps(FIXED_LENGTH)] if model else []
        extra += ["--chunk-frames", str(args.chunk_frames)] if args.chunk_frames else []
        env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        server = ServerProcess(extra, env=env, cwd=ROOT).start()
        url = server.url
    startup = time.perf_counter() - t_start
    try:
        rows = asyncio.run(served_levels(url, args))
    finally:
        status = server.stop() if server is not None else None
    walls, inproc, inproc_cmd, inproc_start = [], None, None, None
    if model is None and args.run_baseline:
        walls = run_baseline(args.run_baseline, args.device, args.model_dir, args.max_tokens)
    if model is not None and not args.no_inproc:
        inproc, inproc_cmd, inproc_start = inproc_rows(args)
    per_run = statistics.median(walls) if walls else None
    for row in rows:
        if per_run is not None:
            row["run_one_by_one_s"] = round(per_run * row["requests"], 1)
            row["speedup_vs_run"] = round(per_run * row["requests"] / row["wall_s"], 1)
        for match in [r for r in inproc or [] if r.get("concurrency") == row["concurrency"]][:1]:
            compare(row, match)
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
              "cpus": os.cpu_count(), "device": args.device, "max_tokens": args.max_tokens,
              "server_start_s": round(startup, 1) if server else None, "server_exit_status": status,
              "run_walls_s": [round(w, 1) for w in walls], "levels": rows}
    if model is not None:
        report.update(model=model, frames=args.frames, inproc_command=inproc_cmd, inproc_graph_start_s=inproc_start,
                      inproc_levels=[r for r in inproc or [] if "error" not in r],
                      inproc_errors=[r["error"] for r in inproc or [] if "error" in r])
    cols = ("concurrency", "requests", "ok", "wall_s", "ttfa_p50_s", "ttfa_p99_s", "rtf_p50", "rtf_p99",
            "audio_s_per_s", "underruns")
    cols += (("inproc_ttfa_ms", "inproc_rtf", "inproc_audio_s_per_s", "ttfa_vs_inproc", "rtf_vs_inproc",
              "audio_s_per_s_vs_inproc") if model is not None else ("run_one_by_one_s", "speedup_vs_run"))
    ok = all(r["ok"] == r["requests"] for r in rows) and not (model and not args.no_inproc and (
        report["inproc_errors"] or not all(r["ok"] == r["requests"] for r in report["inproc_levels"])))
    return finish(args, report, rows, cols, ok)


def inproc_main(args: argparse.Namespace, model: dict) -> int:
    """``--inproc-only``: the in-process rows (:func:`inproc_levels`) as this script's report."""
    rows, startup = asyncio.run(inproc_levels(args))
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
              "cpus": os.cpu_count(), "device": args.device, "side": "inproc", "model": model, "frames": args.frames,
              "graph_start_s": round(startup, 1), "levels": rows}
    cols = ("concurrency", "requests", "ok", "wall_s", "ttfa_p50_s", "ttfa_p99_s", "rtf_p50", "rtf_p99",
            "audio_s_per_s", "underruns")
    return finish(args, report, rows, cols, all(r["ok"] == r["requests"] for r in rows))


def finish(args: argparse.Namespace, report: dict, rows: list[dict], cols: tuple[str, ...], ok: bool) -> int:
    """Print the table and the JSON report, write ``--json`` and the record; the exit status (0: every request
    of every level ok)."""
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    from record import write_record

    write_record(__file__, report, device=args.device)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
