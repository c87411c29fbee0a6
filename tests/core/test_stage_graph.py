"""The stage graph (``core.pipeline.graph``, issue 26) on cpu: one graph for the module, its three engines
started once.

- requests run concurrently each equal their serial result (text, codes, PCM bytes);
- the streamed chunks concatenated equal one whole-sequence code2wav forward of all frames;
- the first chunk is ready before the talker finished (audio streams while the talker runs);
- closing the stream aborts the request in every stage;
- bad requests are refused by ``check`` naming the field, before any engine work.
(A dead stage engine: ``test_stage_graph_dead.py``, its own graph.)
"""

from __future__ import annotations

import array
import asyncio
import os
import time

import pytest
import torch

from tests.core.precision import BATCH_COMPOSITION_PCM16_LSB, tolerance

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]

CHUNK = 4  # frames per code2wav request: several chunks per request


@pytest.fixture(scope="module")
def graph(loop, demo_dir, test_device):
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from core.pipeline.config import GraphConfig
    from core.pipeline.graph import StageGraph

    g = loop.run_until_complete(StageGraph.start(GraphConfig(model_dir=demo_dir, device=test_device, chunk_frames=CHUNK)))
    yield g
    loop.run_until_complete(g.shutdown())


async def _synth(graph, req):
    from core.pipeline.graph import AudioChunk

    chunks, result = [], None
    async for item in graph.synthesize(req):
        if isinstance(item, AudioChunk):
            chunks.append(item)
        else:
            result = item
    return chunks, result


def _pcm(chunks) -> bytes:
    from core.pipeline.audio import pcm16

    return b"".join(pcm16(c.samples) for c in chunks)


REQUESTS = [("Hello omni", 0, 5, 8), ("A longer prompt for the thinker, with more tokens", 1, 11, 12),
            ("Short", 3, 2**32 - 1, 6)]


def _requests(prefix: str):
    from core.pipeline.declarations.demo import SpeechRequest

    return [SpeechRequest(text, voice=v, seed=s, max_tokens=m, request_id=f"{prefix}-{i}")
            for i, (text, v, s, m) in enumerate(REQUESTS)]


@pytest.fixture(scope="module")
def serial(loop, graph):
    return [loop.run_until_complete(_synth(graph, r)) for r in _requests("serial")]


def test_a_request_streams_chunks_of_chunk_frames_then_its_result(graph, serial):
    for (chunks, result), (_, _, _, max_tokens) in zip(serial, REQUESTS):
        frames = 2 * max_tokens
        assert result.codes.shape == (frames, 4) and result.codes.dtype == torch.int64
        assert [c.index for c in chunks] == list(range(-(-frames // CHUNK)))
        assert [c.codes.shape[0] for c in chunks] == [min(CHUNK, frames - i * CHUNK) for i in range(len(chunks))]
        assert torch.equal(torch.cat([c.codes for c in chunks]), result.codes)
        assert all(c.samples.dtype == torch.float32 and c.samples.numel() == c.codes.shape[0] * graph.hop_length
                   for c in chunks)
        assert result.samples == frames * graph.hop_length
        assert result.generated_tokens == max_tokens and result.prompt_tokens > 0
        assert set(result.timings) >= {"thinker", "talker", "code2wav", "first_chunk", "total"}


def test_concurrent_requests_each_equal_their_serial_result(loop, graph, serial):
    async def together():
        return await asyncio.gather(*(_synth(graph, r) for r in _requests("together")))

    for (c_chunks, c_res), (s_chunks, s_res) in zip(loop.run_until_complete(together()), serial):
        assert c_res.text == s_res.text
        assert torch.equal(c_res.codes, s_res.codes)
        # batched with other requests' chunks, code2wav's floats may round to a neighbouring int16
        # (tests/core/precision.py, "Batch composition"; seen on cpu under load): at most one LSB per sample
        a, b = (array.array("h", _pcm(c)) for c in (c_chunks, s_chunks))
        assert len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b)), default=0) <= BATCH_COMPOSITION_PCM16_LSB


def test_streamed_chunks_equal_one_whole_sequence_code2wav_forward(loop, graph, serial, test_device):
    from vllm.sampling_params import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack

    async def whole(codes):
        params = SamplingParams(max_tokens=1, detokenize=False, extra_args={EXTRA_ARGS_KEY: pack({"codes": codes})})
        out = None
        async for out in graph.engines["code2wav"].generate({"prompt_token_ids": [0] * codes.shape[0]}, params,
                                                            request_id=f"whole-{codes.shape[0]}"):
            pass
        return out.multimodal_outputs["waveform"].reshape(-1)

    for chunks, result in serial:
        streamed = torch.cat([c.samples for c in chunks])
        # each chunk is one forward over the frames up to its end, the reference one over all of them: the same
        # causal computation at other shapes, equal up to float rounding (the waveform tolerance of precision.py)
        torch.testing.assert_close(streamed, loop.run_until_complete(whole(result.codes)),
                                   **tolerance(test_device, "float32", "waveform"))


def test_the_first_chunk_is_ready_before_the_talker_finished(loop, graph):
    from core.pipeline.declarations.demo import SpeechRequest

    chunks, result = loop.run_until_complete(_synth(graph, SpeechRequest("Stream me", max_tokens=48)))
    assert len(chunks) == 96 // CHUNK
    t = result.timings
    assert t["first_chunk"] < t["talker_finished"] <= t["total"], t


def test_long_requests_keep_every_frame_when_their_chunk_prompts_repeat(loop, graph):
    # talker / code2wav prompts are placeholder ids: with vLLM's prefix cache on, a later chunk (or request) hit
    # an earlier one's cached KV and came back short (2560 samples for 144 frames, then an error)
    from core.pipeline.declarations.demo import SpeechRequest

    for i in range(2):
        chunks, result = loop.run_until_complete(_synth(graph, SpeechRequest("Say it twice", max_tokens=90,
                                                                              request_id=f"long-{i}")))
        hop = chunks[0].samples.numel() // chunks[0].codes.shape[0]
        assert all(c.samples.numel() == c.codes.shape[0] * hop for c in chunks)
        assert result.samples == result.codes.shape[0] * hop and result.codes.shape[0] > 128


def test_closing_the_stream_aborts_the_request_in_every_stage(loop, graph):
    from core.pipeline.declarations.demo import SpeechRequest

    async def take_one_then_close():
        gen = graph.synthesize(SpeechRequest("Go away early", max_tokens=200, request_id="gone"))
        await gen.__anext__()  # the first chunk: the talker is still running
        held = {stage for stage, ids in graph.running().items() if "gone" in ids}
        await gen.aclose()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any("gone" in ids for ids in graph.running().values()):
            await asyncio.sleep(0.05)
        return held, graph.running()

    held, after = loop.run_until_complete(take_one_then_close())
    assert "talker" in held  # it was in flight when the client went away
    assert not any("gone" in ids for ids in after.values()), after
    assert graph.dead_stage is None


def test_the_graph_keeps_serving_after_an_aborted_request(loop, graph, serial):
    from core.pipeline.declarations.demo import SpeechRequest

    text, voice, seed, max_tokens = REQUESTS[0]
    chunks, result = loop.run_until_complete(_synth(graph, SpeechRequest(text, voice, seed, max_tokens)))
    assert torch.equal(result.codes, serial[0][1].codes) and _pcm(chunks) == _pcm(serial[0][0])


@pytest.mark.parametrize("kw, field", [
    ({"text": "  "}, "text"), ({"voice": 4}, "voice"), ({"voice": -1}, "voice"), ({"seed": 2**32}, "seed"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 512}, "max_tokens"), ({"voice": True}, "voice"),
    ({"request_id": ""}, "request_id"), ({"text": "word " * 600}, "max_tokens"),
])
def test_check_refuses_a_bad_request_naming_the_field_before_any_engine_work(loop, graph, kw, field):
    from core.pipeline.declarations.demo import SpeechRequest
    from omni_backends.errors import BadInputError

    req = SpeechRequest(**{"text": "Hello", **kw})
    with pytest.raises(BadInputError, match=field):
        graph.check(req)

    async def first():
        return await graph.synthesize(req).__anext__()

    with pytest.raises(BadInputError, match=field):
        loop.run_until_complete(first())
    assert not any(graph.running().values())


def test_a_request_id_in_flight_is_refused(loop, graph):
    from core.pipeline.declarations.demo import SpeechRequest
    from omni_backends.errors import BadInputError

    async def two():
        gen = graph.synthesize(SpeechRequest("Twice", max_tokens=40, request_id="twice"))
        await gen.__anext__()
        try:
            with pytest.raises(BadInputError, match="request_id 'twice' is already in flight"):
                graph.check(SpeechRequest("Twice", request_id="twice"))
        finally:
            await gen.aclose()

    loop.run_until_complete(two())


def test_stage_info_says_the_engines_started_at_once(graph):
    info = graph.stage_info
    for stage in ("thinker", "talker", "code2wav"):
        assert info[stage]["engine_start_seconds"] > 0 and info[stage]["kv_cache_memory_bytes"] > 0
        assert info[stage]["engine"]["engine_core_process"] is True
    assert info["graph"]["overlapped"]  # every stage started before every other stage was ready
    assert graph.sample_rate == 16000 and graph.num_voices == 4
