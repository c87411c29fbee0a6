"""Talker MTP head: graph replay vs eager, time per decode step, on one device.

    python bench/bench_talker_mtp.py --device cuda [--batches 1,8,64] [--iters 2000] [--reps 21] [--out DIR]

The demo talker's MTP head (``core.models.demo.DemoTalkerMTP``, weights
``mtp.*`` from the demo talker's safetensors, model dtype fp32) runs once per
talker decode step on ``[batch, H]`` hidden states and the sampled codebook-0
ids. Per batch size: the eager module call vs a replay of one graph captured
over persistent inputs (``bench.static_graph.StaticGraph`` on the
driver's graph primitive -- the torch-level primitive vLLM's
``CUDAGraphWrapper``, which the engine uses, is built on), each followed by a
device synchronize; ``reps`` interleaved blocks of ``iters`` calls, median
per-call time. The outputs of the two paths are compared (equal codes).
Prints Markdown; ``--out DIR`` writes ``bench_talker_mtp.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_mtp(talker_dir: str, device, dtype):
    import torch
    from safetensors.torch import load_file

    from core.models.demo import DemoTalkerMTP

    with open(os.path.join(talker_dir, "config.json")) as f:
        cfg = json.load(f)
    mtp = DemoTalkerMTP(cfg["hidden_size"], cfg["vocab_size"], cfg["num_codebooks"])
    weights = load_file(os.path.join(talker_dir, "model.safetensors"))
    mtp.load_state_dict({k[len("mtp."):]: v for k, v in weights.items() if k.startswith("mtp.")})
    return mtp.to(device=device, dtype=dtype).eval(), cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--demo-dir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from core.models.create import create_demo_models
    from omni_backends.registry import select
    from bench.static_graph import StaticGraph

    backend = select(args.device).backend
    demo = args.demo_dir or os.path.join(tempfile.mkdtemp(prefix="bench-mtp-"), "demo")
    if args.demo_dir is None:
        create_demo_models(demo)
    dev = backend.device()
    mtp, cfg = load_mtp(os.path.join(demo, "talker"), dev, torch.float32)
    g = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        hidden = torch.randn(b, cfg["hidden_size"], generator=g).to(dev)
        code0 = torch.randint(0, cfg["vocab_size"], (b,), generator=g).to(dev)
        with torch.inference_mode():
            graph = StaticGraph(backend, mtp, (hidden, code0))
            eager_out = mtp(hidden, code0).clone()
            graph.replay()
            backend.synchronize()
            same = bool(torch.equal(graph.outputs, eager_out))

            def eager():
                mtp(hidden, code0)
                backend.synchronize()

            def replay():
                graph.replay()
                backend.synchronize()

            times: dict = {"eager": [], "graph": []}
            for fn in (eager, replay):
                for _ in range(args.iters // 10 + 1):
                    fn()
            for r in range(args.reps):
                order = [("eager", eager), ("graph", replay)][:: 1 if r % 2 == 0 else -1]
                for name, fn in order:
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        fn()
                    times[name].append((time.perf_counter() - t0) / args.iters * 1e6)
        e, gr = statistics.median(times["eager"]), statistics.median(times["graph"])
        rows.append({"batch": b, "eager_us": e, "graph_us": gr, "speedup": e / gr, "same_codes": same})
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": args.device, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "iters": args.iters, "reps": args.reps, "hidden": cfg["hidden_size"], "codebooks": cfg["num_codebooks"]}
    lines = [f"talker MTP head ({cfg['num_codebooks'] - 1} residual codebooks, hidden {cfg['hidden_size']}, fp32), "
             f"{info['gpu'] or args.device}, torch {info['torch']}, {info['date']}; median of {args.reps} x "
             f"{args.iters} calls, each + device synchronize", "",
             "| batch | eager µs/step | graph replay µs/step | eager/graph | same codes |", "|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['eager_us']:.1f} | {r['graph_us']:.1f} | {r['speedup']:.2f} | {r['same_codes']} |"
              for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_talker_mtp.json"), "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=2)
        with open(os.path.join(args.out, "bench_talker_mtp.md"), "w") as f:
            f.write(text + "\n")
    return 0 if all(r["same_codes"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
