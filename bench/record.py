"""One JSON record per benchmark run, under ``bench/results/``: what ran, at which commit, when, where, and its figures.

Every script in ``bench/`` calls :func:`write_record` once, after it measured, with the same figures it prints or
writes under ``--out``. A record is ``bench/results/<script>-<UTC date and time>-<commit>.json``::

    {"record": 1, "script": "bench/bench_devices.py", "command": "python bench/bench_devices.py --runs 15",
     "commit": "dc7ba6e", "dirty": false, "date": "2026-12-05T01:30:12Z",
     "device": "cpu", "machine": {"host": ..., "platform": ..., "python": ..., "cpus": 2, "accelerator": null,
                                  "torch": "2.13.0+cpu", "vllm": "0.32.0"},
     ... on a GPU machine: "accelerator": "NVIDIA H100 80GB HBM3 x1", "gpus": [{"name": ..., "driver": ...}]
     "figures": {...}}

``commit`` is the short id of ``HEAD`` (or the content of ``.git-head`` where a copy of the tree has no usable
``.git``, as on the lent GPU machine: ``ci/gpu/run.sh`` writes its log headers the same way); ``dirty`` says whether
tracked files differed from it. ``BENCH_RESULTS_DIR`` puts records elsewhere (the smoke test's temporary folder).
A script's own child runs (``bench_core_runner.py --both-orders``) set :data:`NESTED` so that only the parent, which
holds the combined figures, writes one. The file is written whole or not at all (a temporary file, then renamed).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
#: environment variable: the folder records go to instead of ``bench/results/``
DIR_ENV = "BENCH_RESULTS_DIR"
#: environment variable set (to "1") for a benchmark script's own child runs: they write no record
NESTED = "BENCH_RECORD_NESTED"
FORMAT = 1


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def commit() -> tuple[str | None, bool | None]:
    """``(short commit id, tracked files changed)`` of the tree the benchmark ran from; ``(None, None)`` unknown."""
    head = ROOT / ".git-head"
    if head.is_file():
        return head.read_text().strip() or None, None
    sha = _git("rev-parse", "--short", "HEAD")
    if sha is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return sha, (bool(status) if status is not None else None)


def nvidia_gpus() -> list[dict[str, str]] | None:
    """The NVIDIA GPUs ``nvidia-smi`` lists (``--query-gpu=name,driver_version``): ``[{"name", "driver"}, ...]``
    in its order; ``None`` where it is not installed, fails or times out (10 s). Initialises nothing in this
    process (a benchmark's engines run in child processes: its own torch never touched the device)."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    gpus = []
    for line in p.stdout.splitlines():
        name, _, driver = line.rpartition(",") if "," in line else (line, "", "")
        if name.strip():
            gpus.append({"name": name.strip(), "driver": driver.strip()})
    return gpus or None


def machine() -> dict[str, Any]:
    """Host, platform, CPU count, the accelerator, and the torch / vLLM versions where the script already
    imported them (nothing is imported or initialised here). ``accelerator``: ``"<name> x<count>"`` -- from
    torch where this process initialised CUDA, else from ``nvidia-smi`` (:func:`nvidia_gpus`, also kept whole
    as ``gpus`` with the driver version); ``None`` on a machine without either."""
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(),
                            "python": platform.python_version(), "cpus": os.cpu_count(), "accelerator": None}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = getattr(torch, "__version__", None)
        try:
            if torch.cuda.is_initialized():
                info["accelerator"] = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
        except Exception as e:  # a broken device query must not lose the record
            info["accelerator"] = f"unknown ({type(e).__name__})"
    gpus = nvidia_gpus()
    if gpus:
        info["gpus"] = gpus
        if info["accelerator"] is None:
            info["accelerator"] = f"{gpus[0]['name']} x{len(gpus)}"
    vllm = sys.modules.get("vllm")
    if vllm is not None:
        info["vllm"] = getattr(vllm, "__version__", None)
    return info


def write_record(script: str, figures: Mapping[str, Any], *, device: str | None,
                 argv: Sequence[str] | None = None) -> Path | None:
    """Write one record of a benchmark run and return its path (``None`` in a nested run, see :data:`NESTED`).

    ``script`` is the calling script's ``__file__``; ``figures`` its results, JSON-serialisable (non-finite floats
    are written as ``null``, as the records are read by tools that reject ``NaN``); ``device`` the device it
    measured (a driver name such as ``"cpu"`` or ``"cuda"``); ``argv`` its arguments (default ``sys.argv[1:]``).
    Raises ``OSError`` when the folder cannot be written and ``TypeError`` for figures JSON cannot hold."""
    if os.environ.get(NESTED) == "1":
        return None
    argv = list(sys.argv[1:] if argv is None else argv)
    name = Path(script).resolve()
    try:
        shown = name.relative_to(ROOT).as_posix()
    except ValueError:
        shown = name.name
    now = datetime.datetime.now(datetime.timezone.utc)
    sha, dirty = commit()
    record = {"record": FORMAT, "script": shown, "command": shlex.join(["python", shown, *argv]),
              "commit": sha, "dirty": dirty, "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "device": device,
              "machine": machine(), "figures": _finite(figures)}
    folder = Path(os.environ.get(DIR_ENV) or RESULTS_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.stem}-{now.strftime('%Y%m%dT%H%M%SZ')}-{sha or 'nocommit'}.json"
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"bench record: {path}", file=sys.stderr)
    return path


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
