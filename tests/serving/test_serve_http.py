"""``omni-backends serve`` over real HTTP on 127.0.0.1: one server process on the real stage graph (the ``--device`` driver,
three resident AsyncLLM engines), started once for the module, and the ``openai`` client vLLM installs.

- a served WAV equals ``omni-backends run``'s out.wav byte for byte (same prompt, voice, seed);
- a streamed response's PCM (raw and SSE) equals the non-streamed body, and its first chunk reaches the client
  before the talker finished (server timestamps on the same host's monotonic clock);
- 16 concurrent requests of different lengths all succeed, each its own serial result (int16 samples at most
  one LSB apart: batch composition, ``tests/core/precision.py``);
- a client that disconnects mid-stream: its request leaves every stage;
- bad requests: one OpenAI-style 400 each, nothing started, the server keeps serving;
- /metrics: vLLM's per-stage metrics and the server's own;
- bodies it cannot use (nested too deep, a lone surrogate, over --max-body-bytes): one OpenAI-style 400 / 413 each,
  counted in the metrics;
- SIGTERM drains: new connections get 503 while the request in flight completes, exit status 0.
"""

from __future__ import annotations

import array
import base64
import concurrent.futures
import io
import json
import os
import signal
import threading
import time
import urllib.request
import wave

import pytest

from tests.core.precision import BATCH_COMPOSITION_PCM16_LSB
from tests.serving.servers import health, run_out_wav, sse_events, start_server

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MODEL = "omni-demo"
PROMPT, VOICE, SEED, MAX_TOKENS = "Hello! Tell me about omni models.", 1, 5, 12
CHUNK_FRAMES = 4


@pytest.fixture(scope="module")
def served(demo_models, test_device, tmp_path_factory):
    """(server, the `run` process, its out dir): the run starts first so the two overlap."""
    out = str(tmp_path_factory.mktemp("run") / "out")
    # the same engine options as the server's: code2wav's floats depend on its chunk shapes (one LSB at times)
    run = run_out_wav(demo_models, test_device, out, PROMPT, VOICE, SEED, MAX_TOKENS, "--chunk-frames",
                      str(CHUNK_FRAMES))
    try:
        server = start_server(demo_models, test_device, "--chunk-frames", str(CHUNK_FRAMES), "--max-concurrency", "64")
    except BaseException:
        run.kill()
        raise
    yield server, run, out
    server.kill()
    if run.poll() is None:
        run.kill()


@pytest.fixture
def server(served):
    return served[0]


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def speech(server, text: str = PROMPT, voice: int = VOICE, seed: int = SEED, max_tokens: int = MAX_TOKENS,
           **kw) -> bytes:
    r = client(server).audio.speech.create(model=MODEL, input=text, voice=f"voice-{voice}",
                                           extra_body={"seed": seed, "max_tokens": max_tokens}, **kw)
    return r.content


def frames(wav: bytes) -> bytes:
    with wave.open(io.BytesIO(wav)) as w:
        return w.readframes(w.getnframes())


def test_served_wav_equals_run_out_wav_byte_for_byte(served):
    server, run, out = served
    wav = speech(server, response_format="wav")
    _, err = run.communicate(timeout=900)
    assert run.returncode == 0, err[-3000:]
    with open(os.path.join(out, "out.wav"), "rb") as f:
        want = f.read()
    assert len(frames(want)) > 0
    assert wav == want


def _sse(server, **body):
    """(events, arrival time of each delta, headers) of one SSE speech request."""
    with client(server).audio.speech.with_streaming_response.create(
            model=MODEL, input=PROMPT, voice=f"voice-{VOICE}", stream_format="sse",
            extra_body={"seed": SEED, "max_tokens": MAX_TOKENS, **body}) as r:
        headers = dict(r.headers)
        events, arrivals = sse_events(r.iter_lines())
    return events, arrivals, headers


def test_streamed_pcm_equals_the_whole_body_and_starts_before_the_talker_finished(server):
    whole = speech(server, response_format="pcm")
    assert whole == frames(speech(server, response_format="wav"))
    with client(server).audio.speech.with_streaming_response.create(
            model=MODEL, input=PROMPT, voice=f"voice-{VOICE}", response_format="pcm",
            extra_body={"seed": SEED, "max_tokens": MAX_TOKENS, "stream": True}) as r:
        assert r.headers["content-type"] == "audio/pcm" and r.headers["x-sample-rate"] == "16000"
        raw_chunks = list(r.iter_bytes())
    assert b"".join(raw_chunks) == whole

    events, arrivals, headers = _sse(server)
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    done = events[-1]
    assert done["type"] == "speech.audio.done" and len(deltas) >= 2  # more frames than one chunk
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == whole
    assert done["samples"] * 2 == len(whole)
    # the first chunk was in the client's hands before the talker made its last frame (same host: the server's
    # perf_counter and ours are one CLOCK_MONOTONIC). The talker starts when the thinker finished, so it finished
    # no earlier than submit + the thinker's seconds + the talker's: a lower bound of its end.
    submitted = float(headers["x-submitted-at"])
    talker_done = submitted + done["timings"]["thinker"] + done["timings"]["talker"]
    assert arrivals[0] < talker_done, (arrivals[0] - submitted, done["timings"])


LENGTHS = [(f"Request {i}: " + "omni " * (i % 5), i % 3, 100 + i, 3 + i) for i in range(16)]


def test_16_concurrent_requests_of_different_lengths_each_match_their_serial_result(server):
    def one(args):
        text, voice, seed, max_tokens = args
        return speech(server, text, voice, seed, max_tokens, response_format="pcm")

    serial = [one(a) for a in LENGTHS]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(one, LENGTHS))
    assert len({len(s) for s in serial}) > 4  # different lengths
    assert all(len(s) > 0 for s in serial)
    # batched with others, a request's floats may round to a neighbouring int16 (tests/core/precision.py,
    # "Batch composition"): equal lengths, at most one LSB per sample; a differing token or code moves whole
    # frames by far more
    for i, (t, s) in enumerate(zip(together, serial)):
        assert len(t) == len(s), (i, len(t), len(s))
        worst = max((abs(a - b) for a, b in zip(array.array("h", t), array.array("h", s))), default=0)
        assert worst <= BATCH_COMPOSITION_PCM16_LSB, (i, worst)


def test_a_client_that_disconnects_mid_stream_leaves_no_stage_running_its_request(server):
    with httpx.Client(timeout=300) as c:
        with c.stream("POST", f"{server.url}/v1/audio/speech", json={
                "model": MODEL, "input": PROMPT, "voice": "voice-0", "stream": True, "max_tokens": 240}) as r:
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            chunks = r.iter_bytes()
            next(chunks)  # the first chunk: the talker is still running
            running = health(server)["running"]
            assert any(rid in ids for ids in running.values()), running
        # the response is closed here: the connection goes away
    deadline = time.monotonic() + 2.0
    while True:
        running = health(server)["running"]
        if not any(rid in ids for ids in running.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not any(rid in ids for ids in running.values()), running
    assert health(server)["in_flight"] == 0


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": "word " * 3000}, "input"),
    ({"voice": "alloy"}, "voice"),
    ({"response_format": "mp3"}, "response_format"),
    ({"seed": -3}, "seed"),
    ({"speed": 2.0}, "speed"),
])
def test_a_bad_request_is_one_400_and_the_server_keeps_serving(server, body, param):
    before = health(server)
    fields = {"model": MODEL, "input": PROMPT, "voice": "voice-0", **body}
    extra = {k: fields.pop(k) for k in ("seed", "max_tokens") if k in fields}  # not in the SDK's signature
    with pytest.raises(openai.BadRequestError) as e:
        client(server).audio.speech.create(**fields, extra_body=extra)
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == param and err["message"]
    assert health(server)["in_flight"] == 0 and before["status"] == "ok"
    assert len(speech(server, max_tokens=2, response_format="pcm")) > 0


@pytest.mark.parametrize("content, status, words", [
    (b"[" * 100000, 400, "nested too deeply"),
    (json.dumps({"model": MODEL, "input": "\udcff hello", "voice": "voice-0"}).encode(), 400, "lone surrogate"),
    (b"x" * (2 << 20), 413, "--max-body-bytes"),
])
def test_a_body_the_server_cannot_use_is_an_openai_error_counted_in_the_metrics(server, content, status, words):
    def requests_total() -> float:
        with urllib.request.urlopen(f"{server.url}/metrics") as r:
            return sum(float(line.split()[-1]) for line in r.read().decode().splitlines()
                       if line.startswith("omni_serve:requests_total{"))

    before = requests_total()
    if status == 413:  # answered from Content-Length alone: the body is never sent (a client still writing it
        got_status, got = _answer_before_the_body(server, len(content))  # may meet a reset instead of the answer)
    else:
        r = httpx.post(f"{server.url}/v1/audio/speech", content=content,
                       headers={"content-type": "application/json"}, timeout=60)
        got_status, got = r.status_code, r.content
    assert got_status == status and words in json.loads(got)["error"]["message"], got[:500]
    assert requests_total() == before + 1 and health(server)["status"] == "ok"


def _answer_before_the_body(server, length: int) -> tuple[int, bytes]:
    """POST headers announcing a ``length``-byte body, send none of it, and read the server's answer: (status,
    body). The server must answer from the headers alone (it reads no body past --max-body-bytes)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall((f"POST /v1/audio/speech HTTP/1.1\r\nHost: {url.hostname}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection without an answer: {data!r}"
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        size = int(next(x.split(":", 1)[1] for x in lines[1:] if x.lower().startswith("content-length:")))
        while len(body) < size:
            chunk = sock.recv(65536)
            assert chunk, f"the answer was cut short: {head!r} {body!r}"
            body += chunk
    return int(lines[0].split()[1]), body[:size]


def test_voices_models_and_metrics(server):
    with urllib.request.urlopen(f"{server.url}/v1/audio/voices") as r:
        voices = json.load(r)["voices"]
    assert voices[0] == "voice-0" and len(voices) >= 2
    assert [m.id for m in client(server).models.list().data] == [MODEL]
    speech(server, max_tokens=2, response_format="pcm")
    with urllib.request.urlopen(f"{server.url}/metrics") as r:
        text = r.read().decode()
    count = next(line for line in text.splitlines() if line.startswith("omni_serve:time_to_first_audio_seconds_count"))
    assert float(count.split()[-1]) >= 1
    assert "omni_serve:real_time_factor_bucket" in text and "omni_serve:requests_in_flight" in text


def test_metrics_carry_vllm_metrics_of_each_stage(server):
    speech(server, max_tokens=2, response_format="pcm")
    with urllib.request.urlopen(f"{server.url}/metrics") as r:
        text = r.read().decode()
    for stage in ("thinker", "talker", "code2wav"):
        running = [line for line in text.splitlines()
                   if line.startswith("vllm:num_requests_running{") and f'stage="{stage}"' in line]
        assert len(running) == 1, (stage, running)
    assert "# TYPE vllm:num_requests_running gauge" in text


def test_sigterm_drains_the_request_in_flight_then_exits_0(served):
    server = served[0]
    got: dict = {}

    def long_request():
        got["wav"] = speech(server, max_tokens=120, response_format="wav")

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 120
    while health(server)["in_flight"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert health(server)["in_flight"] == 1
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while health(server)["status"] != "draining" and time.monotonic() < deadline:
        time.sleep(0.05)
    # still listening while it drains: a new connection gets a 503 (go elsewhere), not a refused connection
    refused = httpx.post(f"{server.url}/v1/audio/speech", json={"model": MODEL, "input": PROMPT, "voice": "voice-0"},
                         timeout=60)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "ServiceUnavailableError"
    assert health(server)["in_flight"] == 1  # the long request is still running
    t.join(300)
    assert len(frames(got["wav"])) > 0  # the request in flight completed
    assert server.wait(120) == 0, server.tail()
