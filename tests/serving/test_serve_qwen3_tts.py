"""``omni-backends serve --model DIR`` on Qwen3-TTS checkpoints in the released layout (tiny, random weights), over
real HTTP on 127.0.0.1 with the ``openai`` client, a request as a client of ``vllm serve <Qwen3-TTS> --omni`` sends
it (``client.audio.speech.create(model, voice, input, extra_body={seed, language, task_type, ...})``).

One server per checkpoint (CustomVoice, VoiceDesign), started once for the module, next to ``omni-backends run
--model`` on the CustomVoice one and the plain-PyTorch reference loop of vLLM-Omni's own classes
(``tests/core/qwen3_tts_reference.py``) -- all four at once. The servers run the talker greedy on codebook 0
(vLLM-Omni's ``--stage-overrides`` with the talker's ``default_sampling_params``: temperature 0, and
``ignore_eos`` without the stop token so that every request makes its ``max_new_tokens``) so their codes can equal the reference's; the code predictor samples with the request's ``seed``. The overrides also size the
engines for a small test box (16 sequences, the tiny talker's 512 positions) and run code2wav in the checkpoint's float32.

- a 24 kHz WAV whose codec frames (the SSE ``speech.audio.done`` event's ``codes``) equal the reference loop's
  and whose samples equal code2wav's direct forward on those frames within :data:`WAVEFORM_TOLERANCE`;
- the streamed PCM (raw and SSE) equals the WAV's samples; the first chunk reaches the client before the talker
  finished;
- 16 concurrent requests each equal their serial result (codes bit for bit, int16 samples within one LSB);
- a client that disconnects mid-stream: its request leaves every stage within 2 s;
- an unknown speaker (400 naming the checkpoint's speakers), a task type the checkpoint does not serve, an empty
  input, an unknown field, an unsupported response format or speed: one 400 each before any engine work;
- ``/v1/audio/voices`` lists the checkpoint's speakers, ``/v1/models`` the served name (the folder's);
- ``run --model`` writes the same WAV as the server for the same request and seed.

The scenario follows ``--device`` (once per engine variant the driver offers: ``--runner v1`` / ``v2``).
"""

from __future__ import annotations

import array
import base64
import concurrent.futures
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave

import pytest

from tests.core.precision import BATCH_COMPOSITION_PCM16_LSB
from tests.serving.servers import ENV, ROOT, health, sse_events

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
torch = pytest.importorskip("torch")

TEXT, SPEAKER, SEED, FRAMES = "Hello world, this is omni.", "vivian", 7, 20
DESIGN = "A calm, low voice, speaking slowly."
#: the talker greedy and to its max_new_tokens (no early codec EOS from random weights: every request's length is
#: known, a long one outlasts its first chunk); the same for the reference loop
SAMPLING = {"temperature": 0, "ignore_eos": True, "stop_token_ids": []}
OVERRIDES = ["--stage-overrides", json.dumps({
    "0": {"default_sampling_params": SAMPLING, "max_num_seqs": 16, "max_model_len": 512},
    "1": {"dtype": "float32", "max_num_seqs": 16}})]
#: served samples (int16 / 32767) against code2wav's direct forward on the same frames (float32): the 16-bit
#: rounding (half an LSB, 1.5e-5) plus the float32 difference of the chunk forwards (up to 72 frames of left
#: context) against one whole forward (tests/core/precision.py's waveform tolerance, 1e-5)
WAVEFORM_TOLERANCE = {"atol": 3e-5, "rtol": 0.0}


def _variant_args(variant: str) -> list[str]:
    return ["--runner", variant.split("-")[0], *(["--enforce-eager"] if variant.endswith("-eager") else [])]


def pytest_generate_tests(metafunc):
    """``variant``: once per engine variant the ``--device`` driver offers (cpu: v1-eager), module-scoped."""
    if "variant" in metafunc.fixturenames:
        from tests.core.conftest import device_of, variants_for

        metafunc.parametrize("variant", variants_for(device_of(metafunc.config)), scope="module")


def _write(path: str, variant: str) -> str:
    from tests.fixtures.qwen3_tts.tiny_checkpoint import create_tiny_qwen3_tts

    return create_tiny_qwen3_tts(path, variant=variant)


class _Run:
    """``omni-backends run --model`` started in the background; ``result()`` waits for it."""

    def __init__(self, cmd: list[str]):
        self.proc = subprocess.Popen(cmd, env={**os.environ, **ENV}, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)

    def result(self, timeout: float = 900) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err


@pytest.fixture(scope="module")
def setup(tmp_path_factory, test_device, variant):
    """Both checkpoints written, then at once: a server on each, ``run --model`` and the reference loop."""
    from core.models.qwen3_tts import TTSRequest
    from core.serving.process import ServerProcess
    from tests.core.conftest import _need_vllm, scenario_env
    from tests.core.qwen3_tts_reference import reference

    _need_vllm(test_device)
    if variant.startswith("v2"):
        from core.runner.v2 import v2_runs_models_without_kv_cache

        if not v2_runs_models_without_kv_cache():
            pytest.skip("this vLLM's V2 runner cannot run code2wav's model (no KV cache; vLLM 0.32+ can): the "
                        "pipeline runs on V1 (tests/core/test_kv_free_runner.py)")
    root = tmp_path_factory.mktemp("qwen3tts-serve")
    cv, vd = _write(str(root / "Qwen3-TTS-tiny-CustomVoice"), "custom_voice"), \
        _write(str(root / "Qwen3-TTS-tiny-VoiceDesign"), "voice_design")
    out = str(root / "run-out")
    run = _Run([sys.executable, "-m", "omni_backends.cli", "run", "--device", test_device, "--model", cv,
                "--out", out, "--prompt", TEXT, "--voice", SPEAKER, "--language", "English", "--seed", str(SEED),
                "--max-new-tokens", str(FRAMES), *OVERRIDES, *_variant_args(variant)])
    refs: dict = {}
    requests = [TTSRequest(text=TEXT, speaker=SPEAKER, language="English", seed=SEED, max_new_tokens=FRAMES),
                TTSRequest(text=TEXT, task_type="VoiceDesign", instructions=DESIGN, seed=SEED, max_new_tokens=FRAMES)]

    def ref() -> None:
        try:
            env = scenario_env(test_device, variant, False, "qwen3tts-serve-ref")
            same = {k: v for k, v in SAMPLING.items() if k != "temperature"}  # the reference is greedy itself
            refs["cv"] = reference(cv, requests[:1], device=test_device, env=env, overrides=same)[0]
            refs["vd"] = reference(vd, requests[1:], device=test_device, env=env, overrides=same)[0]
        except BaseException as exc:  # noqa: BLE001 - reported by the test that needs it
            refs["error"] = exc

    t = threading.Thread(target=ref, daemon=True)
    t.start()
    servers = [ServerProcess(["--device", test_device, "--model", ckpt, "--max-concurrency", "64", *OVERRIDES,
                              *_variant_args(variant)], env=ENV, cwd=ROOT) for ckpt in (cv, vd)]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both servers start at once
            list(pool.map(lambda s: s.start(), servers))
        yield {"cv": servers[0], "vd": servers[1], "cv_dir": cv, "vd_dir": vd, "run": run, "run_out": out,
               "refs": refs, "ref_thread": t}
    finally:
        for s in servers:
            s.kill()
        if run.proc.poll() is None:
            run.proc.kill()


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)


def name_of(server) -> str:
    return client(server).models.list().data[0].id


def speech(server, text: str = TEXT, voice: str | None = SPEAKER, **extra) -> bytes:
    kw = {"language": "English", "seed": SEED, "max_new_tokens": FRAMES, **extra}
    fmt = kw.pop("response_format", "wav")
    r = client(server).audio.speech.create(model=name_of(server), input=text, voice=voice, response_format=fmt,
                                           extra_body=kw)
    return r.content


def sse(server, text: str = TEXT, **extra) -> tuple[list[dict], list[float], dict]:
    """(events, arrival time of each, headers) of one SSE speech request (``stream: true``, vLLM-Omni's default
    streaming: ``speech.audio.*`` events)."""
    body = {"model": name_of(server), "input": text, "voice": SPEAKER, "language": "English", "seed": SEED,
            "max_new_tokens": FRAMES, "stream": True, "response_format": "pcm", **extra}
    with httpx.Client(timeout=600) as c, c.stream("POST", f"{server.url}/v1/audio/speech", json=body) as r:
        assert r.status_code == 200, r.read()
        headers = dict(r.headers)
        events, arrivals = sse_events(r.iter_lines())
    return events, arrivals, headers


def frames_of(wav: bytes) -> tuple[bytes, int]:
    with wave.open(io.BytesIO(wav)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return w.readframes(w.getnframes()), w.getframerate()


def reference_of(setup, key: str) -> dict:
    setup["ref_thread"].join(900)
    if "error" in setup["refs"]:
        raise setup["refs"]["error"]
    return setup["refs"][key]


def _check_against_reference(server, ref: dict, **extra) -> bytes:
    wav = speech(server, **extra)
    pcm, rate = frames_of(wav)
    assert rate == 24000
    events, _, _ = sse(server, **extra)
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    codes = torch.tensor(done["codes"], dtype=torch.int64)
    assert codes.shape[0] > 1 and torch.equal(codes, ref["codes"]), (codes, ref["codes"])
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert streamed == pcm
    served = torch.tensor(array.array("h", pcm), dtype=torch.float32) / 32767.0
    assert served.shape == ref["waveform"].shape
    torch.testing.assert_close(served, ref["waveform"].float().clamp(-1, 1), **WAVEFORM_TOLERANCE)
    return wav


def test_custom_voice_wav_codes_equal_the_reference_loop_and_samples_the_direct_forward(setup):
    _check_against_reference(setup["cv"], reference_of(setup, "cv"), task_type="CustomVoice")


def test_voice_design_wav_codes_equal_the_reference_loop_and_samples_the_direct_forward(setup):
    server = setup["vd"]
    wav = client(server).audio.speech.create(
        model=name_of(server), input=TEXT, voice="unused-by-voice-design", response_format="wav",
        instructions=DESIGN, extra_body={"seed": SEED, "task_type": "VoiceDesign", "max_new_tokens": FRAMES})
    ref = reference_of(setup, "vd")
    pcm, rate = frames_of(wav.content)
    served = torch.tensor(array.array("h", pcm), dtype=torch.float32) / 32767.0
    assert rate == 24000 and served.shape == ref["waveform"].shape
    torch.testing.assert_close(served, ref["waveform"].float().clamp(-1, 1), **WAVEFORM_TOLERANCE)


def test_streamed_pcm_equals_the_wav_and_starts_before_the_talker_finished(setup):
    server = setup["cv"]
    pcm, _ = frames_of(speech(server))
    body = {"model": name_of(server), "input": TEXT, "voice": SPEAKER, "language": "English", "seed": SEED,
            "max_new_tokens": FRAMES, "stream_format": "audio", "response_format": "pcm"}
    with httpx.Client(timeout=600) as c, c.stream("POST", f"{server.url}/v1/audio/speech", json=body) as r:
        assert r.headers["content-type"] == "audio/pcm" and r.headers["x-sample-rate"] == "24000"
        raw = b"".join(r.iter_bytes())
    assert raw == pcm
    # a streamed WAV is labelled as one (its header first, then the same samples)
    with httpx.Client(timeout=600) as c, c.stream("POST", f"{server.url}/v1/audio/speech",
                                                  json={**body, "response_format": "wav"}) as r:
        assert r.headers["content-type"] == "audio/wav"
        streamed_wav = b"".join(r.iter_bytes())
    assert streamed_wav[:4] == b"RIFF" and streamed_wav.endswith(pcm)
    events, _, _ = sse(server)
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and b"".join(base64.b64decode(e["audio"]) for e in deltas) == pcm
    # a long request: its first chunk (after 1 frame) is decoded while the talker makes the other 149
    events, arrivals, headers = sse(server, max_new_tokens=150)
    done = events[-1]
    # the first chunk was in the client's hands before the talker made its last frame (same host: the server's
    # perf_counter and ours are one CLOCK_MONOTONIC)
    talker_done = float(headers["x-submitted-at"]) + done["timings"]["talker_finished"]
    assert arrivals[0] < talker_done, (arrivals[0] - float(headers["x-submitted-at"]), done["timings"])


LENGTHS = [(f"Request {i}: " + "omni " * (i % 5), SPEAKER if i % 2 else "ryan", 100 + i, 4 + i % 7)
           for i in range(16)]


def test_16_concurrent_requests_each_equal_their_serial_result(setup):
    server = setup["cv"]

    def one(args):
        text, voice, seed, frames = args
        return speech(server, text, voice, seed=seed, max_new_tokens=frames, response_format="pcm")

    serial = [one(a) for a in LENGTHS]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(one, LENGTHS))
    assert len({len(s) for s in serial}) > 3 and all(serial)
    for i, (t, s) in enumerate(zip(together, serial)):
        assert len(t) == len(s), (i, len(t), len(s))
        worst = max((abs(a - b) for a, b in zip(array.array("h", t), array.array("h", s))), default=0)
        assert worst <= BATCH_COMPOSITION_PCM16_LSB, (i, worst)


def test_a_client_that_disconnects_mid_stream_frees_every_stage_within_2_s(setup):
    server = setup["cv"]
    body = {"model": name_of(server), "input": TEXT * 4, "voice": SPEAKER, "seed": SEED, "max_new_tokens": 350,
            "stream_format": "audio", "response_format": "pcm"}
    with httpx.Client(timeout=600) as c:
        with c.stream("POST", f"{server.url}/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            chunks = r.iter_bytes()  # kept: a dropped httpx iterator closes the connection (an early disconnect)
            first = next(chunks)  # the first chunk: the talker is still running
            running = health(server)["running"]
            assert any(rid in ids for ids in running.values()), (len(first), running, server.tail())
    deadline = time.monotonic() + 2.0
    while any(rid in ids for ids in health(server)["running"].values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(rid in ids for ids in health(server)["running"].values()), health(server)
    assert health(server)["in_flight"] == 0


@pytest.mark.parametrize("change, param, words", [
    ({"voice": "nobody"}, "voice", "aiden, eric, ryan, serena, uncle_fu, vivian"),
    ({"task_type": "VoiceDesign", "instructions": "calm"}, "task_type", "does not support"),
    ({"input": ""}, "input", "empty"),
    ({"temperature": 0.5}, "temperature", "unknown field"),
    ({"response_format": "mp3"}, "response_format", "wav, pcm"),
    ({"speed": 1.5}, "speed", "1.0"),
])
def test_a_request_the_checkpoint_cannot_serve_is_one_400_before_any_engine_work(setup, change, param, words):
    server = setup["cv"]
    body = {"model": name_of(server), "input": TEXT, "voice": SPEAKER, **change}
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{server.url}/v1/audio/speech", json=body)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and words in err["message"], err
    h = health(server)
    assert h["in_flight"] == 0 and not any(h["running"].values()) and h["status"] == "ok"


def test_voices_and_models_list_the_checkpoint(setup):
    server = setup["cv"]
    with urllib.request.urlopen(f"{server.url}/v1/audio/voices") as r:
        voices = json.load(r)["voices"]
    assert voices == ["aiden", "eric", "ryan", "serena", "uncle_fu", "vivian"]
    assert name_of(server) == os.path.basename(setup["cv_dir"])


def test_run_model_writes_the_same_wav_as_the_server(setup):
    wav = speech(setup["cv"])
    rc, err = setup["run"].result()
    assert rc == 0, err[-4000:]
    with open(os.path.join(setup["run_out"], "out.wav"), "rb") as f:
        assert f.read() == wav
    with open(os.path.join(setup["run_out"], "summary.json")) as f:
        summary = json.load(f)
    assert summary["pipeline"] == "qwen3_tts" and summary["stages"]["code2wav"]["sample_rate"] == 24000
