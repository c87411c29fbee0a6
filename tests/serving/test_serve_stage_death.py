"""A stage engine that dies under ``omni-backends serve`` (its own server: it does not survive): the engine-core
process of one stage is killed (SIGKILL) while requests are in flight; every in-flight request gets a 503 naming
the stage, ``/health`` stops answering 200, and the server exits with a non-zero status within 10 s -- nothing
hangs."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
import urllib.error
import urllib.request

import pytest

from tests.serving.servers import start_server

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]
psutil = pytest.importorskip("psutil")
httpx = pytest.importorskip("httpx")


def engine_processes(pid: int) -> list:
    """The server's vLLM engine-core processes (vLLM names them ``VLLM::EngineCore``)."""
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in p.name() or any("EngineCore" in a for a in p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def health_status(url: str) -> int | None:
    """/health's status, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def test_killing_a_stage_engine_fails_its_requests_with_503_and_the_server_exits_non_zero(demo_models, test_device):
    server = start_server(demo_models, test_device)
    try:
        engines = engine_processes(server.proc.pid)
        assert len(engines) == 3, [(p.pid, p.name()) for p in engines]  # one per stage

        def request(i: int) -> httpx.Response:
            with httpx.Client(timeout=120) as c:
                return c.post(f"{server.url}/v1/audio/speech", json={
                    "model": "omni-demo", "input": f"request {i}", "voice": "voice-0", "max_tokens": 400})

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(request, i) for i in range(3)]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with urllib.request.urlopen(f"{server.url}/health", timeout=10) as r:
                    if json.load(r)["in_flight"] == 3:
                        break
                time.sleep(0.05)
            victim = engines[0]
            victim.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            statuses = [f.result(timeout=30) for f in futures]
        health_after = health_status(server.url)
        exit_status = server.wait(max(0.0, 10.0 - (time.monotonic() - killed_at)))
        assert [r.status_code for r in statuses] == [503, 503, 503], [r.text for r in statuses]
        assert all(r.json()["error"]["code"] == 503 and "stage" in r.json()["error"]["message"] for r in statuses)
        assert health_after != 200
        assert exit_status is not None and exit_status != 0, server.tail()
    finally:
        server.kill()
