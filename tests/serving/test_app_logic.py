"""The speech app's own logic over a fake stage graph: request checks (400 / 404 with an OpenAI-style body and no
engine work), the concurrency limit (429), a failed or dead stage (503, /health), the framing of WAV / PCM / SSE,
closing the synthesis when a request ends, metrics. The fake stands in for the graph ONLY to test the app; that
serving works is shown over real HTTP on the real stage graph (tests/serving/test_serve_http.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave

import httpx
import pytest

torch = pytest.importorskip("torch")

from core.pipeline.declarations.demo import DEMO, SpeechRequest, check_request, parse_speech  # noqa: E402
from core.pipeline.fields import MAX_INPUT_CHARS  # noqa: E402
from core.pipeline.graph.requests import AudioChunk, SpeechResult  # noqa: E402
from core.pipeline.spec import ChunkWindow, PipelineModel  # noqa: E402
from core.serving.app import ServerState, build_app  # noqa: E402
from core.serving.metrics import ServingMetrics  # noqa: E402
from omni_backends.errors import StageFailedError  # noqa: E402


class FakeGraph:
    """Chunks of ``chunk`` samples; ``gate`` holds synthesis until set; ``fail_at`` raises StageFailedError
    before that chunk; ``dead_stage`` as the graph's. Its ``spec`` is the demo's declaration (whose speech
    adapter parses the body), its ``model`` the demo's three voices. Checks a request with the stage graph's own
    check (``check_request``; a text with "too long" in it counts 700 thinker tokens). Records checks, starts and
    closes; yields the graph's own ``AudioChunk`` / ``SpeechResult``."""

    sample_rate = 16000
    num_voices = 3
    voices = ["voice-0", "voice-1", "voice-2"]
    spec = DEMO
    model = PipelineModel(model_dir="fake", sample_rate=16000, samples_per_frame=160, voices=voices,
                          window=ChunkWindow(16, 16))

    def __init__(self, n_chunks: int = 3, chunk: int = 5):
        self.n_chunks, self.chunk = n_chunks, chunk
        self.gate: asyncio.Event | None = None
        self.fail_at: int | None = None
        self.crash_at: int | None = None
        self.dead_stage: str | None = None
        self.checked: list[SpeechRequest] = []
        self.started: list[str] = []
        self.closed: list[str] = []

    def check(self, req: SpeechRequest, request_id: str | None = None) -> None:
        self.checked.append(req)
        check_request(req, num_voices=self.num_voices, in_flight=set(self.started) - set(self.closed),
                      count_tokens=lambda text: 700 if "too long" in text else len(text.split()))

    def samples(self, req: SpeechRequest, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(req.seed * 100 + req.voice * 10 + i)
        return torch.rand(self.chunk, generator=g) * 2.4 - 1.2  # some beyond [-1, 1]: pcm16 clips

    async def synthesize(self, req: SpeechRequest, request_id: str | None = None):
        assert request_id == req.request_id  # the app names the request once, for both
        self.started.append(req.request_id)
        try:
            for i in range(self.n_chunks):
                if self.gate is not None:
                    await self.gate.wait()
                if self.crash_at == i:
                    raise RuntimeError("shape '[144, -1]' is invalid for input of size 2560")
                if self.fail_at == i:
                    raise StageFailedError("the talker stage failed: its engine core died", stage="talker")
                await asyncio.sleep(0)
                yield AudioChunk(i, self.samples(req, i), torch.zeros(2, 4, dtype=torch.int64), 1.0 + i)
            yield SpeechResult(req.request_id, "txt", 4, 8, torch.zeros(2 * self.n_chunks, 4, dtype=torch.int64),
                         self.n_chunks * self.chunk, {"thinker": 0.1, "talker": 0.2, "code2wav": 0.1,
                                                      "first_chunk": 0.3, "total": 0.5})
        finally:
            self.closed.append(req.request_id)

    def running(self) -> dict[str, set[str]]:
        live = set(self.started) - set(self.closed)
        return {"thinker": live, "talker": live, "code2wav": live}


def _app(graph: FakeGraph, **kw):
    dead: list[str] = []
    state = ServerState(model_name="omni-demo", on_stage_dead=dead.append,
                        metrics=ServingMetrics(), **kw)
    return build_app(graph, state), state, dead


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _run(coro):
    return asyncio.run(coro)


def _sse_events(response) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in response.text.split("\n\n") if line]


GOOD = {"model": "omni-demo", "input": "hello there", "voice": "voice-1", "seed": 7}


def _with_faults(fault: str, then) -> tuple:
    """A fresh app over a fresh fake: with the fake's ``fault`` (``fail_at`` / ``crash_at``) at chunk 0, a whole
    response and a PCM stream; at chunk 1 (after the first chunk went out), an SSE stream; then the fault
    cleared and ``await then(client, graph)``. Returns the graph, the state, the dead-stage calls, the three
    responses and what ``then`` returned."""
    graph = FakeGraph()
    app, state, dead = _app(graph)

    async def go():
        async with _client(app) as c:
            setattr(graph, fault, 0)
            whole = await c.post("/v1/audio/speech", json=GOOD)
            streamed = await c.post("/v1/audio/speech", json={**GOOD, "stream": True})
            setattr(graph, fault, 1)
            sse = await c.post("/v1/audio/speech", json={**GOOD, "stream_format": "sse"})
            setattr(graph, fault, None)
            return whole, streamed, sse, await then(c, graph)

    return (graph, state, dead, *_run(go()))


@pytest.mark.parametrize("change, param, words", [
    ({"input": ""}, "input", "empty"),
    ({"input": "   "}, "input", "empty"),
    ({"input": "x" * (MAX_INPUT_CHARS + 1)}, "input", "limit"),
    ({"input": 5}, "input", "text"),
    ({"voice": "alloy"}, "voice", "voice-0, voice-1, voice-2"),
    ({"voice": "voice-3"}, "voice", "unknown voice"),
    ({"voice": {"id": "voice-9"}}, "voice", "unknown voice"),
    ({"response_format": "mp3"}, "response_format", "wav, pcm"),
    ({"speed": 1.5}, "speed", "1.0"),
    ({"speed": "fast"}, "speed", "1.0"),
    ({"seed": -1}, "seed", "0..4294967295"),
    ({"seed": 2**32}, "seed", "0..4294967295"),
    ({"seed": 1.5}, "seed", "integer"),
    ({"seed": True}, "seed", "integer"),
    ({"max_tokens": 0}, "max_tokens", "1..511"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"stream_format": "ogg"}, "stream_format", "audio, sse"),
    ({"stream": True, "response_format": "wav"}, "response_format", "pcm"),
    ({"instructions": "whisper"}, "instructions", "not supported"),
    ({"colour": "blue"}, "colour", "unknown field"),
    ({"input": "too long text"}, "input", "exceeds"),  # refused by the graph's own check
])
def test_a_bad_request_is_400_naming_the_field_and_nothing_starts(change, param, words):
    graph = FakeGraph()
    app, state, _ = _app(graph)

    async def go():
        async with _client(app) as c:
            r = await c.post("/v1/audio/speech", json={**GOOD, **change})
            ok = await c.post("/v1/audio/speech", json=GOOD)  # and the server keeps serving
            return r, ok

    r, ok = _run(go())
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and err["param"] == param
    assert words in err["message"]
    assert len(graph.started) == 1 and ok.status_code == 200  # only the good request reached synthesis
    assert state.in_flight == 0


def test_unknown_model_is_404_and_missing_body_is_400():
    graph = FakeGraph()
    app, _, _ = _app(graph)

    async def go():
        async with _client(app) as c:
            return (await c.post("/v1/audio/speech", json={**GOOD, "model": "tts-1"}),
                    await c.post("/v1/audio/speech", content=b"{not json"),
                    await c.post("/v1/audio/speech", json=["a"]))

    model, bad_json, not_obj = _run(go())
    assert model.status_code == 404 and model.json()["error"]["param"] == "model"
    assert "omni-demo" in model.json()["error"]["message"]
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    assert not_obj.status_code == 400 and graph.started == []


def test_parse_speech_defaults_and_forms():
    model = FakeGraph.model
    o = parse_speech({"model": "m", "input": "hi", "voice": {"id": "voice-2"}}, model_name="m", model=model,
                     request_id="r")
    r = o.request
    assert (r.voice, r.seed, r.max_tokens, r.request_id, o.response_format, o.stream, o.stream_format) == (
        2, 0, 32, "r", "wav", False, None)
    o = parse_speech({"model": "m", "input": "hi", "voice": "voice-0", "stream_format": "sse"}, model_name="m",
                     model=model, request_id="r")
    assert (o.stream, o.stream_format, o.response_format) == (True, "sse", "pcm")  # sse streams by itself
    o = parse_speech({"model": "m", "input": "hi", "voice": "voice-0", "stream": True, "speed": 1}, model_name="m",
                     model=model, request_id="r")
    assert (o.stream, o.stream_format, o.response_format) == (True, "audio", "pcm")


def _pcm(graph: FakeGraph, req: SpeechRequest) -> bytes:
    from core.pipeline.audio import pcm16

    return b"".join(pcm16(graph.samples(req, i)) for i in range(graph.n_chunks))


def test_wav_pcm_stream_and_sse_carry_the_same_samples():
    graph = FakeGraph()
    app, state, _ = _app(graph)
    want = _pcm(graph, SpeechRequest("hello there", voice=1, seed=7))

    async def go():
        async with _client(app) as c:
            wav = await c.post("/v1/audio/speech", json=GOOD)
            pcm = await c.post("/v1/audio/speech", json={**GOOD, "response_format": "pcm"})
            streamed = await c.post("/v1/audio/speech", json={**GOOD, "stream": True})
            sse = await c.post("/v1/audio/speech", json={**GOOD, "stream_format": "sse"})
            return wav, pcm, streamed, sse

    wav, pcm, streamed, sse = _run(go())
    assert wav.headers["content-type"] == "audio/wav" and wav.headers["x-sample-rate"] == "16000"
    with wave.open(io.BytesIO(wav.content)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        assert w.readframes(w.getnframes()) == want
    assert pcm.content == want and pcm.headers["content-type"] == "audio/pcm"
    assert streamed.content == want and streamed.headers["content-type"] == "audio/pcm"
    events = _sse_events(sse)
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == want
    assert events[-1]["samples"] == 15 and events[-1]["usage"]["input_tokens"] == 4
    assert sorted(graph.closed) == sorted(graph.started) and len(graph.started) == 4 and state.in_flight == 0


def test_past_max_concurrency_is_429_before_any_engine_work():
    graph = FakeGraph()
    app, state, _ = _app(graph, max_concurrency=2)

    async def go():
        graph.gate = asyncio.Event()
        async with _client(app) as c:
            held = [asyncio.ensure_future(c.post("/v1/audio/speech", json=GOOD)) for _ in range(2)]
            while len(graph.started) < 2:
                await asyncio.sleep(0.01)
            over = await c.post("/v1/audio/speech", json=GOOD)
            in_flight = state.in_flight
            graph.gate.set()
            done = await asyncio.gather(*held)
            after = await c.post("/v1/audio/speech", json=GOOD)
            return over, in_flight, done, after

    over, in_flight, done, after = _run(go())
    assert over.status_code == 429 and over.json()["error"]["type"] == "TooManyRequestsError"
    assert "--max-concurrency" in over.json()["error"]["message"]
    assert in_flight == 2 and [r.status_code for r in done] == [200, 200] and after.status_code == 200
    assert len(graph.started) == 3 and state.in_flight == 0


def test_a_failed_stage_is_503_and_a_dead_one_fails_health_and_tells_the_server():
    async def then(c, graph):
        healthy = await c.get("/health")
        graph.dead_stage = "talker"
        refused = await c.post("/v1/audio/speech", json=GOOD)
        return healthy, refused, await c.get("/health")

    graph, state, dead, failed, failed_stream, sse, (healthy, refused, unhealthy) = _with_faults("fail_at", then)
    for r in (failed, failed_stream):
        assert r.status_code == 503 and "talker" in r.json()["error"]["message"]
    events = _sse_events(sse)
    assert [e["type"] for e in events] == ["speech.audio.delta", "error"]  # failed after its first chunk
    assert healthy.status_code == 200 and healthy.json()["status"] == "ok"
    assert refused.status_code == 503 and "talker" in refused.json()["error"]["message"]
    assert unhealthy.status_code == 503 and unhealthy.json()["dead_stage"] == "talker"
    assert dead and set(dead) == {"talker"}
    assert state.in_flight == 0 and len(graph.started) == 3  # the request after the death never started


def test_voices_models_and_metrics():
    graph = FakeGraph()
    app, _, _ = _app(graph)

    async def go():
        async with _client(app) as c:
            await c.post("/v1/audio/speech", json=GOOD)
            await c.post("/v1/audio/speech", json={**GOOD, "voice": "nobody"})
            return await c.get("/v1/audio/voices"), await c.get("/v1/models"), await c.get("/metrics")

    voices, models, metrics = _run(go())
    assert voices.json()["voices"] == ["voice-0", "voice-1", "voice-2"]
    assert [m["id"] for m in models.json()["data"]] == ["omni-demo"] and models.json()["object"] == "list"
    text = metrics.text
    assert 'omni_serve:requests_total{outcome="ok"} 1.0' in text
    assert 'omni_serve:requests_total{outcome="bad_request"} 1.0' in text
    assert "omni_serve:time_to_first_audio_seconds_count 1.0" in text
    assert "omni_serve:real_time_factor_count 1.0" in text and "omni_serve:requests_in_flight 0.0" in text


def test_stage_metrics_are_merged_with_a_stage_label():
    from prometheus_client import CollectorRegistry, Gauge

    regs = {}
    for i, stage in enumerate(("thinker", "talker")):
        regs[stage] = CollectorRegistry()
        Gauge("vllm:num_requests_running", "running", ["model_name", "engine"], registry=regs[stage]) \
            .labels(model_name=stage, engine="0").set(i + 1)
    text = ServingMetrics(regs).exposition().decode()
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1
    assert 'vllm:num_requests_running{engine="0",model_name="thinker",stage="thinker"} 1.0' in text
    assert 'vllm:num_requests_running{engine="0",model_name="talker",stage="talker"} 2.0' in text


def test_a_graph_bug_is_one_500_with_an_openai_body_and_the_server_keeps_serving():
    async def then(c, graph):
        return await c.post("/v1/audio/speech", json=GOOD)

    graph, state, dead, whole, streamed, sse, ok = _with_faults("crash_at", then)
    for r in (whole, streamed):
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        assert "RuntimeError" in r.json()["error"]["message"]
    events = _sse_events(sse)
    assert [e["type"] for e in events] == ["speech.audio.delta", "error"]
    assert ok.status_code == 200 and state.in_flight == 0 and dead == []
    m = state.metrics.exposition().decode()
    assert 'omni_serve:requests_total{outcome="failed"} 3.0' in m
