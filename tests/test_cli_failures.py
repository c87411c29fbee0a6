"""Every failure of every command is one ``omni-backends: error:`` line and a status of the exit-status table
(README, ``omni_backends.cli.exit_status``); the original traceback only with ``OMNI_BACKENDS_TRACEBACK=1``.

- argv that is not valid UTF-8 is a usage error naming its option (status 2), for every command;
- ``devices --json | head -c 100``: a reader that stops reading is not a failure (status 0);
- a disk that fills while ``run`` writes its outputs: one line, status 1, nothing of the previous outputs lost
  and nothing half-written (``run`` over a graph that starts no engine, ``tests/fakes/fake_graph_run.py``; the
  kernel refuses the write through a file-size limit, RLIMIT_FSIZE, as a full file system would);
- every command, with a failure injected at its top level (its ``func``): the status of the table, one line,
  no traceback -- and the traceback when asked for.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
ENV.pop("OMNI_BACKENDS_TRACEBACK", None)


def _errors(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("omni-backends: error:")]


#: a model folder that does not exist: were the argv check missing, the command fails before any engine starts
NO_MODELS = ["--model-dir", "/nonexistent/omni-backends-models", "--port", "0"]


@pytest.mark.parametrize("argv,option", [
    (["-m", "omni_backends.cli", "run", "--prompt", "\udcff\udcfe hello", *NO_MODELS[:2]], "argument --prompt"),
    (["-m", "omni_backends.cli", "run", "--prompt=ab\udcff", *NO_MODELS[:2]], "argument --prompt"),
    (["-m", "omni_backends.cli", "devices", "--device", "c\udcffpu"], "argument --device"),
    (["-m", "core.serving", "--served-model-name", "\udcff", *NO_MODELS], "argument --served-model-name"),
])
def test_argv_that_is_not_utf8_is_a_usage_error_naming_the_option(argv, option, tmp_path):
    proc = subprocess.run([sys.executable, *[os.fsencode(a) for a in argv]], env=ENV, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    errors = _errors(proc.stderr)
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert option in errors[0] and "not valid UTF-8" in errors[0] and "0xff" in errors[0], errors
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.parametrize("reader,printed", [("head -c 100", 100), ("true", 0)])
def test_a_reader_that_stops_reading_devices_json_is_not_a_failure(tmp_path, reader, printed):
    """``| head -c 100`` (the reader may go away before or after the last write: a race) and ``| true`` (gone
    before the first write: always a broken pipe)."""
    cmd = f"{sys.executable} -m omni_backends.cli devices --device cpu --json | {reader}"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], env=ENV, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout) == printed and _errors(proc.stderr) == []
    assert "BrokenPipe" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def _file_size_limit(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.slow
def test_a_disk_that_fills_while_run_writes_is_one_line_and_nothing_is_lost(tmp_path):
    pytest.importorskip("vllm")
    from core.models.create import create_demo_models

    models = tmp_path / "models"
    create_demo_models(str(models))
    out = tmp_path / "out"
    out.mkdir()
    before = {"out.wav": b"RIFF previous run", "thinker.txt": b"previous\n", "summary.json": b"{}"}
    for name, data in before.items():
        (out / name).write_bytes(data)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fakes" / "fake_graph_run.py"), "--device", "cpu",
                           "--model-dir", str(models), "--out", str(out)], env=ENV, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit(8192))
    errors = _errors(proc.stderr)
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-3000:]
    assert "File too large" in errors[0] and "no room" in errors[0], errors
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous outputs, untouched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".omni-run-")] == []  # no half-written staging


# ------------------------------------------------------------------ every command, a failure at its top level
#: the arguments each command needs to reach its ``func`` (a command missing here fails the test: add it)
COMMAND_ARGS = {"devices": [], "run": [], "serve": [], "demo-model": ["create", "DIR"],
                "check-drift": []}


def _injected(exc: BaseException):
    def func(args):
        raise exc
    return func


def _commands(parser) -> dict:
    """name -> its sub-parser, nested sub-commands as ``demo-model create``'s parser under ``demo-model``."""
    import argparse

    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _leaves(parser) -> list:
    subs = _commands(parser)
    return [leaf for p in subs.values() for leaf in _leaves(p)] if subs else [parser]


FAILURES = [  # (the failure, its status in the table, words of its one line)
    (OSError(errno.ENOSPC, "No space left on device", "/x/out.wav"), 1, ["No space left on device", "/x/out.wav",
                                                                         "no room"]),
    (PermissionError(errno.EACCES, "Permission denied", "/x"), 1, ["Permission denied", "/x"]),
    (RuntimeError("boom"), 1, ["unexpected RuntimeError: boom", "OMNI_BACKENDS_TRACEBACK=1"]),
    (MemoryError(), 1, ["out of memory"]),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), 1, ["Broken pipe"]),  # a socket, not stdout's reader
    ("bad-input", 2, ["bad value"]),
    ("stage-failed", 3, ["the talker stage failed"]),
    ("not-usable", 1, ["not usable"]),
    (KeyboardInterrupt(), 130, []),
]


def _failure(spec):
    from omni_backends.errors import BadInputError, DeviceNotUsableError, StageFailedError

    return {"bad-input": BadInputError("bad value"), "stage-failed": StageFailedError("the talker stage failed",
                                                                                      stage="talker"),
            "not-usable": DeviceNotUsableError("cuda is not usable here")}.get(spec, spec)


@pytest.mark.parametrize("spec,status,words", FAILURES, ids=[str(f[0])[:20] or type(f[0]).__name__ for f in FAILURES])
def test_every_command_maps_a_failure_at_its_top_level_to_the_table(monkeypatch, capsys, spec, status, words):
    from omni_backends import cli

    exc = _failure(spec)
    real = cli.build_parser

    def build_parser(plugins: bool = True):
        parser, errors = real(plugins)
        for leaf in _leaves(parser):
            leaf.set_defaults(func=_injected(exc))
        return parser, errors

    monkeypatch.setattr(cli, "build_parser", build_parser)
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    parser, _ = real(True)
    assert sorted(_commands(parser)) == sorted(COMMAND_ARGS)  # every command is walked
    for name, args in COMMAND_ARGS.items():
        assert cli.main([name, *args]) == status, name
        err = capsys.readouterr().err
        lines = _errors(err)
        if isinstance(exc, KeyboardInterrupt):
            assert lines == [] and "omni-backends: interrupted" in err, (name, err)
            continue
        assert len(lines) == 1 and all(w in lines[0] for w in words), (name, lines)
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")  # asked for: the original traceback above the line
    if not isinstance(exc, KeyboardInterrupt):
        assert cli.main(["devices"]) == status
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and err.rstrip().splitlines()[-1].startswith(
            "omni-backends: error:")


def test_python_m_core_serving_maps_failures_like_the_cli(monkeypatch, capsys):
    import core.serving.cli
    from core.serving.__main__ import main

    monkeypatch.delenv("OMNI_BACKENDS_TRACEBACK", raising=False)
    monkeypatch.setattr(core.serving.cli, "_cmd_serve", _injected(OSError(errno.EADDRINUSE, "Address in use")))
    assert main(["--port", "0"]) == 1
    lines = _errors(capsys.readouterr().err)
    assert len(lines) == 1 and "Address in use" in lines[0]
