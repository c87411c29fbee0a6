"""``omni-backends serve`` killed outright (SIGKILL, as the OOM killer does) while a request runs: every process
it started -- the three stages' vLLM engine-core processes, their workers, vLLM's ``multiprocessing`` resource
tracker -- exits within 10 s (``omni_backends.engine_lifetime``), so nothing keeps its memory or a device and a
new server can start in its place."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.serving.servers import start_server

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]
psutil = pytest.importorskip("psutil")
httpx = pytest.importorskip("httpx")

#: the most seconds a process the server started may outlive it
OUTLIVE_S = 10.0


def test_every_process_serve_started_exits_within_10_s_of_a_sigkill_mid_request(demo_models, test_device):
    server = start_server(demo_models, test_device)
    descendants: list = []
    try:
        descendants = psutil.Process(server.proc.pid).children(recursive=True)
        names = [" ".join(p.cmdline()[:3]) or p.name() for p in descendants]
        assert sum("EngineCore" in p.name() or "EngineCore" in n for p, n in zip(descendants, names)) == 3, names

        def request() -> None:
            try:
                with httpx.Client(timeout=120) as c:
                    c.post(f"{server.url}/v1/audio/speech", json={"model": "omni-demo", "input": "a long request",
                                                                   "voice": "voice-0", "max_tokens": 400})
            except httpx.HTTPError:
                pass  # the server is killed under it

        threading.Thread(target=request, daemon=True).start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if httpx.get(f"{server.url}/health", timeout=10).json()["in_flight"] == 1:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the request never reached the stage graph")
        server.proc.send_signal(signal.SIGKILL)  # the server alone, not its process group
        killed_at = time.monotonic()
        server.proc.wait()
        _, alive = psutil.wait_procs(descendants, timeout=OUTLIVE_S)
        waited = time.monotonic() - killed_at
        assert not alive, (f"still running {waited:.1f} s after the server was killed: "
                           + "; ".join(f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in alive if p.is_running()))
    finally:
        server.kill()
        for p in descendants:  # nothing of this test may outlive it, whatever the outcome
            try:
                p.kill()
            except psutil.Error:
                pass
