"""A server in a child process, for clients on the same host (tests, ``bench/bench_serve.py``):
``python -m core.serving --port 0 ...`` started, its URL read from its ``serving ... on http://...`` line, ready
once ``GET /health`` answers 200. Imports neither vLLM nor torch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Sequence

_READY = re.compile(r"serving .* on (http://\S+) ")


class ServerProcess:
    """``python -m core.serving *args --port 0`` as a child process (its own process group; stderr lines kept
    in ``self.log``). :meth:`start` returns once ``/health`` is 200 (``RuntimeError`` with the log's tail if
    the process exits first or ``timeout`` seconds pass); ``url`` is then ``http://host:port``. :meth:`stop`
    sends SIGTERM and returns the exit status (SIGKILL to the group after ``timeout``)."""

    def __init__(self, args: Sequence[str] = (), env: dict[str, str] | None = None, cwd: str | None = None):
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.log: list[str] = []
        self._url_seen = threading.Event()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            m = _READY.search(line)
            if m and self.url is None:
                self.url = m.group(1)
                self._url_seen.set()

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log[-n:])

    def start(self, timeout: float = 600.0) -> "ServerProcess":
        cmd = [sys.executable, "-m", "core.serving", *self.args]
        if "--port" not in self.args:
            cmd += ["--port", "0"]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env=self.env, cwd=self.cwd, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._url_seen.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the server did not start (exit {self.proc.returncode}):\n{self.tail()}")
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"the server never became healthy (exit {self.proc.returncode}):\n{self.tail()}")

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if still running after ``timeout`` seconds."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM (drain), then the exit status; SIGKILL to its process group after ``timeout`` seconds."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        status = self.wait(timeout)
        if status is None:
            self.kill()
            status = self.proc.wait()
        return status

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
