"""Issue 4 benchmark: the pipeline's stages through the omni runner vs stock vLLM.

Stock vLLM can run only the thinker (as plain ``LlamaForCausalLM`` over the
same weights); the talker and code2wav need the omni hooks, so they are
timed through our runner only. Each round runs, in alternating order, one
fresh process per side (engine start + generation timed separately), so
both sides see the same machine state.

    python bench/bench_pipeline.py --rounds 3 [--max-tokens 32] [--demo-dir DIR]

Prints a JSON report; paste the figures into bench/RESULTS.md.
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
import json, os, sys, time
side, demo, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
from vllm import SamplingParams
kw = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0)
if side == "stock":
    from vllm import LLM
    from core.models.create import stock_thinker_view
    llm = LLM(stock_thinker_view(os.path.join(demo, "thinker"), os.path.join(demo, "thinker-stock")), **kw)
else:
    from core.stage import make_engine
    llm = make_engine(os.path.join(demo, "thinker"), device="cpu", **kw)
t1 = time.perf_counter()
p = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
llm.generate(["Hello! Tell me about omni models."], p, use_tqdm=False)  # warm-up
t2 = time.perf_counter()
outs = llm.generate(["Hello! Tell me about omni models."] * 4, p, use_tqdm=False)
t3 = time.perf_counter()
print("RESULT " + json.dumps({"start_s": t1 - t0, "generate_s": t3 - t2,
                              "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}))
"""


def run_side(side: str, demo: str, max_tokens: int) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="ERROR")
    p = subprocess.run([sys.executable, "-c", CHILD, side, demo, str(max_tokens)], capture_output=True, text=True,
                       env=env, timeout=600)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{side} failed:\n{p.stderr[-3000:]}")
    return json.loads(line[7:])


def run_pipeline_once(demo: str, max_tokens: int) -> dict:
    out = tempfile.mkdtemp(prefix="bench-run-")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "omni_backends.cli", "run", "--model-dir", demo, "--out", out,
                        "--max-tokens", str(max_tokens), "--json"], capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    summary = json.loads(p.stdout)
    return {"wall_s": wall, "stages": {k: v["seconds"] for k, v in summary["stages"].items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--demo-dir", default=None)
    args = ap.parse_args()
    demo = args.demo_dir
    if demo is None:
        from core.models.create import create_demo_models

        demo = os.path.join(tempfile.mkdtemp(prefix="bench-demo-"), "demo")
        create_demo_models(demo)
    res: dict[str, list[dict]] = {"stock": [], "omni": []}
    for r in range(args.rounds):
        order = ("stock", "omni") if r % 2 == 0 else ("omni", "stock")
        for side in order:
            res[side].append(run_side(side, demo, args.max_tokens))
            print(f"round {r} {side}: {res[side][-1]}", file=sys.stderr)
    med = {s: {k: statistics.median(x[k] for x in v) for k in ("start_s", "generate_s")} for s, v in res.items()}
    pipeline = run_pipeline_once(demo, args.max_tokens)
    report = {
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "thinker_median": med,
        "thinker_generate_ratio_omni_over_stock": med["omni"]["generate_s"] / med["stock"]["generate_s"],
        "thinker_start_ratio_omni_over_stock": med["omni"]["start_s"] / med["stock"]["start_s"],
        "pipeline_run": pipeline,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
