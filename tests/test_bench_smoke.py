"""Every benchmark script in ``bench/`` runs, CI-sized, on the cpu driver (a smoke, never a timed assertion).

One row per script (:data:`BENCHES`): tiny options, ``--out DIR`` where the script has it (its JSON file
is read back; ``bench_pipeline.py`` prints its JSON report on stdout instead). Each must exit 0 and write
well-formed JSON with the expected keys, and every number in it must be finite; the listed figures must
be > 0 (a figure that is zero or missing means the measurement did not happen). Nothing compares a time
with a bound. The scripts run as subprocesses, all started at the first test and run concurrently
(measured 2026-12-02 on the shared 2-core box, load average 6-10 from other runs: ~2 min of CPU, 3.2 min
wall for the file; ``bench_pipeline.py`` is the longest, ~1 min alone).

Bad input (:data:`BAD_INPUT`): an option out of range, or ``--device`` naming a driver whose stack is not
installed here (``cuda`` on the cpu box), is one error -- exit status 2 (argparse's), a message naming the
option -- before any engine or checkpoint work (each case returns in seconds). Only the scripts that check
their options are listed; ``bench_core_runner.py`` and ``bench_pipeline.py`` (other owners) do not yet
range-check theirs (``--rounds 0`` ends in ``StatisticsError`` after the engines ran).

``bench_serve.py`` runs with ``--model`` on the tiny Qwen3-TTS checkpoint (written for it): a server and, after it,
the same stage graph in a process of its own (the in-process rows); both sides' figures and their ratios must be
there and > 0.

``bench_qwen3_tts.py`` has a second row, ``--engines async`` (two ``AsyncLLM``, engine cores spawned), which
runs once ``core.stage.make_async_engine`` is in the tree and is skipped, saying so, before.

Every script writes one JSON record of its run (``bench/record.py``: command, commit, date, device, figures); the
smoke points ``BENCH_RESULTS_DIR`` at each run's temporary folder and checks the record holds the script's figures,
and that bad input writes none. :func:`test_every_bench_script_writes_a_record` checks the GPU-only scripts by their
source; the record helper itself is tested without engines (the ``test_record_*`` tests, a second each).

A new script in ``bench/`` must get a row here (or a line in :data:`GPU_ONLY`, the scripts that need CUDA):
:func:`test_every_bench_script_has_a_row` fails otherwise.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
from typing import Any, Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TIMEOUT_S = 600
#: bench/ modules that are helpers, not benchmark scripts
HELPERS = {"static_graph.py", "arg_checks.py", "record.py"}
#: bench scripts without a row yet, and why (each one a gap to close, listed so it is seen)
NOT_YET_SMOKED: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Bench:
    script: str
    args: tuple[str, ...]
    #: the JSON file under --out, or None: the JSON report is the end of stdout
    json_file: str | None
    #: top-level keys the JSON must have
    keys: frozenset[str]
    #: figures that must be present and > 0: (description, getter)
    figures: tuple[tuple[str, Callable[[Any], Any]], ...] = ()
    #: the row's id (default: the script's name)
    name: str | None = None
    #: why this row cannot run in this tree, or None (checked before the scripts start)
    unavailable: Callable[[], str | None] = lambda: None
    #: makes the row's inputs in the given folder before the script starts; returns arguments appended to ``args``
    inputs: Callable[[pathlib.Path], tuple[str, ...]] | None = None

    @property
    def id(self) -> str:
        return self.name or self.script


def _no_async_factory() -> str | None:
    import core.stage

    return None if hasattr(core.stage, "make_async_engine") else "core.stage has no make_async_engine in this tree"


_QWEN3_FIGURES = (("TTFA ms, concurrency 1", lambda d: d["rows"][0]["ttfa_ms"]),
                  ("RTF, concurrency 1", lambda d: d["rows"][0]["rtf"]),
                  ("audio-s/s, concurrency 2", lambda d: d["rows"][1]["audio_s_per_s"]),
                  ("talker engine start s", lambda d: d["info"]["talker_start_s"]),
                  ("talker ms per frame, concurrency 2", lambda d: d["rows"][1]["talker_ms_per_frame"]),
                  ("code2wav ms per chunk, concurrency 2", lambda d: d["rows"][1]["code2wav_ms_per_chunk"]))
_QWEN3_ARGS = ("--size", "tiny", "--device", "cpu", "--frames", "8", "--chunk-frames", "4", "--concurrency", "1,2",
               "--reps", "1")


def _tiny_qwen3_tts(folder: pathlib.Path) -> tuple[str, ...]:
    from tests.fixtures.qwen3_tts.tiny_checkpoint import create_tiny_qwen3_tts

    folder.mkdir()
    return ("--model", create_tiny_qwen3_tts(str(folder / "Qwen3-TTS-tiny-CustomVoice")))


#: bench_serve.py --model: the served rows (over HTTP) and the in-process rows (the same stage graph, no HTTP)
_SERVE_QWEN3_FIGURES = (("served TTFA s, concurrency 1", lambda d: d["levels"][0]["ttfa_p50_s"]),
                        ("served RTF, concurrency 2", lambda d: d["levels"][1]["rtf_p50"]),
                        ("served audio-s/s, concurrency 2", lambda d: d["levels"][1]["audio_s_per_s"]),
                        ("in-process TTFA ms, concurrency 1", lambda d: d["levels"][0]["inproc_ttfa_ms"]),
                        ("in-process RTF, concurrency 1", lambda d: d["levels"][0]["inproc_rtf"]),
                        ("in-process audio-s/s, concurrency 2", lambda d: d["levels"][1]["inproc_audio_s_per_s"]),
                        ("TTFA served / in-process, concurrency 1", lambda d: d["levels"][0]["ttfa_vs_inproc"]),
                        ("RTF served / in-process, concurrency 2", lambda d: d["levels"][1]["rtf_vs_inproc"]),
                        ("audio-s/s served / in-process, concurrency 2",
                         lambda d: d["levels"][1]["audio_s_per_s_vs_inproc"]),
                        ("in-process requests ok, concurrency 2", lambda d: d["inproc_levels"][1]["ok"]),
                        ("in-process graph start s", lambda d: d["inproc_graph_start_s"]))


BENCHES = [
    Bench("bench_core_runner.py", ("--rounds", "1", "--max-tokens", "4", "--batches", "1", "--reps", "3",
                                   "--iters", "20", "--profile"),
          "bench_core_runner.json", frozenset({"info", "decode", "paths", "profile"}),
          (("omni decode tok/s, batch 1", lambda d: d["decode"]["1"]["omni"]["tok_s"]),
           ("forward_context driver µs", lambda d: d["paths"]["forward_context"]["driver"]),
           ("omni - omni-plain profile rows, batch 1",
            lambda d: d["profile"].split("batch 1: own time per step", 1)[1].count("\n| `")))),
    Bench("bench_pipeline.py", ("--rounds", "1", "--max-tokens", "4"), None,
          frozenset({"graph", "serial-async", "serial-llm"}),
          (("stage graph wall s", lambda d: d["graph"]["wall_seconds"]),
           ("stage graph start s", lambda d: d["graph"]["graph_start_seconds"]))),
    Bench("bench_talker_mtp.py", ("--device", "cpu", "--batches", "1,8", "--budget-s", "1", "--reps", "3"),
          "bench_talker_mtp.json", frozenset({"info", "rows"}),
          (("eager µs, batch 1", lambda d: d["rows"][0]["eager_us"]),
           ("eager µs, batch 8", lambda d: d["rows"][1]["eager_us"]))),
    Bench("bench_devices.py", ("--runs", "2", "--warm-runs", "5", "--stock-runs", "0"),
          "bench_devices.json", frozenset({"cold_devices", "warm", "imports", "goal"}),
          (("cold devices median s", lambda d: d["cold_devices"]["median"]),
           ("warm decide median s", lambda d: d["warm"]["decide_median"]))),
    Bench("bench_qwen3_tts.py", _QWEN3_ARGS, "bench_qwen3_tts.json", frozenset({"info", "rows", "anchors"}),
          _QWEN3_FIGURES),
    Bench("bench_qwen3_tts.py", (*_QWEN3_ARGS, "--engines", "async", "--request-seeds", "per-request"),
          "bench_qwen3_tts.json",
          frozenset({"info", "rows", "anchors"}), _QWEN3_FIGURES, name="bench_qwen3_tts.py-async",
          unavailable=_no_async_factory),
    Bench("bench_serve.py", ("--device", "cpu", "--concurrency", "1", "2", "--frames", "4", "--min-requests", "2"),
          None, frozenset({"levels", "inproc_levels", "inproc_errors", "model"}), _SERVE_QWEN3_FIGURES,
          name="bench_serve.py-qwen3-tts", inputs=_tiny_qwen3_tts),
]
#: scripts that need CUDA (one or two GPUs) and run only on the GPU machine, with why
GPU_ONLY = {"bench_cuda.py": "the cuda driver's graph replay and copies (torch CUDA, no vLLM)",
            "two_gpu_check.py": "two GPUs of one host"}

#: (script, arguments, the option the message must name)
BAD_INPUT = [
    ("bench_qwen3_tts.py", ("--frames", "0"), "--frames"),
    ("bench_qwen3_tts.py", ("--concurrency", "1,0"), "--concurrency"),
    ("bench_qwen3_tts.py", ("--request-seeds", "none,sometimes"), "--request-seeds"),
    ("bench_qwen3_tts.py", ("--frames", "8", "--chunk-frames", "9"), "--chunk-frames"),
    ("bench_qwen3_tts.py", ("--device", "cuda"), "--device"),
    ("bench_qwen3_tts.py", ("--runner", "v2", "--device", "cpu"), "--runner"),
    # a folder that is not a Qwen3-TTS checkpoint in the released layout (core.models.qwen3_tts.read_checkpoint)
    ("bench_qwen3_tts.py", ("--model-dir", str(pathlib.Path(__file__).parent)), "--model-dir"),
    ("bench_talker_mtp.py", ("--batches", "0"), "--batches"),
    ("bench_talker_mtp.py", ("--device", "cuda"), "--device"),
    ("bench_talker_mtp.py", ("--budget-s", "0"), "--budget-s"),
    ("bench_devices.py", ("--runs", "0"), "--runs"),
    ("bench_serve.py", ("--device", "cuda"), "--device"),
    ("bench_serve.py", ("--concurrency", "1", "0"), "--concurrency"),
    ("bench_serve.py", ("--max-tokens", "0"), "--max-tokens"),
    ("bench_serve.py", ("--inproc-only",), "--inproc-only"),  # without --model
    ("bench_pipeline.py", ("--device", "cuda"), "--device"),
    ("bench_pipeline.py", ("--rounds", "0"), "--rounds"),
]
#: the option that names a script's output, where it is not ``--out`` (``None``: it only prints its report)
OUTPUT_OPTION = {"bench_serve.py": "--json", "bench_pipeline.py": None}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_BACKENDS_")}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), VLLM_CPU_KVCACHE_SPACE="1",
               OMP_NUM_THREADS="1", OMNI_BACKENDS_DEVICE="cpu")
    return env


def _finite_numbers(obj: Any, path: str = "$") -> list[str]:
    """Paths of non-finite numbers in ``obj``."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _finite_numbers(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _finite_numbers(v, f"{path}[{i}]")]
    return []


def _json_from_stdout(text: str) -> Any:
    """The JSON document that ends ``text`` (a report printed with ``json.dumps(..., indent=2)``)."""
    start = text.rfind("\n{\n") + 1 if not text.startswith("{\n") else 0
    return json.loads(text[start:])


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """``run(row id) -> (returncode, stdout, stderr, out_dir)``; every runnable row this session selected (``-k``
    deselects rows) starts at the first call, concurrently; a row not started then starts when asked for."""
    from omni_backends.testing.plugin import selected_device

    if selected_device(request.config) != "cpu":
        pytest.skip("the bench smoke is the cpu CI's (the GPU runs the benches at size: ci/gpu/run.sh)")
    base = tmp_path_factory.mktemp("bench-smoke")
    procs: dict[str, tuple[subprocess.Popen, pathlib.Path, pathlib.Path]] = {}
    done: dict[str, tuple[int | str, str, str, pathlib.Path]] = {}

    selected = {item.callspec.params["bench"].id for item in request.session.items
                if getattr(item, "originalname", None) == "test_bench_script_runs_and_writes_its_json"
                and hasattr(item, "callspec")}

    def start(ids: set[str]) -> None:
        for b in BENCHES:
            if b.id not in ids or b.id in procs or b.unavailable() is not None:
                continue
            out = base / b.id.removesuffix(".py")
            out.mkdir()
            log = base / f"{b.id}.stderr"
            extra = b.inputs(base / f"{b.id}.inputs") if b.inputs is not None else ()
            args = [sys.executable, str(BENCH / b.script), *b.args, *extra]
            args += ["--out", str(out)] if b.json_file else []
            env = {**_env(), "BENCH_RESULTS_DIR": str(out / "results")}
            with open(log, "w") as err, open(out / "stdout.txt", "w") as so:
                procs[b.id] = (subprocess.Popen(args, cwd=ROOT, env=env, stdout=so, stderr=err, text=True),
                                   out, log)

    def run(name: str):
        if not procs:
            start(selected | {name})
        if name not in procs:
            start({name})
        if name not in done:
            proc, out, log = procs[name]
            try:
                rc: int | str = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
            done[name] = (rc, (out / "stdout.txt").read_text(), log.read_text(), out)
        return done[name]

    request.addfinalizer(lambda: [p.kill() for p, _, _ in procs.values() if p.poll() is None])
    return run


def test_every_bench_script_has_a_row() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")} - HELPERS - set(GPU_ONLY) - set(NOT_YET_SMOKED)
    assert scripts == {b.script for b in BENCHES}, (
        f"bench/ scripts without a smoke row: {sorted(scripts - {b.script for b in BENCHES})}; rows without a "
        f"script: {sorted({b.script for b in BENCHES} - scripts)} (tests/test_bench_smoke.py BENCHES)")


@pytest.mark.slow
@pytest.mark.engine_tier
@pytest.mark.parametrize("bench", BENCHES, ids=[b.id for b in BENCHES])
def test_bench_script_runs_and_writes_its_json(bench: Bench, bench_runs) -> None:
    reason = bench.unavailable()
    if reason is not None:
        pytest.skip(reason)
    rc, stdout, stderr, out = bench_runs(bench.id)
    assert rc == 0, f"bench/{bench.script} {' '.join(bench.args)} exited {rc}:\n{stderr[-4000:]}\n{stdout[-2000:]}"
    if bench.json_file is not None:
        path = out / bench.json_file
        assert path.is_file(), f"{bench.script} wrote no {bench.json_file} under --out ({sorted(os.listdir(out))})"
        data = json.loads(path.read_text())
    else:
        data = _json_from_stdout(stdout)
    assert bench.keys <= set(data), f"{bench.script}: JSON lacks {sorted(bench.keys - set(data))}"
    assert not _finite_numbers(data), f"{bench.script}: non-finite numbers at {_finite_numbers(data)}"
    for what, get in bench.figures:
        value = get(data)
        assert isinstance(value, (int, float)) and value > 0, f"{bench.script}: {what} is {value!r}"
    records = sorted((out / "results").glob("*.json"))
    assert len(records) == 1, f"{bench.script}: {len(records)} records under BENCH_RESULTS_DIR, one expected"
    record = json.loads(records[0].read_text())
    assert record["script"] == f"bench/{bench.script}" and record["device"] == "cpu", record
    assert record["command"].startswith(f"python bench/{bench.script} {' '.join(bench.args)}"), record["command"]
    assert records[0].name.startswith(bench.script.removesuffix(".py") + "-")
    _check_record_provenance(record)
    for what, get in bench.figures:
        assert get(record["figures"]) == get(data), f"{bench.script}: the record's {what} is not the script's"


@pytest.mark.parametrize("script,args,option", BAD_INPUT, ids=[f"{s}{' '.join(a)}" for s, a, _ in BAD_INPUT])
def test_bad_bench_option_is_one_clear_error_before_any_engine(script: str, args: tuple[str, ...], option: str,
                                                               tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    out_option = OUTPUT_OPTION.get(script, "--out")
    where = (out_option, str(out)) if out_option else ()
    records = tmp_path / "results"
    p = subprocess.run([sys.executable, str(BENCH / script), *args, *where], cwd=ROOT,
                       env={**_env(), "BENCH_RESULTS_DIR": str(records)}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, f"{script} {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}"
    last = p.stderr.strip().splitlines()[-1]
    assert "error:" in last and option in last, last
    assert "Traceback" not in p.stderr
    assert not out.exists() and not records.exists()  # nothing written: it stopped before measuring


# ------------------------------------------------------------------ the record every script writes (no engines)
def _git_head() -> str | None:
    p = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 and not (ROOT / ".git-head").exists() else None


def _check_record_provenance(record: dict[str, Any]) -> None:
    import datetime

    assert record["record"] == 1 and set(record) >= {"command", "commit", "dirty", "date", "device", "machine",
                                                     "figures"}, sorted(record)
    head = _git_head()
    if head is not None:
        assert record["commit"] == head, (record["commit"], head)
    datetime.datetime.strptime(record["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert record["machine"]["host"] and record["machine"]["cpus"], record["machine"]


def test_every_bench_script_writes_a_record() -> None:
    """Every script, the GPU-only ones too, calls ``record.write_record`` (read from its source: they cannot run
    here)."""
    missing = []
    for path in sorted(BENCH.glob("*.py")):
        if path.name in HELPERS:
            continue
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", getattr(n.func, "attr", None)) == "write_record"]
        if not calls:
            missing.append(path.name)
    assert not missing, f"bench scripts that write no bench/results record (bench/record.py): {missing}"


@pytest.fixture
def record_module(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path):
    monkeypatch.syspath_prepend(str(BENCH))
    import record

    monkeypatch.setenv(record.DIR_ENV, str(tmp_path / "results"))
    monkeypatch.delenv(record.NESTED, raising=False)
    return record


def test_record_holds_command_commit_date_device_and_figures(record_module, tmp_path: pathlib.Path) -> None:
    path = record_module.write_record(str(BENCH / "bench_devices.py"), {"a": {"b": [1.5, float("nan")]}},
                                      device="cpu", argv=["--runs", "2", "--out", "some dir"])
    assert path is not None and path.parent == tmp_path / "results"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left
    record = json.loads(path.read_text())
    assert record["command"] == "python bench/bench_devices.py --runs 2 --out 'some dir'"
    assert record["figures"] == {"a": {"b": [1.5, None]}}  # NaN is no JSON: null
    assert path.name.startswith("bench_devices-") and path.name.endswith(f"-{record['commit'] or 'nocommit'}.json")
    _check_record_provenance(record)


def test_record_is_not_written_by_a_nested_run_nor_half_written(record_module, tmp_path: pathlib.Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(record_module.NESTED, "1")
    assert record_module.write_record(str(BENCH / "bench_devices.py"), {"x": 1}, device="cpu", argv=[]) is None
    assert not (tmp_path / "results").exists()
    monkeypatch.delenv(record_module.NESTED)
    with pytest.raises(TypeError):
        record_module.write_record(str(BENCH / "bench_devices.py"), {"x": object()}, device="cpu", argv=[])
    assert list((tmp_path / "results").iterdir()) == []


def test_record_names_the_gpu_from_nvidia_smi(record_module, tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark whose engines ran in child processes never initialised CUDA itself: the record names the GPUs
    ``nvidia-smi`` lists (here a stand-in for the tool on ``PATH`` printing its CSV), and says nothing where the
    tool is absent or fails."""
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=name,driver_version ] || exit 3\n"
                   "echo 'NVIDIA H100 80GB HBM3, 570.86.15'\necho 'NVIDIA H100 80GB HBM3, 570.86.15'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    m = record_module.machine()
    assert m["accelerator"] == "NVIDIA H100 80GB HBM3 x2"
    assert m["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15"}] * 2
    path = record_module.write_record(str(BENCH / "bench_devices.py"), {"x": 1}, device="cuda", argv=[])
    assert json.loads(path.read_text())["machine"]["accelerator"] == "NVIDIA H100 80GB HBM3 x2"
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert record_module.nvidia_gpus() is None
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert record_module.nvidia_gpus() is None and record_module.machine()["accelerator"] is None
