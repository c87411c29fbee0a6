"""A stage engine of the stage graph that dies (its engine-core process killed, as the OOM killer would) fails
every in-flight request with ``StageFailedError`` naming the stage, marks the graph dead, and nothing hangs
(issue 26). Its own graph: this one does not survive the module."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]

#: seconds within which a failure must surface (a hang fails the test instead of blocking the suite)
NO_HANG = 120


@pytest.fixture(scope="module")
def graph(loop, demo_dir, test_device):
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from core.pipeline.config import GraphConfig
    from core.pipeline.graph import StageGraph

    g = loop.run_until_complete(StageGraph.start(GraphConfig(model_dir=demo_dir, device=test_device, chunk_frames=4)))
    yield g
    loop.run_until_complete(asyncio.wait_for(g.shutdown(), NO_HANG))


@pytest.fixture(scope="module")
def killed(loop, graph):
    """Two requests in flight (one streaming audio, one still waiting for its first chunk), then the talker's
    engine-core process is killed; what each request raised, a request after, the graph's dead stage, and the
    engine processes still alive after the graph's shutdown."""
    from core.pipeline.declarations.demo import SpeechRequest
    from core.pipeline.release import engine_core_processes

    async def scenario():
        streaming = graph.synthesize(SpeechRequest("Keep talking", max_tokens=200, request_id="streaming"))
        await streaming.__anext__()  # audio is flowing: the talker is running this request

        async def drain(gen):
            async for _ in gen:
                pass

        waiting = asyncio.ensure_future(drain(graph.synthesize(SpeechRequest("Me too", max_tokens=200,
                                                                             request_id="waiting"))))
        every = [p for e in graph.engines.values() for p in engine_core_processes(e)]
        (proc,) = engine_core_processes(graph.engines["talker"])
        os.kill(proc.pid, signal.SIGKILL)
        errors = {}
        for name, aw in (("streaming", drain(streaming)), ("waiting", waiting)):
            try:
                await asyncio.wait_for(aw, NO_HANG)
                errors[name] = None
            except Exception as exc:  # what the caller sees
                errors[name] = exc
        try:
            await asyncio.wait_for(drain(graph.synthesize(SpeechRequest("After", request_id="after"))), NO_HANG)
            errors["after"] = None
        except Exception as exc:
            errors["after"] = exc
        dead_stage = graph.dead_stage
        await asyncio.wait_for(graph.shutdown(), NO_HANG)  # a dead graph still releases everything
        return errors, dead_stage, [p.pid for p in every if p.is_alive()]

    return loop.run_until_complete(scenario())


def test_every_in_flight_request_fails_naming_the_stage(killed):
    from omni_backends.errors import StageFailedError

    errors, _, _ = killed
    for name in ("streaming", "waiting"):
        exc = errors[name]
        assert isinstance(exc, StageFailedError), (name, exc)
        assert exc.stage == "talker", (name, exc)
        assert str(exc).startswith("stage talker failed while running: its engine"), str(exc)
        assert "the stage graph is dead" in str(exc)


def test_the_graph_is_marked_dead_and_refuses_later_requests(killed):
    from omni_backends.errors import StageFailedError

    errors, dead_stage, _ = killed
    assert dead_stage == "talker"
    assert isinstance(errors["after"], StageFailedError) and errors["after"].stage == "talker"


def test_the_dead_graph_shuts_down_leaving_no_engine_process(killed):
    _, _, alive = killed
    assert alive == []
