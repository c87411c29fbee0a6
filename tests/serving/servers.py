"""Helpers of the real-server tests: a server process on the real stage graph (the ``--device`` driver) and
``omni-backends run``'s out.wav for a request, both started from this checkout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the environment of every process these tests start: this checkout first, vLLM quiet, 1 GiB KV cache
ENV = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "VLLM_LOGGING_LEVEL": "ERROR",
       "VLLM_CPU_KVCACHE_SPACE": "1"}


def start_server(demo: str, device: str, *extra: str, env: dict | None = None):
    """A started :class:`core.serving.process.ServerProcess` on the ``device`` driver over ``demo`` (``env``: more
    environment for the server process)."""
    from core.serving.process import ServerProcess

    pytest.importorskip("vllm")
    return ServerProcess(["--device", device, "--model-dir", demo, *extra], env={**ENV, **(env or {})},
                         cwd=ROOT).start()


def run_out_wav(demo: str, device: str, out: str, prompt: str, voice: int, seed: int,
                max_tokens: int, *extra: str) -> subprocess.Popen:
    """``omni-backends run`` (from this checkout) writing ``out``/out.wav, with ``extra`` options (the server's
    engine options, e.g. its ``--chunk-frames``); the started process."""
    cmd = [sys.executable, "-m", "omni_backends.cli", "run", "--device", device, "--model-dir", demo, "--out", out,
           "--prompt", prompt, "--voice", str(voice), "--seed", str(seed), "--max-tokens", str(max_tokens), *extra]
    return subprocess.Popen(cmd, env={**os.environ, **ENV}, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def sse_events(lines) -> tuple[list[dict], list[float]]:
    """The JSON events of a server-sent event stream's ``data:`` lines (``lines``: text lines as they arrive)
    and when each arrived (``time.perf_counter()``)."""
    import json
    import time

    events, arrivals = [], []
    for line in lines:
        if line.startswith("data: "):
            arrivals.append(time.perf_counter())
            events.append(json.loads(line[len("data: "):]))
    return events, arrivals


def health(server) -> dict:
    """``GET /health`` of a :class:`~core.serving.process.ServerProcess`'s server: its JSON body (200 or 503)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{server.url}/health", timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)
