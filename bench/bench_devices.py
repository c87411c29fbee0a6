"""Benchmark device discovery: ``omni-backends devices`` cold, ``decide()`` warm.

Measures, in one run on this machine:

- cold: wall time of ``omni-backends devices`` in a fresh process (median of
  ``--runs``), with stevedore's entry-point cache warm (the usual case) and
  empty (first run after an install: a fresh ``$XDG_CACHE_HOME`` per run);
- the stock path in the same run, for the ratio: a fresh process that asks
  vLLM which platform it is on (``vllm.platforms.current_platform.device_type``,
  which imports torch and vLLM), and a bare ``python -c pass``;
- warm: ``registry.decide()`` in-process after a first call (median of
  ``--warm-runs``), and ``select()`` once bound;
- which vendor modules (torch, vllm, vllm_ascend, torch_npu,
  intel_extension_for_pytorch, triton) a ``devices`` process imported.

Usage: ``python bench/bench_devices.py [--runs 15] [--stock-runs 5] [--write] [--out DIR] [--check-goal]``;
``--write`` replaces the "## Device discovery" section of bench/RESULTS.md; ``--out DIR`` writes
``bench_devices.json`` / ``.md`` there; ``--stock-runs 0`` skips the stock vLLM figure (each run imports
vLLM, ~9 s on the CI box). Goal: cold ``devices`` <= 0.5 s, no vendor module imported -- reported, and the
exit status only with ``--check-goal`` (1 when missed), so a loaded host never fails a run for time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
HEADING = "## Device discovery"
VENDOR = ("torch", "vllm", "vllm_ascend", "torch_npu", "intel_extension_for_pytorch", "triton")
GOAL_S = 0.5


def _script() -> list[str]:
    script = Path(sys.executable).with_name("omni-backends")
    return [str(script)] if script.exists() else [sys.executable, "-m", "omni_backends.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_BACKENDS_")}
    env.update(extra)
    return env


def _time_process(cmd: list[str], runs: int, env_factory=_env) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds user+sys) of ``runs`` fresh processes running ``cmd``."""
    times, cpu = [], []
    for _ in range(runs):
        env = env_factory()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
        if proc.returncode not in (0, 1):  # 1 = no driver would be selected; still a valid report
            raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    return times, cpu


def _fresh_cache_env() -> dict[str, str]:
    return _env(XDG_CACHE_HOME=tempfile.mkdtemp(prefix="bench-xdg-", dir=os.environ.get("TMPDIR")))


IMPORTS_PROBE = """
import contextlib, io, json, sys
from omni_backends.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["devices"])
print(json.dumps({"rc": rc, "modules": len(sys.modules),
                  "vendor": sorted(m for m in sys.modules if m.partition(".")[0] in %r)}))
"""

WARM = """
import json, statistics, time
from omni_backends import registry
registry.decide()
t = []
for _ in range(%d):
    t0 = time.perf_counter(); sel = registry.decide(); t.append(time.perf_counter() - t0)
s0 = time.perf_counter(); registry.select(); first_select = time.perf_counter() - s0
u = []
for _ in range(1000):
    t0 = time.perf_counter(); registry.select(); u.append(time.perf_counter() - t0)
print(json.dumps({"decide_median": statistics.median(t), "decide_min": min(t), "selected": sel.name,
                  "decide_runs": len(t),
                  "first_select": first_select, "select_bound_median": statistics.median(u)}))
"""

STOCK = "from vllm.platforms import current_platform; current_platform.device_type"


def _stats(measured: tuple[list[float], list[float]]) -> dict[str, float]:
    times, cpu = measured
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times),
            "cpu_median": statistics.median(cpu)}


def measure(runs: int, warm_runs: int, stock_runs: int) -> dict:
    _time_process([*_script(), "devices"], 2)  # warm the OS page cache and stevedore's cache
    out: dict = {
        "load_before": os.getloadavg()[0],
        "cold_devices": _stats(_time_process([*_script(), "devices"], runs)),
        "cold_devices_empty_cache": _stats(_time_process([*_script(), "devices"], runs, _fresh_cache_env)),
        "python_startup": _stats(_time_process([sys.executable, "-c", "pass"], runs)),
    }
    if stock_runs == 0:
        out["stock_vllm_platform"] = {"skipped": "--stock-runs 0"}
    else:
        try:
            out["stock_vllm_platform"] = _stats(_time_process([sys.executable, "-c", STOCK], stock_runs))
        except SystemExit as exc:  # no vLLM here: no stock figure, say so
            out["stock_vllm_platform"] = {"error": str(exc)[:200]}
    probe = subprocess.run([sys.executable, "-c", IMPORTS_PROBE % (VENDOR,)], env=_env(), capture_output=True,
                           text=True, check=True)
    out["imports"] = json.loads(probe.stdout)
    warm = subprocess.run([sys.executable, "-c", WARM % warm_runs], env=_env(), capture_output=True, text=True,
                          check=True)
    out["warm"] = json.loads(warm.stdout)
    out["load_after"] = os.getloadavg()[0]
    return out


def render(res: dict, command: str) -> str:
    ms = lambda s: f"{s * 1000:.1f} ms"  # noqa: E731
    c, e, py = res["cold_devices"], res["cold_devices_empty_cache"], res["python_startup"]
    stock = res["stock_vllm_platform"]
    w, imp = res["warm"], res["imports"]
    lines = [
        HEADING,
        "",
        f"Date: {res['date']} · commit {res.get('commit') or 'not recorded'} · host: {res['host']} · Python {res['python']} · CPU-only box, {os.cpu_count()} "
        f"cores shared with other engineers' test runs (1-min load average {res['load_before']:.1f} before, "
        f"{res['load_after']:.1f} after), so wall times are noisy; CPU time is the steadier figure.",
        "",
        f"Command: `{command}`",
        "",
        "| what | median wall | min | max | n | median CPU (user+sys) |",
        "|---|---|---|---|---|---|",
        f"| `omni-backends devices`, fresh process, stevedore cache warm | {ms(c['median'])} | {ms(c['min'])} | "
        f"{ms(c['max'])} | {c['n']} | {ms(c['cpu_median'])} |",
        f"| same, empty stevedore cache (fresh `$XDG_CACHE_HOME` per run) | {ms(e['median'])} | {ms(e['min'])} | "
        f"{ms(e['max'])} | {e['n']} | {ms(e['cpu_median'])} |",
        f"| bare `python -c pass` (interpreter start-up) | {ms(py['median'])} | {ms(py['min'])} | {ms(py['max'])} | "
        f"{py['n']} | {ms(py['cpu_median'])} |",
    ]
    if "median" in stock:
        lines.append(
            f"| stock: fresh process, `vllm.platforms.current_platform.device_type` | {ms(stock['median'])} | "
            f"{ms(stock['min'])} | {ms(stock['max'])} | {stock['n']} | {ms(stock['cpu_median'])} |"
        )
    lines += [
        f"| `registry.decide()` warm, in-process (discover + probe all + decide) | {ms(w['decide_median'])} | "
        f"{ms(w['decide_min'])} | | {w['decide_runs']} | |",
        f"| `select()` once bound | {w['select_bound_median'] * 1e6:.2f} µs | | | 1000 | |",
        "",
        f"- Goal cold `devices` <= {GOAL_S} s: **{'met' if c['median'] <= GOAL_S else 'NOT met'}** "
        f"({ms(c['median'])}; {ms(c['median'] - py['median'])} above interpreter start-up).",
    ]
    if "median" in stock:
        lines.append(
            f"- Ratio vs the stock path in the same run: `devices` takes {c['median'] / stock['median']:.2f}× the time "
            f"vLLM needs just to resolve its platform ({ms(stock['median'])}), while probing every driver."
        )
    lines += [
        f"- Vendor modules imported by a `devices` process: {', '.join(imp['vendor']) or 'none'} "
        f"(checked: {', '.join(VENDOR)}); {imp['modules']} modules in `sys.modules` in all; would select "
        f"`{w['selected']}`.",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str, path: Path = RESULTS) -> None:
    """Replace (or append) this benchmark's section, keeping every other section."""
    old = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if HEADING in old:
        head, rest = old.split(HEADING, 1)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1:] if nxt >= 0 else ""
        new = head + text + ("\n" + tail if tail else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15, help="fresh processes per cold figure (default 15)")
    ap.add_argument("--warm-runs", type=int, default=50, help="in-process decide() calls (default 50)")
    ap.add_argument("--stock-runs", type=int, default=5, help="fresh processes for the stock vLLM figure (default 5)")
    ap.add_argument("--write", action="store_true", help=f"write the section into {RESULTS.relative_to(ROOT)}")
    ap.add_argument("--out", default=None, help="write bench_devices.json / .md into this directory")
    ap.add_argument("--check-goal", action="store_true", help="exit 1 when the goal is missed (default: report only)")
    args = ap.parse_args(argv)
    for name, lo, hi in (("runs", 1, 100), ("warm_runs", 1, 10000), ("stock_runs", 0, 50)):
        value = getattr(args, name)
        if not lo <= value <= hi:
            ap.error(f"--{name.replace('_', '-')} must be in {lo}..{hi}, got {value}")
    res = measure(args.runs, args.warm_runs, args.stock_runs)
    from record import commit

    res.update(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               host=platform.node(), python=platform.python_version(), commit=commit()[0])
    command = "python bench/bench_devices.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(res, command.strip())
    print(text)
    if args.write:
        write_section(text)
    met = res["cold_devices"]["median"] <= GOAL_S and not res["imports"]["vendor"]
    res["goal"] = {"cold_devices_s": GOAL_S, "met": met}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_devices.json"), "w") as f:
            json.dump(res, f, indent=2)
        with open(os.path.join(args.out, "bench_devices.md"), "w") as f:
            f.write(text + "\n")
    from record import write_record

    write_record(__file__, res, device=res["warm"]["selected"], argv=argv)
    return 1 if args.check_goal and not met else 0


if __name__ == "__main__":
    sys.exit(main())
