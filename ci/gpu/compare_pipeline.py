"""Check and tabulate the `omni-backends run` matrix of ``ci/gpu/run.sh pipeline``.

    python ci/gpu/compare_pipeline.py DIR

``DIR`` holds one output folder + ``<name>.json`` summary per run
(``v2-graphs``, ``v2-graphs-again``, ``v2-eager``, ``v1-graphs``, ``v1-eager``).
Checks: the same seed gives byte-identical ``out.wav`` (``v2-graphs`` vs
``v2-graphs-again``); per runner, talker codes (all codebooks) with graphs ==
with ``--enforce-eager``; the talker MTP replayed captured graphs in the graph
runs and ran eager in the eager runs. Prints a Markdown table (per stage:
engine start s, peak device memory, vLLM settings) for ``bench/RESULTS.md``.
Exit status 1 if a check fails or a run is missing.
"""

from __future__ import annotations

import json
import os
import sys

RUNS = ("v2-graphs", "v2-graphs-again", "v2-eager", "v1-graphs", "v1-eager")


def _load(d: str, name: str) -> dict | None:
    try:
        with open(os.path.join(d, f"{name}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read(d: str, name: str, file: str) -> bytes | None:
    try:
        with open(os.path.join(d, name, file), "rb") as f:
            return f.read()
    except OSError:
        return None


def main(d: str) -> int:
    runs = {n: _load(d, n) for n in RUNS}
    problems, lines = [], []
    for n, s in runs.items():
        if s is None:
            problems.append(f"{n}: no summary (see {n}.stderr)")
    a, b = _read(d, "v2-graphs", "out.wav"), _read(d, "v2-graphs-again", "out.wav")
    if a is not None and b is not None:
        lines.append(f"same seed, two runs (V2, graphs): out.wav {len(a)} bytes, byte-identical: {a == b}")
        if a != b:
            problems.append("v2-graphs and v2-graphs-again: out.wav differs")
    for r in ("v2", "v1"):
        g, e = _read(d, f"{r}-graphs", "codes.json"), _read(d, f"{r}-eager", "codes.json")
        if g is not None and e is not None:
            same = json.loads(g) == json.loads(e)
            lines.append(f"{r.upper()}: talker codes with graphs == --enforce-eager: {same} ({len(json.loads(g))} frames)")
            if not same:
                problems.append(f"{r}: codes differ between graphs and eager")
    g1, g2 = _read(d, "v1-graphs", "codes.json"), _read(d, "v2-graphs", "codes.json")
    if g1 is not None and g2 is not None:
        lines.append(f"V1 codes == V2 codes (graphs): {json.loads(g1) == json.loads(g2)} (reported, not required)")
    lines += ["", "| run | stage | engine start s | stage s | peak device memory MiB | KV cache MiB | runner | "
                  "compilation | cudagraph mode | async sched | talker MTP |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, s in runs.items():
        if s is None:
            continue
        for stage, st in s["stages"].items():
            eng = st.get("engine", {})
            peak = st.get("peak_device_memory_bytes")
            kv = eng.get("kv_cache_memory_bytes", st.get("kv_cache_memory_bytes"))
            mtp = ""
            if stage == "talker":
                mtp = st.get("talker_mtp", "")
                graph = st.get("talker_mtp_graph") or {}
                if graph:
                    mtp += f" ({graph.get('captured')} graphs, {graph.get('replays')} replays)"
                want = "eager" if n.endswith("eager") else "graph"
                if st.get("talker_mtp") != want:
                    problems.append(f"{n}: talker MTP ran {st.get('talker_mtp')}, expected {want}")
                elif want == "graph" and not graph.get("replays"):
                    problems.append(f"{n}: talker MTP in graph mode but no graph replays counted")
            lines.append(f"| {n} | {stage} | {st.get('engine_start_seconds')} | {st.get('seconds')} | "
                         f"{'-' if peak is None else round(peak / 2**20)} | {'-' if kv is None else round(kv / 2**20)} | "
                         f"{eng.get('model_runner')} | {eng.get('compilation_mode')} | {eng.get('cudagraph_mode')} | "
                         f"{eng.get('async_scheduling')} | {mtp} |")
    print("\n".join(lines))
    for p in problems:
        print("PROBLEM:", p)
    print("pipeline checks:", "FAILED" if problems else "passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
