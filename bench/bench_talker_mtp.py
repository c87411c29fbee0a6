"""Talker MTP head: graph replay vs eager, time per decode step, on one device.

    python bench/bench_talker_mtp.py --device cuda [--batches 1,8,64] [--budget-s 15] [--reps 7]
                                     [--iters N] [--demo-dir DIR] [--out DIR]

The demo talker's MTP head (``core.models.demo.DemoTalkerMTP``, weights ``mtp.*`` from the demo talker's
safetensors, model dtype fp32) runs once per talker decode step on ``[batch, H]`` hidden states and the
sampled codebook-0 ids. Per batch size: the eager module call vs a replay of one graph captured over
persistent inputs (``bench.static_graph.StaticGraph`` on the driver's graph primitive -- the torch-level
primitive vLLM's ``CUDAGraphWrapper``, which the engine uses, is built on), each followed by a device
synchronize; ``reps`` interleaved blocks of ``iters`` calls, median per-call time. The outputs of the two
paths are compared (equal codes).

Time-boxed: the earlier version ran ``iters`` 2000 x ``reps`` 21 x 2 paths x 3 batches = 252,000 timed
calls, each with a synchronize (plus ~1,200 warm-up calls, the vLLM import ``core.models.demo`` pulls in
and the demo models' creation), which went past a 60 s device limit on the H200. Now the measuring time is
``--budget-s`` in all (default 15 s, split evenly over the batch sizes and the two paths): 20 warm-up
calls per path give the per-call cost, from which ``iters`` per block is chosen (at least 10, at most
``--iters`` when given); a progress line per batch goes to stderr. Nothing is asserted about time.

On a driver without static graphs (the cpu driver: ``capabilities().static_graph_modes`` is empty, so
``StaticGraph`` refuses), only the eager path is measured; the graph columns say ``n/a``.

Prints Markdown; ``--out DIR`` writes ``bench_talker_mtp.json`` / ``.md``. Bad input (an option out of
range, ``--device`` without its stack) is one error, exit status 2, before anything is built.
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
# One intra-op thread by default (as bench_core_runner.py): on a shared small CPU box a 2-thread OpenMP region
# stalls whenever another process holds a core. No effect on a GPU's kernels.
os.environ.setdefault("OMP_NUM_THREADS", "1")

WARMUP = 20


def load_mtp(talker_dir: str, device, dtype):
    import torch  # noqa: F401
    from safetensors.torch import load_file

    from core.models.demo import DemoTalkerMTP

    with open(os.path.join(talker_dir, "config.json")) as f:
        cfg = json.load(f)
    mtp = DemoTalkerMTP(cfg["hidden_size"], cfg["vocab_size"], cfg["num_codebooks"])
    weights = load_file(os.path.join(talker_dir, "model.safetensors"))
    mtp.load_state_dict({k[len("mtp."):]: v for k, v in weights.items() if k.startswith("mtp.")})
    return mtp.to(device=device, dtype=dtype).eval(), cfg


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,8,64", help="comma list, each 1..4096")
    ap.add_argument("--budget-s", type=float, default=15.0, help="measuring seconds in all, 0.1..600")
    ap.add_argument("--reps", type=int, default=7, help="interleaved blocks per path, 1..101")
    ap.add_argument("--iters", type=int, default=None, help="at most this many calls per block (default: from budget)")
    ap.add_argument("--demo-dir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        args.batches = [int(x) for x in args.batches.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not args.batches or any(not 1 <= b <= 4096 for b in args.batches):
        ap.error(f"--batches values must be in 1..4096, got {args.batches}")
    if not 0.1 <= args.budget_s <= 600:
        ap.error(f"--budget-s must be in 0.1..600, got {args.budget_s}")
    if not 1 <= args.reps <= 101:
        ap.error(f"--reps must be in 1..101, got {args.reps}")
    if args.iters is not None and args.iters < 1:
        ap.error(f"--iters must be >= 1, got {args.iters}")
    if args.demo_dir is not None and not os.path.isfile(os.path.join(args.demo_dir, "talker", "config.json")):
        ap.error(f"--demo-dir {args.demo_dir}: no talker/config.json there (omit it to create the demo models)")
    from arg_checks import require_usable_device

    args.backend = require_usable_device(ap, args.device, export=True).backend
    return args


def _timed(fn, n: int) -> float:
    """Seconds per call of ``n`` calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _calibrate(fn, target_s: float = 0.02) -> float:
    """Seconds per call of ``fn`` after :data:`WARMUP` calls: doubling blocks until one takes ``target_s``."""
    _timed(fn, WARMUP)
    n = 1
    while True:
        t = _timed(fn, n) * n
        if t >= target_s or n >= 1 << 16:
            return t / n
        n *= 2


def measure_batch(backend, mtp, cfg: dict, b: int, share_s: float, reps: int, iters_cap: int | None, g) -> dict:
    import torch

    from bench.static_graph import StaticGraph

    dev = backend.device()
    hidden = torch.randn(b, cfg["hidden_size"], generator=g).to(dev)
    code0 = torch.randint(0, cfg["vocab_size"], (b,), generator=g).to(dev)
    with torch.inference_mode():
        graph = StaticGraph(backend, mtp, (hidden, code0)) if backend.capabilities().static_graphs else None
        eager_out = mtp(hidden, code0).clone()
        same = None
        if graph is not None:
            graph.replay()
            backend.synchronize()
            same = bool(torch.equal(graph.outputs, eager_out))

        def eager():
            mtp(hidden, code0)
            backend.synchronize()

        def replay():
            graph.replay()
            backend.synchronize()

        paths = [("eager", eager)] + ([("graph", replay)] if graph is not None else [])
        per_call = {name: _calibrate(fn) for name, fn in paths}  # warm-up, then the cost estimate
        iters = max(10, int(share_s / (reps * sum(per_call.values()))))
        if iters_cap is not None:
            iters = min(iters, iters_cap)
        times: dict = {name: [] for name, _ in paths}
        t0 = time.perf_counter()
        for r in range(reps):
            for name, fn in paths[:: 1 if r % 2 == 0 else -1]:
                times[name].append(_timed(fn, iters) * 1e6)
            if r >= 2 and time.perf_counter() - t0 > 2 * share_s:  # the estimate was low (a loaded host): stop early
                reps = r + 1
                break
    e = statistics.median(times["eager"])
    gr = statistics.median(times["graph"]) if graph is not None else None
    return {"batch": b, "eager_us": e, "graph_us": gr, "speedup": (e / gr) if gr else None, "same_codes": same,
            "iters": iters, "reps": reps}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from core.models.create import create_demo_models

    t_start = time.perf_counter()
    backend = args.backend
    demo = args.demo_dir or os.path.join(tempfile.mkdtemp(prefix="bench-mtp-"), "demo")
    if args.demo_dir is None:
        create_demo_models(demo)
    mtp, cfg = load_mtp(os.path.join(demo, "talker"), backend.device(), torch.float32)
    g = torch.Generator(device="cpu").manual_seed(0)
    graphs = backend.capabilities().static_graphs
    share = args.budget_s / len(args.batches)
    print(f"[mtp] set up in {time.perf_counter() - t_start:.1f} s; {args.budget_s:g} s of measuring over batches "
          f"{args.batches} ({'eager + graph' if graphs else 'eager only: no static graphs on ' + backend.name})",
          file=sys.stderr, flush=True)
    rows = []
    for b in args.batches:
        t0 = time.perf_counter()
        rows.append(measure_batch(backend, mtp, cfg, b, share, args.reps, args.iters, g))
        r = rows[-1]
        print(f"[mtp] batch {b}: eager {r['eager_us']:.1f} us"
              + (f", graph {r['graph_us']:.1f} us" if r["graph_us"] is not None else "")
              + f" ({r['reps']} x {r['iters']} calls, {time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": backend.name, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "budget_s": args.budget_s, "reps": args.reps, "hidden": cfg["hidden_size"],
            "codebooks": cfg["num_codebooks"], "graphs": graphs, "wall_s": time.perf_counter() - t_start}
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    lines = [f"talker MTP head ({cfg['num_codebooks'] - 1} residual codebooks, hidden {cfg['hidden_size']}, fp32), "
             f"{info['gpu'] or args.device}, torch {info['torch']}, {info['date']}; median of {args.reps} blocks per "
             f"path, each call + device synchronize, {args.budget_s:g} s of measuring"
             + ("" if graphs else f"; graph n/a: the {backend.name} driver has no static graphs"), "",
             "| batch | eager µs/step | graph replay µs/step | eager/graph | same codes | calls per block |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['eager_us']:.1f} | {fmt(r['graph_us'], '.1f')} | {fmt(r['speedup'], '.2f')} | "
              f"{fmt(r['same_codes'], '')} | {r['iters']} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_talker_mtp.json"), "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=2)
        with open(os.path.join(args.out, "bench_talker_mtp.md"), "w") as f:
            f.write(text + "\n")
    from record import write_record

    write_record(__file__, {"info": info, "rows": rows}, device=backend.name, argv=argv)
    return 0 if all(r["same_codes"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
