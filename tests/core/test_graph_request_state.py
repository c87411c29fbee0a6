"""The stage graph and an audio stage whose model keeps each request's state across its chunk requests
(``PipelineModel.audio_request_state``, vLLM-Omni's ``async_chunk``): every chunk request names the graph's
request in its payload (``meta.request_id``), carries only its new frames, and the graph releases the state on
the audio stage's worker (``omni_release_request_state``) once the request ends -- finished, or closed early by
its caller. Fake engines (no vLLM engine): what the graph sends is what is asserted."""

from __future__ import annotations

import asyncio
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from core.kinds import AR, GENERATION  # noqa: E402
from core.payloads import EXTRA_ARGS_KEY, unpack  # noqa: E402
from core.pipeline.config import GraphConfig  # noqa: E402
from core.pipeline.graph import StageGraph  # noqa: E402
from core.pipeline.spec import CHUNKED, ChunkWindow, PipelineModel, PipelineSpec, SpeechApi, StageSpec  # noqa: E402

FRAMES, Q, HOP = 7, 2, 3


class FakeEngine:
    """``generate`` / ``abort`` / ``collective_rpc`` as ``AsyncLLM``'s; the producer streams FRAMES frames one
    per output, the audio stage returns HOP samples per frame it was given."""

    def __init__(self, producer: bool):
        self.producer, self.errored = producer, False
        self.output_processor = types.SimpleNamespace(external_req_ids=set())
        self.requests, self.rpcs = [], []

    async def generate(self, prompt, params, request_id):
        self.requests.append((request_id, prompt, params))
        self.output_processor.external_req_ids.add(request_id)
        try:
            if self.producer:
                for i in range(FRAMES):
                    await asyncio.sleep(0)
                    yield types.SimpleNamespace(frames=torch.full((1, Q), i), prompt_token_ids=[0], outputs=[])
            else:
                n = len(prompt["prompt_token_ids"]) // Q
                yield types.SimpleNamespace(wav=torch.arange(n * HOP, dtype=torch.float32), prompt_token_ids=None,
                                            outputs=[])
        finally:
            self.output_processor.external_req_ids.discard(request_id)

    async def abort(self, ids):
        pass

    async def collective_rpc(self, method, args=()):
        self.rpcs.append((method, args))
        return [1]


def _graph(request_state: bool) -> StageGraph:
    from vllm.sampling_params import SamplingParams

    spec = PipelineSpec(
        name="fake",
        stages=(StageSpec("talker", AR, lambda m, c: {}, lambda m, r, u: ({"prompt_token_ids": [0]}, SamplingParams()),
                          lambda m, s, out: out.frames),
                StageSpec("code2wav", GENERATION, lambda m, c: {},
                          lambda m, r, codes: ({"prompt_token_ids": codes.t().reshape(-1).tolist()},
                                               SamplingParams(max_tokens=1)),
                          lambda m, s, out: out.wav, hand_over=CHUNKED)),
        load=None, check=lambda m, r, f: None, request_of_run=None, speech=SpeechApi(parse=None))
    model = PipelineModel(model_dir="x", sample_rate=24000, samples_per_frame=HOP, voices=[],
                          window=ChunkWindow(first_chunk_frames=1, chunk_frames=3,
                                             left_context_frames=0 if request_state else 2),
                          audio_request_state=request_state)
    return StageGraph(GraphConfig(), spec, model, {"talker": FakeEngine(True), "code2wav": FakeEngine(False)}, {})


async def _run(graph: StageGraph, stop_after: int | None = None) -> list:
    got = []
    gen = graph.synthesize(object(), request_id="utt")
    async for item in gen:
        got.append(item)
        if stop_after is not None and len(got) == stop_after:
            await gen.aclose()
            break
    return got


def test_chunk_requests_name_the_request_carry_new_frames_only_and_the_state_is_released():
    graph = _graph(True)
    got = asyncio.run(_run(graph))
    c2w = graph.engines["code2wav"]
    frames = [len(p["prompt_token_ids"]) // Q for _, p, _ in c2w.requests]
    assert frames == [1, 3, 3]  # no left context: the model holds it
    keys = [unpack(sp.extra_args[EXTRA_ARGS_KEY])["meta"]["request_id"] for _, _, sp in c2w.requests]
    assert keys == ["utt"] * 3
    assert c2w.rpcs == [("omni_release_request_state", (["utt"],))]
    assert got[-1].samples == FRAMES * HOP


def test_a_request_closed_early_releases_its_state_too():
    graph = _graph(True)
    asyncio.run(_run(graph, stop_after=1))
    assert graph.engines["code2wav"].rpcs == [("omni_release_request_state", (["utt"],))]


def test_a_stateless_audio_stage_gets_left_context_and_no_key_nor_release():
    graph = _graph(False)
    asyncio.run(_run(graph))
    c2w = graph.engines["code2wav"]
    assert [len(p["prompt_token_ids"]) // Q for _, p, _ in c2w.requests] == [1, 3 + 1, 3 + 2]
    assert all(not (sp.extra_args or {}).get(EXTRA_ARGS_KEY) for _, _, sp in c2w.requests) and c2w.rpcs == []
