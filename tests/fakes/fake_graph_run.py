"""``python tests/fakes/fake_graph_run.py <omni-backends run options>``: ``omni-backends run`` end to end (option
checks, device, model validation, staging, writing, renaming into place, error mapping) over a stage graph that
starts no engine: :class:`InstantGraph` stands in for ``core.pipeline.graph.StageGraph`` and synthesises one
second of a sine wave. For tests of what ``run`` does around the engines (a disk that fills while it writes)."""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class InstantGraph:
    """What ``core.pipeline.run`` reads of a started ``StageGraph`` of the demo declaration; no engine."""

    sample_rate = 16000
    num_voices = 2
    stage_info = {**{s: {"engine_start_seconds": 0.0} for s in ("thinker", "talker", "code2wav")},
                  "graph": {"start_seconds": 0.0, "overlapped": True}}

    def __init__(self) -> None:
        from core.pipeline.declarations.demo import DEMO, voice_names
        from core.pipeline.spec import ChunkWindow, PipelineModel

        self.spec = DEMO
        self.model = PipelineModel(model_dir="instant", sample_rate=self.sample_rate, samples_per_frame=4000,
                                   voices=voice_names(self.num_voices), window=ChunkWindow(16, 16))

    @classmethod
    async def start(cls, cfg, backend, say=None):
        return cls()

    async def synthesize(self, req, request_id=None):
        import torch

        from core.pipeline.graph import AudioChunk, SpeechResult

        n = self.sample_rate
        wave = torch.tensor([0.5 * math.sin(2 * math.pi * 440 * i / n) for i in range(n)])
        codes = torch.zeros(4, 2, dtype=torch.int64)
        yield AudioChunk(0, wave, codes, 0.0)
        yield SpeechResult(req.request_id, "text", 3, 4, codes, n, {"thinker": 0.0, "talker": 0.0, "code2wav": 0.0,
                                                                   "first_chunk": 0.0, "total": 0.0})

    async def worker_stats(self):
        return {s: {"peak_device_memory_bytes": 0, "talker_mtp": "eager", "mtp_graph": False}
                for s in ("thinker", "talker", "code2wav")}

    async def shutdown(self):
        return None


if __name__ == "__main__":
    import core.pipeline.graph

    core.pipeline.graph.StageGraph = InstantGraph
    from omni_backends.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
