"""Issue 3 bench: the core omni runner vs stock vLLM, same model, same run.

    python bench/bench_core_runner.py [--rounds 20] [--max-tokens 64] [--batches 1,8]
                                      [--output-kind FINAL_ONLY|CUMULATIVE|DELTA]
                                      [--reps 41] [--iters 2000] [--out DIR] [--profile] [--sync-debug]

Runs with ``OMP_NUM_THREADS=1`` unless set (see below), in-process engines.

1. Decode: the demo thinker through our runner (``core.stage.make_engine``:
   omni worker + runner + scheduler + output processor, driver ``cpu``;
   engine ``omni``, which carries every token's hidden state to the caller)
   vs stock vLLM (``vllm.LLM`` on ``core.models.create.stock_thinker_view``:
   the same safetensors as plain ``LlamaForCausalLM``; engine ``stock``).
   ``omni-plain`` is our runner on that same plain ``LlamaForCausalLM`` (no
   multimodal outputs): the runner/worker/scheduler overhead alone.
   ``omni-device`` (by default on a device other than the cpu, where it is
   ``omni`` itself) is ``omni`` with ``make_engine(..., outputs_on_device=True)``:
   the hidden states stay on the device (no host copy and fence per step) and
   reach the caller as device tensors.
   All engines live in this one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
   and run at the same time: each gets the same ``batch`` requests (distinct
   prompts, ``max_tokens``, ``ignore_eos=True``, greedy), one prefill step
   each, then their decode steps alternate (A, B, C, B, C, A, ... the order
   rotating every step), so load from other processes hits all alike. Every
   decode step produces ``batch`` tokens. Per round: decode tokens/s =
   ``batch * steps / sum(step times)``, mean step time. Reported: medians
   over rounds, the ratio of the medians, the median of per-round ratios and
   the median of adjacent-step ratios (stock step / engine step).
   Goal: omni/stock tokens/s >= 0.99.
2. Per-call cost of the Backend's forward-context and buffer-copy paths vs
   calling vLLM directly: ``backend.forward_context(None, cfg, num_tokens=8)``
   vs ``vllm.forward_context.set_forward_context(None, cfg, num_tokens=8)``
   (enter + exit; ``cfg`` = the engine's ``VllmConfig``), and
   ``backend.copy_to_device(buf, n)`` vs ``buf.copy_to_gpu(n)`` on a
   ``backend.make_buffer`` (vLLM ``CpuGpuBuffer``). ``reps`` interleaved
   blocks of ``iters`` calls each; medians of the per-call times.
   Goal: driver/raw <= 1.02.

``--profile`` adds a cProfile of the ``omni`` and ``omni-plain`` decode steps (the largest
batch) listing where the runner's own time goes (this project's ``core/`` and
``omni_backends/`` functions), and, at the smallest and the largest batch, the functions of every package
(vLLM's and PyTorch's too) whose own time per step differs most between ``omni`` and ``omni-plain``
(:func:`profile_diff`, with the sum over this tree's ``core/``; ``omni-device`` - ``omni-plain`` too when it
runs); each engine is profiled once per batch, or ``--profile-reps`` times with each function's median
(:func:`profile_report`).
``--sync-debug`` (CUDA) adds, per engine, the host-device synchronisations of
one run of its decode steps at the largest batch, counted by where they come from (PyTorch's sync debug mode;
a synchronisation the omni runner adds serialises the host with the device and undoes async scheduling's
overlap). Prints Markdown; ``--out DIR`` also writes
``bench_core_runner.json`` / ``.md`` there.

Bad options (``--batches`` / ``--rounds`` / ``--max-tokens`` / ``--reps`` / ``--iters`` out of
range, an unknown ``--device``) are refused by the argument parser, before any engine
starts; so is ``VLLM_USE_V2_MODEL_RUNNER=1`` on a driver whose V2 runner cannot run
(``capabilities().v2_runner``, e.g. ``cpu``: vLLM's V2 runner needs Triton).

On a GPU (``--device cuda``, ``ci/gpu/bench.sh``): ``--dtype bfloat16``,
vLLM's defaults for the device (compilation + CUDA graphs; ``--enforce-eager``
to compare), async scheduling as vLLM sets it, each engine's KV cache sized
for the model (``omni_backends.engine_memory.engine_memory_kw``) so all engines share the
card; ``VLLM_USE_V2_MODEL_RUNNER`` picks V1 / V2. Engines stay in one process
(stepped in turn, as above).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# One intra-op thread by default: on a shared 2-core box a 2-thread OpenMP region
# stalls whenever another process holds one core, which swamps a ~1% effect.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ENGINE_KW = dict(dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=16, seed=0)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: longest prompt of :func:`prompts`; prompt + ``--max-tokens`` must fit ``max_model_len``
MAX_PROMPT = 13
MAX_TOKENS_LIMIT = ENGINE_KW["max_model_len"] - MAX_PROMPT


def engine_kw(args: argparse.Namespace, model: str, batches: list[int]) -> dict:
    """``ENGINE_KW`` on cpu (as before); on another device vLLM's defaults (graphs) unless ``--enforce-eager``,
    ``--dtype``, ``max_num_seqs`` covering the largest batch, and a KV cache sized for the model."""
    if args.device == "cpu" and not args.graphs:
        return dict(ENGINE_KW, dtype=args.dtype, max_num_seqs=max(ENGINE_KW["max_num_seqs"], max(batches)))
    from omni_backends.engine_memory import engine_memory_kw
    from core.stage import prepare_device

    seqs = max(16, max(batches))
    kw = dict(dtype=args.dtype, max_model_len=256, max_num_seqs=seqs, seed=0)
    if args.enforce_eager:
        kw["enforce_eager"] = True
    kw.update(engine_memory_kw(prepare_device(args.device).backend, model, max_model_len=256, max_num_seqs=seqs,
                              dtype=args.dtype))
    return kw


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import torch
    import vllm

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "loadavg_start": os.getloadavg(),
    }


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """``n`` distinct token-id prompts of 6..13 tokens (vocab 512, ids >= 2)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(6 + i % 8)] for i in range(n)]


def _add_batch(llm, batch: int, max_tokens: int, tag: str, output_kind: str) -> None:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False,
                            output_kind=RequestOutputKind[output_kind])
    for i, p in enumerate(prompts(batch)):
        llm.llm_engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)


def measure_decode(engines: dict, batch: int, max_tokens: int, tag: str, output_kind: str = "FINAL_ONLY") -> dict:
    """One run of ``batch`` requests on every engine at once, stepped in turn.

    Every engine gets the same ``batch`` requests; after one prefill step each,
    the engines' decode steps alternate (A, B, C, A, B, C, ... with the order
    rotating every step), so load from other processes hits all engines alike.
    Returns engine -> list of decode step times (s)."""
    names = list(engines)
    for name in names:
        _add_batch(engines[name], batch, max_tokens, f"{tag}-{name}", output_kind)
    gc.collect()
    for name in names:
        engines[name].llm_engine.step()  # prefill (+ the first sampled token)
    steps: dict = {n: [] for n in names}
    cpu: dict = {n: [] for n in names}
    clock, cpu_clock = time.perf_counter, time.thread_time
    k = 0
    while any(engines[n].llm_engine.has_unfinished_requests() for n in names):
        k += 1
        j = k % len(names)
        for name in names[j:] + names[:j]:
            eng = engines[name].llm_engine
            if eng.has_unfinished_requests():
                c0, t0 = cpu_clock(), clock()
                eng.step()
                t1, c1 = clock(), cpu_clock()
                steps[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
    for name, s in steps.items():
        # async scheduling (vLLM's default on CUDA) may take one step more to hand the last tokens back
        if len(s) not in (max_tokens - 1, max_tokens):
            raise RuntimeError(f"{tag}/{name}: expected {max_tokens - 1} decode steps, got {len(s)} (chunked prefill?)")
    return {"wall": steps, "cpu": cpu}


def bench_decode(engines: dict, batches: list[int], rounds: int, max_tokens: int, output_kind: str,
                 warmup: int = 2) -> dict:
    """``engines``: name -> LLM; the one named ``stock`` is the reference.
    Returns {batch: {engine: {tok_s, step_ms, ratio_of_medians, median_paired_ratio, ...}}}."""
    names = list(engines)
    for w in range(warmup):
        for b in batches:
            measure_decode(engines, b, max_tokens, f"warm{w}-b{b}", output_kind)
    per: dict = {b: {n: {"tok_s": [], "step_ms": [], "cpu_step_ms": [], "step_ratio": []} for n in names} for b in batches}
    for r in range(rounds):
        for b in batches:
            m = measure_decode(engines, b, max_tokens, f"r{r}-b{b}", output_kind)
            for name, s in m["wall"].items():
                per[b][name]["tok_s"].append(b * (max_tokens - 1) / sum(s))  # decode tokens / decode step time
                per[b][name]["step_ms"].append(1000 * statistics.fmean(s))
                per[b][name]["cpu_step_ms"].append(1000 * statistics.fmean(m["cpu"][name]))
                # adjacent-in-time step pairs: stock step / this engine's step (> 1: faster than stock)
                per[b][name]["step_ratio"] += [x / y for x, y in zip(m["wall"]["stock"], s)]  # same step index
    result: dict = {}
    for b in batches:
        ref = per[b]["stock"]
        result[b] = {}
        for name in names:
            d = per[b][name]
            paired = [x / y for x, y in zip(d["tok_s"], ref["tok_s"])]
            result[b][name] = {
                "tok_s": statistics.median(d["tok_s"]),
                "step_ms": statistics.median(d["step_ms"]),
                "ratio_of_medians": statistics.median(d["tok_s"]) / statistics.median(ref["tok_s"]),
                "median_paired_ratio": statistics.median(paired),
                "paired_ratio_min_max": [min(paired), max(paired)],
                "median_step_pair_ratio": statistics.median(d["step_ratio"]),
                "cpu_step_ms": statistics.median(d["cpu_step_ms"]),
                # thread CPU time is not inflated when another process preempts this one
                "cpu_ratio": statistics.median(ref["cpu_step_ms"]) / statistics.median(d["cpu_step_ms"]),
                "raw": {k: v for k, v in d.items() if k != "step_ratio"},
            }
    return result


def interleaved(fns: dict, reps: int, iters: int) -> dict:
    """Median per-call time (µs) of each zero-arg callable; ``reps`` blocks of
    ``iters`` calls, the order rotating every block."""
    names = list(fns)
    times: dict = {n: [] for n in names}
    clock = time.perf_counter
    for n in names:  # warm up
        for _ in range(iters // 10 + 1):
            fns[n]()
    for r in range(reps):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            f = fns[n]
            t0 = clock()
            for _ in range(iters):
                f()
            times[n].append((clock() - t0) / iters * 1e6)
    return {n: statistics.median(v) for n, v in times.items()}


def bench_paths(backend, vllm_config, reps: int, iters: int) -> dict:
    import torch
    from vllm.forward_context import set_forward_context

    def raw_fc():
        with set_forward_context(None, vllm_config, num_tokens=8):
            pass

    def drv_fc():
        with backend.forward_context(None, vllm_config, num_tokens=8):
            pass

    out = {"forward_context": interleaved({"raw": raw_fc, "driver": drv_fc}, reps, iters)}
    buf = backend.make_buffer(8192, dtype=torch.int32)
    buf.cpu.copy_(torch.arange(8192, dtype=torch.int32))
    for n in (8, 2048):
        out[f"copy_to_device n={n}"] = interleaved(
            {"raw": lambda n=n: buf.copy_to_gpu(n), "driver": lambda n=n: backend.copy_to_device(buf, n)}, reps, iters
        )
    for v in out.values():
        v["ratio"] = v["driver"] / v["raw"]
    return out


def profile_stats(llm, batch: int, max_tokens: int, output_kind: str, name: str):
    """``pstats.Stats`` (every function) of 3 runs of ``batch`` requests' steps (the prefill step, then the
    decode steps) on ``llm`` alone."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for i in range(3):
        measure_decode({name: llm}, batch, max_tokens, f"prof-{name}-{batch}-{i}", output_kind)
    prof.disable()
    return pstats.Stats(prof)


def profile_omni(stats, top: int = 25) -> str:
    """This project's ``core/`` and ``omni_backends/`` functions of ``stats`` (:func:`profile_stats`), by
    cumulative time (the runner's own cost per step)."""
    import io
    import re

    s = io.StringIO()
    stats.stream = s
    stats.sort_stats("cumulative").print_stats(re.escape(ROOT) + r"/(core|omni_backends)/", top)
    return s.getvalue()


def _short(key: tuple) -> str:
    """``file:line(function)`` of a pstats key, the file relative to this tree or to ``site-packages``."""
    file, line, func = key
    for mark in (ROOT + os.sep, "site-packages" + os.sep):
        if mark in file:
            file = file.split(mark, 1)[1]
            break
    return f"{file}:{line}({func})"


def profile_diff(omni, plain, batch: int, max_tokens: int, top: int = 20) -> str:
    """Where ``omni``'s extra time per step goes, against ``omni-plain`` (the same runner without
    multimodal outputs), over every function (vLLM's and PyTorch's too): ``omni`` / ``plain`` are each
    engine's :func:`profile_stats` at ``batch``; own time (``tottime``) per step in µs, the ``top``
    functions by difference, and the totals. cProfile adds its own cost per call, so the absolute
    figures are inflated; the ranking is what it is for."""
    steps = 3 * max_tokens  # the prefill step and the decode steps of each run
    a, b = omni.stats, plain.stats
    rows = []
    for key in set(a) | set(b):
        ta, na = (a[key][2], a[key][1]) if key in a else (0.0, 0)
        tb, nb = (b[key][2], b[key][1]) if key in b else (0.0, 0)
        rows.append((ta - tb, key, ta, tb, na, nb))
    rows.sort(key=lambda r: r[0], reverse=True)
    total_a = sum(v[2] for v in a.values()) / steps * 1e6
    total_b = sum(v[2] for v in b.values()) / steps * 1e6
    mine = os.path.join(ROOT, "core") + os.sep  # this tree's core/: the omni runner's own functions
    core_a = [(v[2], v[1]) for k, v in a.items() if k[0].startswith(mine)]
    core_b = [(v[2], v[1]) for k, v in b.items() if k[0].startswith(mine)]
    lines = [f"batch {batch}: own time per step (µs, cProfile), omni {total_a:.1f} vs omni-plain {total_b:.1f} "
             f"({total_a - total_b:+.1f}); of it in core/: omni {sum(t for t, _ in core_a) / steps * 1e6:.1f} "
             f"({sum(n for _, n in core_a) / steps:.1f} calls) vs omni-plain {sum(t for t, _ in core_b) / steps * 1e6:.1f} "
             f"({sum(n for _, n in core_b) / steps:.1f} calls); the {top} functions with the largest difference:", "",
             "| function | omni µs/step | omni-plain µs/step | difference | calls/step omni | calls/step omni-plain |",
             "|---|---|---|---|---|---|"]
    for d, key, ta, tb, na, nb in rows[:top]:
        lines.append(f"| `{_short(key)}` | {ta / steps * 1e6:.2f} | {tb / steps * 1e6:.2f} | {d / steps * 1e6:+.2f} "
                     f"| {na / steps:.2f} | {nb / steps:.2f} |")
    return "\n".join(lines) + "\n"


class _MedianStats:
    """The per-function median over several ``pstats.Stats`` (``.stats``: key -> (calls, primitive calls,
    own time, cumulative time, {})): what :func:`profile_diff` reads, with another process's pauses dropped."""

    def __init__(self, runs: list) -> None:
        keys = {k for r in runs for k in r.stats}
        zero = (0, 0, 0.0, 0.0, {})
        self.stats = {k: tuple(statistics.median(r.stats.get(k, zero)[i] for r in runs) for i in range(4)) + ({},)
                      for k in keys}


def profile_report(engines: dict, batches: list[int], max_tokens: int, output_kind: str, reps: int = 1) -> str:
    """The ``--profile`` report: each of ``omni`` / ``omni-plain`` profiled ``reps`` times per batch (the
    smallest and the largest, :func:`profile_stats`; the engines in turn; with ``reps`` > 1 each function's
    median, :class:`_MedianStats`); its ``core/`` and ``omni_backends/`` functions at the largest batch
    (:func:`profile_omni`, the first profile), then :func:`profile_diff` at each of the two batches."""
    names = [n for n in ("omni", "omni-device", "omni-plain") if n in engines]
    sizes = sorted({min(batches), max(batches)})
    runs: dict = {(n, b): [] for b in sizes for n in names}
    for b in sizes:
        for r in range(reps):
            for n in names:
                runs[(n, b)].append(profile_stats(engines[n], b, max_tokens, output_kind, f"{n}-{r}"))
    stats = {k: v[0] if reps == 1 else _MedianStats(v) for k, v in runs.items()}
    parts = [f"#### {n}\n\n" + profile_omni(runs[(n, max(sizes))][0]) for n in names]
    if "omni-plain" in names:
        for n in ("omni", "omni-device"):
            if n in names:
                parts += [(f"{n} - omni-plain, " if n != "omni" else "") + profile_diff(
                    stats[(n, b)], stats[("omni-plain", b)], b, max_tokens) for b in sizes]
    return "\n".join(parts)


def sync_report(llm, batch: int, max_tokens: int, output_kind: str, name: str) -> dict:
    """The host-device synchronisations of one run of ``batch`` requests' decode steps on ``llm`` (CUDA only):
    PyTorch's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``) warns at every synchronising call;
    each is counted by where it came from -- the innermost frame of this project (``core/``, ``omni_backends/``),
    else the innermost vLLM frame. Returns ``{"syncs": n, "steps": decode steps, "where": {location: count},
    "control_syncs": m}``: ``m`` the count of one known synchronising call (``.item()``) made first, in the same
    mode -- 1 when the counter sees syncs at all (0 there makes every count meaningless)."""
    import collections
    import re
    import traceback
    import warnings

    import torch

    where: collections.Counter = collections.Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return shown(message, category, filename, lineno, file, line)
        frames = traceback.extract_stack()[:-1]
        ours = [f for f in frames if re.search(re.escape(ROOT) + r"/(core|omni_backends)/", f.filename)]
        theirs = [f for f in frames if "/vllm/" in f.filename]
        f = (ours or theirs or frames)[-1]
        where[f"{os.path.relpath(f.filename, ROOT) if f.filename.startswith(ROOT) else f.filename.split('/site-packages/')[-1]}:{f.lineno}({f.name})"] += 1

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():  # restores warnings.showwarning on exit
            warnings.simplefilter("always")
            warnings.showwarning = record
            # the positive control: one known synchronising call (a device scalar read on the host) must count
            torch.ones(1, device="cuda").sum().item()
            control = sum(where.values())
            where.clear()
            res = measure_decode({name: llm}, batch, max_tokens, f"sync-{name}", output_kind)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"syncs": sum(where.values()), "steps": len(res["wall"][name]), "where": dict(where.most_common(12)),
            "control_syncs": control}


def _positive(what: str, low: int = 1, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            span = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{what} must be an integer {span}, got {text!r}")
        return value

    return parse


def _batches(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--batches takes distinct positive integers separated by commas "
                                         f"(e.g. 1,8,64), got {text!r}")
    return values


def _check_device(ap: argparse.ArgumentParser, device: str) -> str:
    """The driver name of ``--device``, selected and exported for the engines this process starts; an unknown
    or unusable one is a parser error with the registry's reason (``arg_checks.require_usable_device``)."""
    from arg_checks import require_usable_device

    return require_usable_device(ap, device, export=True).name


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=_positive("--rounds"), default=20)
    ap.add_argument("--max-tokens", type=_positive("--max-tokens", 2, MAX_TOKENS_LIMIT), default=64,
                    help=f"tokens per request, 2..{MAX_TOKENS_LIMIT} (one prefill step, then max_tokens-1 decode steps)")
    ap.add_argument("--batches", type=_batches, default=[1, 8], help="requests per engine, e.g. 1,8,64")
    ap.add_argument("--reps", type=_positive("--reps"), default=41)
    ap.add_argument("--iters", type=_positive("--iters"), default=2000)
    ap.add_argument("--demo-dir", default=None, help="existing demo models (default: created in a temp dir)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--output-kind", default="FINAL_ONLY", choices=["FINAL_ONLY", "CUMULATIVE", "DELTA"],
                    help="RequestOutputKind of the requests (LLM.generate uses FINAL_ONLY; streaming uses the others)")
    ap.add_argument("--control", action="store_true", help="add a second stock engine (A/A control), created last")
    ap.add_argument("--create-order", default=None,
                    help="engines to build, in creation order (the creation order can bias a few %%; see RESULTS.md); "
                         "default omni,omni-plain,stock, with omni-device after omni on a device other than the cpu")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-reps", type=_positive("--profile-reps"), default=1,
                    help="--profile: profiles per engine and batch, the engines in turn; the table is each "
                         "function's median over them (drops another process's pauses on a shared host)")
    ap.add_argument("--sync-debug", action="store_true",
                    help="CUDA: count the host-device synchronisations of each engine's decode steps, by where they "
                         "come from (PyTorch's sync debug mode), largest batch")
    ap.add_argument("--device", default="cpu", help="driver the omni engines run on (default: %(default)s)")
    ap.add_argument("--dtype", default="float32", help="model dtype (GPU: bfloat16)")
    ap.add_argument("--enforce-eager", action="store_true", help="GPU: no compilation / graphs (default: vLLM's)")
    ap.add_argument("--graphs", action="store_true", help="cpu: vLLM's defaults instead of the eager ENGINE_KW")
    ap.add_argument("--both-orders", action="store_true",
                    help="run twice in child processes, engines created in --create-order and reversed; combine")
    args = ap.parse_args(argv)
    args.device = _check_device(ap, args.device)
    if args.create_order is None:
        args.create_order = "omni,omni-plain,stock" if args.device == "cpu" else "omni,omni-device,omni-plain,stock"
    if args.sync_debug and args.device != "cuda":
        ap.error(f"--sync-debug counts CUDA host-device synchronisations: it needs --device cuda, not {args.device!r}")
    return args


def run(args: argparse.Namespace) -> dict:
    """Build the engines in this process and measure; returns the raw result."""
    batches = list(args.batches)

    from core.models.create import create_demo_models, stock_thinker_view
    from core.stage import make_engine, prepare_device

    sel = prepare_device(args.device)  # before any engine: the driver, and whether it runs vLLM's V2 runner
    import vllm.envs as vllm_envs

    if vllm_envs.VLLM_USE_V2_MODEL_RUNNER and not sel.backend.capabilities().v2_runner:
        raise SystemExit(f"VLLM_USE_V2_MODEL_RUNNER=1 but driver {sel.name!r} cannot run vLLM's V2 model runner "
                         "(capabilities().v2_runner is False); unset it or set it to 0 to bench the V1 runner")

    tmp = None
    demo = args.demo_dir
    if demo is None:
        tmp = tempfile.mkdtemp(prefix="bench-core-")
        demo = os.path.join(tmp, "demo")
        create_demo_models(demo)
    thinker = os.path.join(demo, "thinker")
    stock_dir = stock_thinker_view(thinker, os.path.join(tmp or tempfile.mkdtemp(prefix="bench-core-"), "thinker-stock"))

    from vllm import LLM

    from omni_backends.registry import get_backend

    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **machine()}
    kw = engine_kw(args, thinker, batches)
    makers = {
        "omni": lambda: make_engine(thinker, device=args.device, **kw),
        "omni-device": lambda: make_engine(thinker, device=args.device, outputs_on_device=True, **kw),
        "omni-plain": lambda: make_engine(stock_dir, device=args.device, **kw),
        "stock": lambda: LLM(stock_dir, **kw),
        "stock-2": lambda: LLM(stock_dir, **kw),  # a second stock engine: an A/A control
    }
    starts: dict = {}

    def timed(name):
        t0 = time.perf_counter()
        llm = makers[name]()
        starts[name] = round(time.perf_counter() - t0, 2)
        return llm

    order = args.create_order.split(",") + (["stock-2"] if args.control else [])
    if set(order) - set(makers) or "stock" not in order or len(set(order)) != len(order):
        raise SystemExit(f"--create-order takes distinct names from {sorted(makers)} including 'stock'")
    engines = {name: timed(name) for name in order}  # creation order = this order
    info["runners"] = {n: type(e.llm_engine.model_executor.driver_worker.worker.model_runner).__name__
                       for n, e in engines.items()}
    info["engine_start_s"] = starts
    cfg = engines["stock"].llm_engine.vllm_config
    info["engine"] = {"device": args.device, "dtype": str(cfg.model_config.dtype), "kw": {k: v for k, v in kw.items()},
                      "v2": bool(getattr(cfg, "use_v2_model_runner", False)),
                      "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
                      "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode)}

    decode = bench_decode(engines, batches, args.rounds, args.max_tokens, args.output_kind)
    paths = bench_paths(get_backend(), engines["stock"].llm_engine.vllm_config, args.reps, args.iters)
    info["loadavg_end"] = os.getloadavg()
    prof = profile_report(engines, batches, args.max_tokens, args.output_kind, args.profile_reps) \
        if args.profile else None
    syncs = {n: sync_report(llm, max(batches), args.max_tokens, args.output_kind, n)
             for n, llm in engines.items()} if args.sync_debug else None
    return {"info": info, "decode": {str(k): v for k, v in decode.items()}, "paths": paths, "profile": prof,
            "syncs": syncs}


def _decode_table(decode: dict, combined: bool = False) -> list[str]:
    if combined:
        lines = ["| batch | engine | decode tok/s | mean step ms | vs stock: ratio of medians "
                 "| median of adjacent-step ratios | vs stock by CPU time |", "|---|---|---|---|---|---|---|"]
        for b, per in decode.items():
            for name, d in per.items():
                lines.append(f"| {b} | {name} | {d['tok_s']:.0f} | {d['step_ms']:.3f} | {d['ratio_of_medians']:.3f} "
                             f"| {d['median_step_pair_ratio']:.3f} | {d['cpu_ratio']:.3f} |")
        return lines
    lines = ["| batch | engine | decode tok/s | mean step ms | vs stock: ratio of medians | median of per-round ratios "
             "(min..max) | median of adjacent-step ratios | CPU ms/step | vs stock by CPU time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for b, per in decode.items():
        for name, d in per.items():
            lines.append(
                f"| {b} | {name} | {d['tok_s']:.0f} | {d['step_ms']:.3f} | {d['ratio_of_medians']:.3f} "
                f"| {d['median_paired_ratio']:.3f} ({d['paired_ratio_min_max'][0]:.3f}..{d['paired_ratio_min_max'][1]:.3f}) "
                f"| {d['median_step_pair_ratio']:.3f} | {d['cpu_step_ms']:.3f} | {d['cpu_ratio']:.3f} |"
            )
    return lines


def _paths_table(paths: dict) -> list[str]:
    lines = ["| path | raw µs/call | driver µs/call | driver/raw |", "|---|---|---|---|"]
    for name, v in paths.items():
        lines.append(f"| {name} | {v['raw']:.3f} | {v['driver']:.3f} | {v['ratio']:.3f} |")
    return lines


def report(res: dict) -> str:
    info = res["info"]
    head = [
        f"date {info['date']}; {info.get('gpu') or 'no GPU'}; {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
        f"({info['torch_threads']} intra-op threads), vLLM {info['vllm']}, Python {info['python']}; "
        f"load average start {info['loadavg_start'][0]:.2f} end {info['loadavg_end'][0]:.2f}",
        f"engines created in this order: " + ", ".join(f"{n} ({r})" for n, r in info["runners"].items()),
        f"engine: {info.get('engine')}; start s: {info.get('engine_start_s')}",
        "",
    ]
    return "\n".join(head + _decode_table(res["decode"]) + [""] + _paths_table(res["paths"]) + _syncs_table(res))


def _syncs_table(res: dict) -> list[str]:
    """The ``--sync-debug`` counts: per engine, synchronisations per decode step and where they come from."""
    if not res.get("syncs"):
        return []
    rows = ["", "| engine | syncs | decode steps | syncs/step | where (count) | control (1 = counter works) |",
            "|---|---|---|---|---|---|"]
    for name, r in res["syncs"].items():
        where = "; ".join(f"`{k}` {v}" for k, v in r["where"].items()) or "-"
        rows.append(f"| {name} | {r['syncs']} | {r['steps']} | {r['syncs'] / max(1, r['steps']):.2f} | {where} | "
                    f"{r.get('control_syncs', '-')} |")
    return rows


def combine(results: list[dict]) -> dict:
    """Geometric mean of each engine's ratios over runs with different creation
    orders (cancels the creation-position bias to first order); tok/s and step
    times: mean; per-call paths: median of the runs' medians."""
    first = results[0]["decode"]
    decode: dict = {}
    for b in first:
        decode[b] = {}
        for name in first[b]:
            ds = [r["decode"][b][name] for r in results]
            g = lambda key: statistics.geometric_mean([d[key] for d in ds])  # noqa: E731
            decode[b][name] = {
                "tok_s": statistics.fmean(d["tok_s"] for d in ds),
                "step_ms": statistics.fmean(d["step_ms"] for d in ds),
                "ratio_of_medians": g("ratio_of_medians"),
                "median_step_pair_ratio": g("median_step_pair_ratio"),
                "cpu_ratio": g("cpu_ratio"),
            }
    paths = {}
    for name in results[0]["paths"]:
        raw = statistics.median(r["paths"][name]["raw"] for r in results)
        drv = statistics.median(r["paths"][name]["driver"] for r in results)
        paths[name] = {"raw": raw, "driver": drv, "ratio": drv / raw}
    return {"decode": decode, "paths": paths}


def main(argv: list[str] | None = None) -> int:
    from record import NESTED, write_record

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if not args.both_orders:
        res = run(args)
        text = report(res)
        print(text)
        if res["profile"]:
            print("\ncProfile, decode steps (core/ and omni_backends/ functions; then omni - omni-plain, every function):\n"
                  + res["profile"])
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "bench_core_runner.json"), "w") as f:
                json.dump({**res, "argv": argv}, f, indent=2)
            with open(os.path.join(args.out, "bench_core_runner.md"), "w") as f:
                f.write(text + ("\n\n```\n" + res["profile"] + "```\n" if res["profile"] else "\n"))
        write_record(__file__, res, device=args.device, argv=argv)
        return 0
    # one child process per creation order (vLLM engines are per process)
    order = args.create_order.split(",")
    child_argv = [a for a in argv if a != "--both-orders"]
    results, texts = [], []
    with tempfile.TemporaryDirectory(prefix="bench-core-orders-") as d:
        for i, o in enumerate((order, order[::-1])):
            out = os.path.join(d, str(i))
            cmd = [sys.executable, os.path.abspath(__file__), *child_argv, "--create-order", ",".join(o), "--out", out]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, NESTED: "1"})
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
                return proc.returncode
            with open(os.path.join(out, "bench_core_runner.json")) as f:
                results.append(json.load(f))
            texts.append(report(results[-1]))
    comb = combine(results)
    text = "\n\n".join(
        [f"### Creation order {i + 1}\n\n{t}" for i, t in enumerate(texts)]
        + ["### Both orders combined (geometric mean of the ratios)\n\n"
           + "\n".join(_decode_table(comb["decode"], combined=True) + [""] + _paths_table(comb["paths"]))]
    )
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_core_runner.json"), "w") as f:
            json.dump({"runs": results, "combined": comb, "argv": argv}, f, indent=2)
        with open(os.path.join(args.out, "bench_core_runner.md"), "w") as f:
            f.write(text + "\n")
    write_record(__file__, {"runs": results, "combined": comb}, device=args.device, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
