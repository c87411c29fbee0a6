"""What the server cannot use is one 400 (or 413) with the OpenAI-style body, counted in the metrics, and the server
keeps serving (``core.serving.request_limits``, over the app's fake graph of ``test_app_logic.py``); SIGTERM
drains with 503s while the server keeps listening (``core.serving.draining``). The same over real HTTP:
``test_serve_http.py``."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

pytest.importorskip("torch")

from core.serving.request_limits import decode_json  # noqa: E402
from tests.serving.test_app_logic import GOOD, FakeGraph, _app, _client, _run  # noqa: E402


def _outcomes(state) -> str:
    return "\n".join(line for line in state.metrics.exposition().decode().splitlines()
                     if line.startswith("omni_serve:requests_total"))


@pytest.mark.parametrize("body, param, words", [
    (b"[" * 100000, None, "nested too deeply"),
    (b"{" + b'"a":{' * 50000 + b"}" * 50001, None, "nested too deeply"),
    (json.dumps({**GOOD, "input": "\udcff hello"}).encode(), "input", "lone surrogate"),
    (json.dumps({**GOOD, "voice": "voice-1\ud800"}).encode(), "voice", "lone surrogate"),
    (b'{"model": "omni-demo", "input": "\xff\xfe"}', None, "not UTF-8"),
    (b"", None, "not valid JSON"),
])
def test_a_body_the_server_cannot_use_is_one_counted_400(body, param, words):
    graph = FakeGraph()
    app, state, _ = _app(graph)

    async def go():
        async with _client(app) as c:
            bad = await c.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})
            return bad, await c.post("/v1/audio/speech", json=GOOD)

    bad, ok = _run(go())
    assert bad.status_code == 400, bad.text[:300]
    err = bad.json()["error"]
    assert err["type"] == "BadRequestError" and err["param"] == param and words in err["message"], err
    assert ok.status_code == 200 and graph.started and len(graph.started) == 1
    assert 'outcome="bad_request"} 1.0' in _outcomes(state) and 'outcome="ok"} 1.0' in _outcomes(state)


def test_an_input_the_tokenizer_rejects_is_a_400_naming_input():
    graph = FakeGraph()
    real_check = graph.check

    def check(req):
        if "\x00" in req.text:
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]")
        real_check(req)

    graph.check = check
    app, state, _ = _app(graph)

    async def go():
        async with _client(app) as c:
            return await c.post("/v1/audio/speech", json={**GOOD, "input": "a\x00b"})

    r = _run(go())
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    assert "cannot be tokenized" in r.json()["error"]["message"]
    assert 'outcome="bad_request"} 1.0' in _outcomes(state) and not graph.started


def test_a_body_over_the_limit_is_413_and_read_no_further():
    graph = FakeGraph()
    app, state, _ = _app(graph, max_body_bytes=1000)
    reads: list[int] = []

    async def call(headers: list, chunks: int) -> tuple[int, dict]:
        sent: list[dict] = []

        async def receive():
            reads.append(1)
            return {"type": "http.request", "body": b"x" * 400, "more_body": len(reads) < chunks}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/audio/speech", "headers": headers,
                 "query_string": b"", "root_path": "", "scheme": "http", "server": ("test", 80), "http_version": "1.1"}
        await app(scope, receive, send)
        return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))

    status, body = _run(call([(b"content-length", b"100000000")], 250000))
    assert status == 413 and body["error"]["type"] == "RequestEntityTooLargeError" and reads == []  # none read
    assert "100000000 bytes" in body["error"]["message"] and "--max-body-bytes" in body["error"]["message"]
    status, body = _run(call([], 250000))  # chunked: read until past the limit, then no further
    assert status == 413 and len(reads) == 3
    assert 'outcome="too_large"} 2.0' in _outcomes(state) and not graph.started


def test_a_route_that_raises_is_an_openai_500_and_unknown_paths_are_openai_404():
    graph = FakeGraph()
    graph.running = lambda: 1 / 0
    app, state, _ = _app(graph)

    async def go():
        async with _client(app) as c:
            return await c.get("/health"), await c.get("/v1/nothing"), await c.get("/v1/audio/speech")

    crashed, missing, method = _run(go())
    assert crashed.status_code == 500 and crashed.json()["error"]["type"] == "InternalServerError"
    assert "ZeroDivisionError" in crashed.json()["error"]["message"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    assert method.status_code == 405 and method.json()["error"]["code"] == 405


def test_decode_json_names_the_field_with_a_lone_surrogate():
    with pytest.raises(Exception) as info:
        decode_json(b'{"input": "ok", "voice": {"id": "v\\udcff"}}')
    assert info.value.status == 400 and info.value.param == "voice"
    assert decode_json(b'{"input": "\\ud83d\\ude00"}') == {"input": "\U0001F600"}  # a pair is fine


def test_sigterm_keeps_listening_and_answers_503_until_the_requests_in_flight_are_done():
    uvicorn = pytest.importorskip("uvicorn")
    from core.serving.draining import DrainingServer

    graph = FakeGraph()
    app, state, _ = _app(graph)
    server = DrainingServer(uvicorn.Config(app), state, drain_timeout=60)

    async def go():
        server.handle_exit(signal.SIGTERM, None)
        state.in_flight = 1
        async with _client(app) as c:
            during = (await c.post("/v1/audio/speech", json=GOOD), await c.get("/health"))
        busy = await server.on_tick(1)
        state.in_flight = 0
        return during, busy, await server.on_tick(2)

    (refused, health), busy, done = _run(go())
    assert state.draining and not server.should_exit and busy is False  # still listening while one is in flight
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "ServiceUnavailableError"
    assert health.status_code == 503 and health.json()["status"] == "draining"
    assert done is True and server._captured_signals == [signal.SIGTERM]  # re-raised after the server stops
    server.handle_exit(signal.SIGINT, None)
    assert server.should_exit and server.force_exit  # a second signal stops at once
