"""Issue 5 bench: the cuda driver's graph and buffer paths vs the raw torch calls, same run, ratios.

    python bench/bench_cuda.py [--out DIR] [--quick]

1. Graph replay of a decode-like step (batch 8, 4 layers of RMS norm + gated
   MLP, bf16): through the driver (``StaticGraph`` over ``KitOps.new_graph``
   / ``graph_capture``) vs raw ``torch.cuda.CUDAGraph`` + ``torch.cuda.graph``
   + ``CUDAGraph.replay``. Goal: driver >= 0.98x raw speed.
2. Buffer copies, 64 B .. 256 MiB: H2D through ``KitOps.copy_to_device`` on a
   fenced pinned buffer vs raw ``gpu.copy_(pinned, non_blocking=True)``; D2H
   through ``FencedHostBuffer.copy_to_cpu`` + reading ``.cpu`` vs raw
   ``pinned.copy_(gpu, non_blocking=True)`` + event sync. Both use the same
   tensors. Goal: driver >= 0.95x raw speed.

Timing: host wall clock around ``iters`` operations ending in a synchronize
(the driver's extra cost is host-side: an event record per copy), median of
``reps`` repetitions, raw and driver alternated. Ratio = raw time / driver
time (> 1: the driver is faster). Prints a Markdown table; with ``--out``
also writes ``bench_cuda.json`` and ``bench_cuda.md`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median_pair(fn_raw, fn_drv, reps):
    raw, drv = [], []
    for r in range(reps):
        order = (fn_raw, fn_drv) if r % 2 == 0 else (fn_drv, fn_raw)
        for fn in order:
            t = fn()
            (raw if fn is fn_raw else drv).append(t)
    return statistics.median(raw), statistics.median(drv)


def bench_graph(backend, torch, reps, iters, hidden=2048, batch=8, layers=4):
    from bench.static_graph import StaticGraph

    dev = backend.device()
    g = torch.Generator(device=dev).manual_seed(0)
    ws = [
        (torch.randn(hidden, 4 * hidden, device=dev, generator=g, dtype=torch.bfloat16) / hidden**0.5,
         torch.randn(2 * hidden, hidden, device=dev, generator=g, dtype=torch.bfloat16) / hidden**0.5)
        for _ in range(layers)
    ]

    def step(x):
        for w1, w2 in ws:
            h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
            a, b = (h @ w1).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(a) * b) @ w2
        return x

    x_raw = torch.randn(batch, hidden, device=dev, dtype=torch.bfloat16)
    x_drv = x_raw.clone()
    # raw: the torch recipe
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step(x_raw)
    torch.cuda.current_stream().wait_stream(s)
    graw = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graw):
        out_raw = step(x_raw)
    # driver
    sg = StaticGraph(backend, step, (x_drv,))
    graw.replay()
    sg.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(sg.outputs, out_raw)  # same function, same input

    def run_raw():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            graw.replay()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def run_drv():
        backend.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            sg.replay()
        backend.synchronize()
        return time.perf_counter() - t0

    run_raw(), run_drv()  # warm
    t_raw, t_drv = _median_pair(run_raw, run_drv, reps)
    return {
        "what": f"graph replay, decode step (batch {batch}, hidden {hidden}, {layers} layers, bf16)",
        "raw_us": t_raw / iters * 1e6,
        "driver_us": t_drv / iters * 1e6,
        "ratio": t_raw / t_drv,
    }


def bench_copies(backend, torch, reps, sizes):
    import types

    dev = backend.device()
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        cpu = torch.randn(n).pin_memory()
        gpu = torch.empty(n, device=dev)
        buf = backend.fence_buffer(types.SimpleNamespace(cpu=cpu, gpu=gpu, np=cpu.numpy()))
        iters = max(5, min(2000, int(4e-3 * 50e9 / nbytes)))
        ev = torch.Event(device=dev)

        def loop(op, finish):
            """A timed run: ``iters`` x ``op()``, then ``finish()`` (the wait that makes the data complete)."""

            def run():
                backend.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    op()
                finish()
                return time.perf_counter() - t0

            return run

        def raw_h2d_event():  # the raw copy plus the guard the contract needs (vLLM's prepare_inputs_event pattern)
            gpu.copy_(cpu, non_blocking=True)
            ev.record()

        h2d_raw = loop(lambda: gpu.copy_(cpu, non_blocking=True), lambda: (ev.record(), ev.synchronize()))
        h2d_raw_ev = loop(raw_h2d_event, ev.synchronize)
        h2d_drv = loop(lambda: backend.copy_to_device(buf), buf.wait_host)
        d2h_raw = loop(lambda: cpu.copy_(gpu, non_blocking=True), lambda: (ev.record(), ev.synchronize()))
        d2h_drv = loop(lambda: buf.copy_to_cpu(), lambda: buf.cpu)  # the guarded read waits for the copies

        for fn in (h2d_raw, h2d_raw_ev, h2d_drv, d2h_raw, d2h_drv):
            fn()  # warm
        hr, hd = _median_pair(h2d_raw, h2d_drv, reps)
        he, hd2 = _median_pair(h2d_raw_ev, h2d_drv, reps)
        dr, dd = _median_pair(d2h_raw, d2h_drv, reps)
        # correctness of the measured path: the last copy landed
        cpu.copy_(torch.arange(n, dtype=torch.float32))
        backend.copy_to_device(buf)
        assert torch.equal(buf.gpu.cpu(), torch.arange(n, dtype=torch.float32))
        rows.append({
            "bytes": nbytes, "iters": iters,
            "h2d_raw_GBps": nbytes * iters / hr / 1e9, "h2d_driver_GBps": nbytes * iters / hd / 1e9, "h2d_ratio": hr / hd,
            "h2d_raw_event_GBps": nbytes * iters / he / 1e9, "h2d_ratio_vs_raw_event": he / hd2,
            "d2h_raw_GBps": nbytes * iters / dr / 1e9, "d2h_driver_GBps": nbytes * iters / dd / 1e9, "d2h_ratio": dr / dd,
        })
        del buf, cpu, gpu
    return rows


def bench_event_record(torch, n=20000):
    """Host cost of one event record (the per-copy price of the copy contract), generic vs CUDA event."""
    out = {}
    for name, make in (("torch.Event", lambda: torch.Event(device="cuda")), ("torch.cuda.Event", torch.cuda.Event)):
        ev = make()
        for _ in range(100):
            ev.record()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                ev.record()
            best = min(best, time.perf_counter() - t0)
            torch.cuda.synchronize()
        out[name] = best / n * 1e6
    return out


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for bench_cuda.json / bench_cuda.md")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = ap.parse_args(argv)

    import torch

    from omni_backends.cuda.driver import CudaBackend

    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA device visible to torch; run it on an NVIDIA GPU", file=sys.stderr)
        return 2
    backend = CudaBackend()
    backend.set_device(0)
    reps = 3 if args.quick else 9
    sizes = [64 * 4**i for i in range(12)]  # 64 B .. 256 MiB
    env = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": "python bench/bench_cuda.py" + (" --quick" if args.quick else ""),
    }
    graph = [bench_graph(backend, torch, reps, iters=500),
             bench_graph(backend, torch, reps, iters=2000, hidden=256, layers=1)]
    copies = bench_copies(backend, torch, reps, sizes)
    events = bench_event_record(torch)

    lines = [f"{env['date_utc']} UTC, {env['device']}, torch {env['torch']} (CUDA {env['cuda']}), `{env['command']}`", ""]
    lines += ["| graph path | raw replay µs | driver replay µs | driver speed / raw |", "|---|---|---|---|"]
    lines += [f"| {g['what']} | {g['raw_us']:.1f} | {g['driver_us']:.1f} | {g['ratio']:.3f}x |" for g in graph]
    lines += ["", "| size | H2D raw GB/s | H2D driver GB/s | H2D ratio | H2D raw+event GB/s | H2D ratio vs raw+event "
              "| D2H raw GB/s | D2H driver GB/s | D2H ratio |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [
        f"| {_fmt_bytes(r['bytes'])} | {r['h2d_raw_GBps']:.3f} | {r['h2d_driver_GBps']:.3f} | {r['h2d_ratio']:.3f}x | "
        f"{r['h2d_raw_event_GBps']:.3f} | {r['h2d_ratio_vs_raw_event']:.3f}x | "
        f"{r['d2h_raw_GBps']:.3f} | {r['d2h_driver_GBps']:.3f} | {r['d2h_ratio']:.3f}x |"
        for r in copies
    ]
    lines += ["", "| event record, µs per call | torch.Event | torch.cuda.Event |", "|---|---|---|",
              f"| host wall time, 20000 records | {events['torch.Event']:.2f} | {events['torch.cuda.Event']:.2f} |"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_cuda.json"), "w") as f:
            json.dump({"env": env, "graph": graph, "copies": copies, "event_record_us": events}, f, indent=1)
        with open(os.path.join(args.out, "bench_cuda.md"), "w") as f:
            f.write(text + "\n")
    from record import write_record

    write_record(__file__, {"env": env, "graph": graph, "copies": copies, "event_record_us": events}, device="cuda",
                 argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
