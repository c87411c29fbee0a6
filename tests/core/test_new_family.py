"""A model family added as a declaration module plus a registry row, nothing else: serving, the stage graph and the
CLI take it unchanged (issue 45's "nevers"; tests/test_layering.py keeps their imports free of any declaration).

The toy family, written by this test into a module of its own (``toy_family``, under ``tmp_path``) and given a row
of ``core.pipeline.declarations.PIPELINES``: talker -> code2wav over the demo's tiny models, its own request
(``ToyRequest``: ``input``, ``frames``), its own speech adapter (vLLM-Omni-style named SSE events, its own error
event), its own ``run`` option (``--frames``) and its own check (a ``FieldError`` naming ``frames``). Its
"checkpoint" is a folder whose ``config.json`` names ``model_type: toy`` and the demo models' folder.

- served: the FastAPI app (``core.serving.app.build_app``, through httpx's ASGI transport) over a real
  ``StageGraph`` of its two engines: a WAV-less PCM body of ``frames`` frames, named SSE events, a 400 naming the
  toy's field from its declared error, a 400 for a field its adapter does not read, ``/v1/models`` its name;
- run: ``omni-backends run --model <toy> --frames 5`` in a child process (the row added there the same way):
  the CLI built its ``--frames`` from the declaration, wrote ``out.wav`` of 5 frames, and refuses the demo's
  ``--max-tokens`` naming the toy's pipeline.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOY_FAMILY = '''
"""A toy family: talker -> code2wav over the demo's tiny models; its request is an ``input`` and ``frames``."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from core.kinds import AR, GENERATION
from core.pipeline.declarations.demo import code2wav_inputs, code2wav_output, talker_output
from core.pipeline.fields import (FieldError, SpeechOptions, check_int, input_text, int_field, known_fields,
                                  stream_fields)
from core.pipeline.spec import CHUNKED, ChunkWindow, PipelineModel, PipelineSpec, RequestOption, SpeechApi, StageSpec

MAX_FRAMES = 40


@dataclasses.dataclass(frozen=True)
class ToyRequest:
    text: str
    frames: int = 8
    request_id: str | None = None


def load(cfg: Any, backend: Any, say: Any) -> PipelineModel:
    with open(os.path.join(cfg.model, "config.json")) as f:
        demo = json.load(f)["demo_models"]
    return PipelineModel(model_dir=demo, sample_rate=16000, samples_per_frame=160, voices=["toy-voice"],
                         window=ChunkWindow(first_chunk_frames=3, chunk_frames=3, left_context_frames=None))


def check(model: PipelineModel, req: ToyRequest, in_flight: Any) -> None:
    if req.frames > MAX_FRAMES:
        raise FieldError(f"the toy makes at most {MAX_FRAMES} frames, got {req.frames}", "frames")


def parse(body: Any, *, model_name: str, model: PipelineModel, request_id: str) -> SpeechOptions:
    known_fields(body, ("model", "input", "frames", "stream"), "'input'")
    stream, _ = stream_fields(body)
    req = ToyRequest(input_text(body), int_field(body, "frames", 8, 1, 10_000), request_id)
    return SpeechOptions(req, "pcm", stream, "sse" if stream else None)


def _check_frames(value: Any) -> None:
    check_int(value, "frames", "--frames", 1, MAX_FRAMES)


FRAMES = RequestOption("frames", type=int, check=_check_frames, default=8, help="the toy: frames to make")


def request_of_run(cfg: Any) -> ToyRequest:
    return ToyRequest(cfg.prompt, FRAMES.value(cfg.options))


def _engine_args(stage: str) -> Any:
    def engine_args(model: PipelineModel, cfg: Any) -> dict[str, Any]:
        return {"model": os.path.join(model.model_dir, stage), "max_model_len": 1024, "dtype": "float32",
                "max_num_seqs": 4, "skip_tokenizer_init": True, "enable_prefix_caching": False}

    return engine_args


def talker_inputs(model: PipelineModel, req: ToyRequest, upstream: None) -> Any:
    import torch
    from vllm.sampling_params import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack

    hidden = torch.tensor(list(req.text.encode()), dtype=torch.float32)[:, None].repeat(1, 128) / 255.0
    params = SamplingParams(max_tokens=req.frames + 1, temperature=0.0, ignore_eos=True, detokenize=False,
                            extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": hidden, "voice": 0})})
    return {"prompt_token_ids": [0] * hidden.shape[0]}, params


TOY = PipelineSpec(
    name="toy",
    stages=(StageSpec("talker", AR, _engine_args("talker"), talker_inputs, talker_output),
            StageSpec("code2wav", GENERATION, _engine_args("code2wav"), code2wav_inputs, code2wav_output,
                      hand_over=CHUNKED)),
    load=load, check=check, request_of_run=request_of_run,
    speech=SpeechApi(parse=parse, named_events=True, error_event="toy.error"), options=(FRAMES,),
)
'''

#: runs the CLI with the toy's registry row added in the child, as the test adds it here
RUN_WITH_TOY = """
import sys
sys.path.insert(0, sys.argv[1])
from core.pipeline.declarations import PIPELINES
PIPELINES["toy"] = "toy_family:TOY"
from omni_backends.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture
def toy(tmp_path, demo_dir, monkeypatch):
    """The toy family's module (``toy_family``) on ``sys.path``, its row in ``PIPELINES``, and its "checkpoint"
    folder (returned)."""
    (tmp_path / "toy_family.py").write_text(textwrap.dedent(TOY_FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path))
    from core.pipeline.declarations import PIPELINES

    monkeypatch.setitem(PIPELINES, "toy", "toy_family:TOY")
    ckpt = tmp_path / "toy-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "toy", "demo_models": demo_dir}))
    yield str(ckpt)
    sys.modules.pop("toy_family", None)


def test_a_new_family_is_served_by_the_unchanged_app_over_the_unchanged_graph(toy, test_device):
    import httpx

    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from core.pipeline.config import GraphConfig
    from core.pipeline.graph import StageGraph
    from core.serving.app import ServerState, build_app
    from core.serving.server import served_model_name

    async def go():
        graph = await StageGraph.start(GraphConfig(model=toy, device=test_device))
        try:
            assert graph.spec.name == "toy" and graph.voices == ["toy-voice"]
            name = served_model_name(graph.spec, toy)
            app = build_app(graph, ServerState(model_name=name))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                whole = await c.post("/v1/audio/speech", json={"input": "hello toy", "frames": 7})
                sse = await c.post("/v1/audio/speech", json={"input": "hello toy", "frames": 7, "stream": True})
                too_many = await c.post("/v1/audio/speech", json={"input": "hi", "frames": 41})
                unknown = await c.post("/v1/audio/speech", json={"input": "hi", "voice": "voice-0"})
                models = await c.get("/v1/models")
            return name, whole, sse, too_many, unknown, models
        finally:
            await graph.shutdown()

    name, whole, sse, too_many, unknown, models = asyncio.run(go())
    assert name == "toy-ckpt" and [m["id"] for m in models.json()["data"]] == ["toy-ckpt"]
    assert whole.status_code == 200 and whole.headers["content-type"] == "audio/pcm", whole.text[:500]
    assert len(whole.content) == 7 * 160 * 2  # 7 frames of the demo code2wav's 160 samples, 16-bit
    events = [block for block in sse.text.split("\n\n") if block]
    assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
    # the toy's adapter names its events: 7 frames in chunks of 3 -> 3 deltas, then done
    assert [e.splitlines()[0] for e in events] == ["event: speech.audio.delta"] * 3 + ["event: speech.audio.done"]
    done = json.loads(events[-1].splitlines()[1][len("data: "):])
    assert done["samples"] == 7 * 160 and len(done["codes"]) == 7
    err = too_many.json()["error"]
    assert too_many.status_code == 400 and err["param"] == "frames" and "at most 40" in err["message"]
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "voice"


def test_a_new_family_runs_through_the_unchanged_cli(toy, test_device, tmp_path):
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    env = {k: v for k, v in os.environ.items() if k not in ("OMNI_BACKENDS_DEVICE", "OMNI_BACKENDS_SELECTION")}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), VLLM_CPU_KVCACHE_SPACE="1")
    base = [sys.executable, "-c", RUN_WITH_TOY, str(tmp_path), "run", "--device", test_device, "--model", toy]
    refused = subprocess.run([*base, "--max-tokens", "3"], capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 2 and "--max-tokens is the demo pipeline's option" in refused.stderr, refused.stderr
    out = tmp_path / "out"
    proc = subprocess.run([*base, "--frames", "5", "--prompt", "hi toy", "--out", str(out), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["pipeline"] == "toy" and summary["request"] == {"text": "hi toy", "frames": 5, "request_id": None}
    assert summary["stages"]["talker"]["generated_tokens"] == 5 and summary["stages"]["code2wav"]["chunks"] == 2
    assert sorted(os.listdir(out)) == ["codes.json", "out.wav", "summary.json"]
    assert os.path.getsize(out / "out.wav") == 44 + 5 * 160 * 2
