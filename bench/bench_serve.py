"""``omni-backends serve`` under load, measured as vLLM-Omni measures its server (``vllm bench serve --omni``): the
demo pipeline against the same requests one by one through ``run``, or a Qwen3-TTS checkpoint (``--model DIR``)
against ``bench/bench_qwen3_tts.py``'s in-process loop on the same checkpoint.

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
  (``max_new_tokens = frames + 1`` and the server's ``--stage-overrides``: the talker's ``ignore_eos`` and no stop token, as
  ``bench_qwen3_tts.py`` fixes its length); the talker's other sampling is the deploy's. Beside each level:
  ``bench_qwen3_tts.py --model-dir DIR`` (two engines in this machine's process, no HTTP) at the same
  concurrencies and frames, unless ``--no-inproc``.

    python bench/bench_serve.py [--device cpu] [--concurrency 1 8 32] [--max-tokens 16] [--run-baseline 2]
                                [--url http://127.0.0.1:8000] [--json OUT.json]
    python bench/bench_serve.py --model DIR [--device cpu] [--concurrency 1 8 64] [--frames 48] [--no-inproc]

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

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
    return {"model": args.model_name, "input": PROMPTS[i % len(PROMPTS)], "voice": args.speakers[i % len(args.speakers)],
            "language": "English", "seed": i, "max_new_tokens": args.frames + 1, "stream": True,
            "response_format": "pcm"}


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
    t1 = time.perf_counter()
    audio = sum(durations)
    underruns, played = 0, 0.0
    for arrival, dur in zip(arrivals, durations):
        if arrival > arrivals[0] + played + 1e-9:
            underruns += 1
        played += dur
    return {"ok": done is not None and audio > 0, "ttfa": arrivals[0] - t0, "latency": t1 - t0, "audio": audio,
            "rtf": (t1 - t0) / audio if audio else None, "underruns": underruns, "chunks": len(arrivals)}


async def level(url: str, concurrency: int, n: int, args: argparse.Namespace) -> dict:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def limited(i: int) -> dict:
            async with sem:
                return await one(client, url, request_body(i, args))

        t0 = time.perf_counter()
        results = await asyncio.gather(*(limited(i) for i in range(n)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    row = {"concurrency": concurrency, "requests": n, "ok": len(ok), "wall_s": round(wall, 3)}
    if ok:
        ttfa = [r["ttfa"] for r in ok]
        rtf = [r["rtf"] for r in ok]
        row.update(ttfa_p50_s=round(pct(ttfa, 0.5), 3), ttfa_p99_s=round(pct(ttfa, 0.99), 3),
                   rtf_p50=round(pct(rtf, 0.5), 3), rtf_p99=round(pct(rtf, 0.99), 3),
                   audio_s_per_s=round(sum(r["audio"] for r in ok) / wall, 3),
                   audio_s=round(sum(r["audio"] for r in ok), 3),
                   underruns=sum(r["underruns"] for r in ok), chunks=sum(r["chunks"] for r in ok))
    errors = [r for r in results if not r["ok"]]
    if errors:
        row["errors"] = errors[:3]
    return row


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


def inproc_rows(args: argparse.Namespace) -> tuple[list[dict], str]:
    """``bench_qwen3_tts.py``'s in-process loop on ``args.model`` at the same concurrencies and frames, with the
    server's chunking (first chunk 1, then 25 frames with 72 of left context: the deploy's): its rows and the
    command run. A failure is returned as an ``error`` row (the served figures stand on their own)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, os.path.join(ROOT, "bench", "bench_qwen3_tts.py"), "--model-dir", args.model,
               "--device", args.device, "--frames", str(args.frames), "--chunk-frames", str(min(25, args.frames)),
               "--first-chunk-frames", "1", "--left-context", "72",
               "--concurrency", ",".join(map(str, args.concurrency)), "--out", tmp]
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "BENCH_RECORD_NESTED": "1"}
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            return [{"error": (p.stdout + p.stderr)[-1500:]}], " ".join(cmd[1:])
        with open(os.path.join(tmp, "bench_qwen3_tts.json")) as f:
            return json.load(f)["rows"], " ".join(cmd[1:])


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
    ap.add_argument("--no-inproc", action="store_true", help="--model: skip bench_qwen3_tts.py's in-process loop")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args()
    from arg_checks import require_in_range, require_usable_device
    from core.pipeline.config import TALKER_MAX_MODEL_LEN, THINKER_MAX_MODEL_LEN

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
    model = check_model(ap, args) if args.model is not None else None
    if args.url is None or (args.run_baseline and model is None) or (model and not args.no_inproc):
        require_usable_device(ap, args.device)  # this machine starts engines: its driver must be usable

    from core.serving.process import ServerProcess

    server = None
    url = args.url
    t_start = time.perf_counter()
    if url is None:
        extra = ["--device", args.device, "--max-concurrency", str(max(args.concurrency) + 8)]
        extra += ["--model-dir", args.model_dir] if args.model_dir else []
        extra += ["--model", args.model, "--stage-overrides",
                  json.dumps({"0": {"default_sampling_params": {"ignore_eos": True, "stop_token_ids": []}}})] if model else []
        extra += ["--chunk-frames", str(args.chunk_frames)] if args.chunk_frames else []
        env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        server = ServerProcess(extra, env=env, cwd=ROOT).start()
        url = server.url
    startup = time.perf_counter() - t_start
    if model is not None:
        args.model_name, args.speakers = model["name"], model["speakers"]
    try:
        asyncio.run(level(url, 1, 2, args))  # warm-up, not counted
        rows = [asyncio.run(level(url, c, max(args.min_requests, c), args)) for c in args.concurrency]
    finally:
        status = server.stop() if server is not None else None
    walls, inproc, inproc_cmd = [], None, None
    if model is None and args.run_baseline:
        walls = run_baseline(args.run_baseline, args.device, args.model_dir, args.max_tokens)
    if model is not None and not args.no_inproc:
        inproc, inproc_cmd = inproc_rows(args)
    per_run = statistics.median(walls) if walls else None
    for row in rows:
        if per_run is not None:
            row["run_one_by_one_s"] = round(per_run * row["requests"], 1)
            row["speedup_vs_run"] = round(per_run * row["requests"] / row["wall_s"], 1)
        match = [r for r in inproc or [] if r.get("concurrency") == row["concurrency"]
                 and r.get("request_seeds", "none") == "none"]
        if match:
            row.update(inproc_ttfa_ms=round(match[0]["ttfa_ms"], 1), inproc_rtf=round(match[0]["rtf"], 3),
                       inproc_audio_s_per_s=round(match[0]["audio_s_per_s"], 3))
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
              "cpus": os.cpu_count(), "device": args.device, "max_tokens": args.max_tokens,
              "server_start_s": round(startup, 1) if server else None, "server_exit_status": status,
              "run_walls_s": [round(w, 1) for w in walls], "levels": rows}
    if model is not None:
        report.update(model=model, frames=args.frames, inproc_command=inproc_cmd,
                      inproc_errors=[r["error"] for r in inproc or [] if "error" in r])
    cols = ("concurrency", "requests", "ok", "wall_s", "ttfa_p50_s", "ttfa_p99_s", "rtf_p50", "rtf_p99",
            "audio_s_per_s", "underruns")
    cols += (("inproc_ttfa_ms", "inproc_rtf", "inproc_audio_s_per_s") if model is not None else
             ("run_one_by_one_s", "speedup_vs_run"))
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    from record import write_record

    write_record(__file__, report, device=args.device)
    return 0 if all(r["ok"] == r["requests"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
