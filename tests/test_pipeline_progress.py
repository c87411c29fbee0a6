"""Progress while the stage graph's engines start (``core.pipeline.graph.engines._say_while_starting``): a long
start is not a silent one. No engine starts here: the stages' readiness is the dict the starter fills."""

from __future__ import annotations

import asyncio
import time

from core.pipeline.declarations.demo import STAGES
from core.pipeline.graph.engines import _say_while_starting


def test_the_heartbeat_names_the_stages_still_starting_until_cancelled():
    said: list[str] = []
    ready: dict[str, dict] = {}

    async def main() -> None:
        beat = asyncio.ensure_future(_say_while_starting(said.append, ready, STAGES, time.perf_counter(),
                                                         graphs=True, every=0.05))
        await asyncio.sleep(0.12)  # two beats, nothing ready
        ready[STAGES[0]] = {}
        await asyncio.sleep(0.1)
        ready.update({s: {} for s in STAGES})
        await asyncio.sleep(0.1)  # all ready: beats say nothing
        beat.cancel()
        n = len(said)
        await asyncio.sleep(0.1)
        assert len(said) == n  # cancelled: no more lines

    asyncio.run(main())
    assert len(said) >= 3, said
    assert all(s.startswith("still starting after ") for s in said), said
    assert all(stage in said[0] for stage in STAGES) and "compiles and captures graphs" in said[0], said
    later = [s for s in said[2:] if STAGES[0] not in s]
    assert later and all(STAGES[1] in s and STAGES[2] in s for s in later), said


def test_an_eager_start_does_not_mention_graphs():
    said: list[str] = []

    async def main() -> None:
        beat = asyncio.ensure_future(_say_while_starting(said.append, {}, STAGES, 0.0, graphs=False, every=0.02))
        await asyncio.sleep(0.05)
        beat.cancel()

    asyncio.run(main())
    assert said and all("graphs" not in s for s in said), said
