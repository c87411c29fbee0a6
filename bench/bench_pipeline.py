"""Issue 25 benchmark: the main job on the stage graph (three AsyncLLM engines started at once) against the
stages' engines started one after another.

Sides, each in fresh processes, in alternating order per round:

- ``graph``:       ``omni-backends run`` (the stage graph): per-stage engine start, generation, wall, and the
                   check wall <= 1.25 x (slowest start + generation) from its summary.json;
- ``serial-async``: the same three ``AsyncLLM`` engines (``core.stage.make_async_engine``, same sizes), started
                   one after another in one process: the serial sum of their starts;
- ``serial-llm``:  the three engines as the pipeline had them before (``core.stage.make_engine``, ``vllm.LLM``,
                   in-process on cpu), one after another: the old serial sum.

    python bench/bench_pipeline.py [--rounds 1] [--max-tokens 32] [--device cpu] [--demo-dir DIR]

Prints a JSON report; paste the figures into bench/RESULTS.md (its pipeline section).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import asyncio, json, os, sys, time
side, demo, device = sys.argv[1], sys.argv[2], sys.argv[3]
from core.pipeline.declarations.demo import ENGINE_KW, TALKER_MAX_MODEL_LEN, THINKER_MAX_MODEL_LEN
from core.pipeline.graph import stage_memory
from core.stage import make_async_engine, make_engine, prepare_device
from core.pipeline.release import release_engine

backend = prepare_device(device).backend
stages = ("thinker", "talker", "code2wav")
dirs = {s: os.path.join(demo, s) for s in stages}
lens = {"thinker": THINKER_MAX_MODEL_LEN, "talker": TALKER_MAX_MODEL_LEN, "code2wav": TALKER_MAX_MODEL_LEN}
mem = stage_memory(backend, {s: dict(ENGINE_KW, model=dirs[s], max_model_len=lens[s]) for s in stages})
eager = not backend.capabilities().static_graphs
kw = dict(ENGINE_KW, seed=0, **({"enforce_eager": True} if eager else {}))
kind = {"thinker": "ar", "talker": "ar", "code2wav": "generation"}
factory = make_async_engine if side == "serial-async" else make_engine
starts = {}
async def main():
    engines = {}
    for s in stages:
        t0 = time.perf_counter()
        extra = {} if s == "thinker" else {"skip_tokenizer_init": True}
        engines[s] = factory(dirs[s], kind=kind[s], device=device, max_model_len=lens[s], **kw, **mem[s], **extra)
        starts[s] = round(time.perf_counter() - t0, 3)
    for s, e in engines.items():
        release_engine(e, s)
asyncio.run(main())
print("RESULT " + json.dumps({"starts": starts, "serial_start_seconds": round(sum(starts.values()), 3)}))
"""


def _env(side: str, device: str) -> dict:
    """The serial sides run their engines as the graph does on the device: on cpu the worker inside its engine
    core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, for ``vllm.LLM`` the old in-process engine); elsewhere vLLM's
    default."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="ERROR")
    if side != "graph" and device == "cpu":
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return env


def run_serial(side: str, demo: str, device: str) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, side, demo, device], capture_output=True, text=True,
                       env=_env(side, device), timeout=1200)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{side} failed:\n{p.stderr[-3000:]}")
    return {**json.loads(line[7:]), "process_seconds": round(time.perf_counter() - t0, 3)}


def run_graph(demo: str, device: str, max_tokens: int) -> dict:
    out = tempfile.mkdtemp(prefix="bench-run-")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "omni_backends.cli", "run", "--device", device, "--model-dir", demo,
                        "--out", out, "--max-tokens", str(max_tokens), "--json"], capture_output=True, text=True,
                       env=_env("graph", device), timeout=1200)
    if p.returncode != 0:
        raise RuntimeError(f"omni-backends run failed:\n{p.stderr[-3000:]}")
    s = json.loads(p.stdout)
    st = s["stages"]
    return {"starts": {k: v["engine_start_seconds"] for k, v in st.items()},
            "generation": {k: v["generation_seconds"] for k, v in st.items()},
            "generation_seconds": s["generation_seconds"], "first_chunk_seconds": s["first_chunk_seconds"],
            "wall_seconds": s["wall_seconds"], "shutdown_seconds": s["shutdown_seconds"],
            "total_seconds": s["total_seconds"], "process_seconds": round(time.perf_counter() - t0, 3),
            "concurrent_start": s["concurrent_start"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--demo-dir", default=None, help="demo models (default: created in a temporary folder)")
    a = ap.parse_args()
    from arg_checks import require_in_range, require_usable_device
    from core.pipeline.declarations.demo import THINKER_MAX_MODEL_LEN

    require_in_range(ap, "--rounds", a.rounds, 1)
    require_in_range(ap, "--max-tokens", a.max_tokens, 1, THINKER_MAX_MODEL_LEN - 1)
    require_usable_device(ap, a.device)
    demo = a.demo_dir
    if demo is None:
        from core.models.create import create_demo_models

        demo = os.path.join(tempfile.mkdtemp(prefix="bench-demo-"), "demo")
        create_demo_models(demo)
    sides = ("graph", "serial-async", "serial-llm")
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(a.rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            print(f"round {r + 1}: {side}", file=sys.stderr, flush=True)
            runs[side].append(run_graph(demo, a.device, a.max_tokens) if side == "graph"
                              else run_serial(side, demo, a.device))
    med = statistics.median
    g = runs["graph"]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": a.device, "rounds": a.rounds,
        "max_tokens": a.max_tokens, "load_average": os.getloadavg(),
        "graph": {"wall_seconds": med(x["wall_seconds"] for x in g),
                  "slowest_start_seconds": med(x["concurrent_start"]["slowest_start_seconds"] for x in g),
                  "graph_start_seconds": med(x["concurrent_start"]["graph_start_seconds"] for x in g),
                  "generation_seconds": med(x["generation_seconds"] for x in g),
                  "first_chunk_seconds": med(x["first_chunk_seconds"] for x in g),
                  "bound_seconds": med(x["concurrent_start"]["bound_seconds"] for x in g),
                  "within_bound": [x["concurrent_start"]["within_bound"] for x in g],
                  "starts": {s: med(x["starts"][s] for x in g) for s in g[0]["starts"]},
                  "stage_generation": {s: med(x["generation"][s] for x in g) for s in g[0]["generation"]},
                  "total_seconds": med(x["total_seconds"] for x in g)},
        **{side: {"serial_start_seconds": med(x["serial_start_seconds"] for x in runs[side]),
                  "starts": {s: med(x["starts"][s] for x in runs[side]) for s in runs[side][0]["starts"]}}
           for side in sides[1:]},
        "runs": runs,
    }
    print(json.dumps(report, indent=2))
    from record import write_record

    write_record(__file__, report, device=a.device)


if __name__ == "__main__":
    main()
