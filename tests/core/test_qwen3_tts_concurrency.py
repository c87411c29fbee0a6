"""Concurrent Qwen3-TTS utterances through the stage graph decode together in code2wav (issue 44, item 2).

The stage graph (``core.pipeline.graph.StageGraph``) on the tiny CustomVoice checkpoint, vLLM-Omni's own classes,
8 seeded requests at once: the code2wav engine's forwards carry chunk requests of several utterances (the
worker's ``omni_state["forward_requests"]``: requests per real forward) and vLLM-Omni's model decodes them as
one group (its own counters, ``VLLM_OMNI_QWEN3_CODE2WAV_BATCH_STATS``, logged by the engine after every forward:
``bucket_groups=[((group size, frames), count), ...]``). On a CUDA device its decoder graph is captured at the
batch sizes up to ``decode_batch_max_size`` (``core.models.qwen3_tts.stages.decoder_graph_batch_sizes``;
``test_qwen3_tts.py``'s decode-config test), so such groups replay together.
"""

from __future__ import annotations

import ast
import asyncio
import re

import pytest

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]
torch = pytest.importorskip("torch")

from core.models import vllm_omni  # noqa: E402

#: concurrent utterances, frames each (> the first chunk of 1 frame and one chunk of 25: three chunks)
N, FRAMES = 8, 30


@pytest.mark.skipif(vllm_omni.installed_version() is None, reason="vllm-omni is not installed")
def test_concurrent_utterances_share_code2wav_forwards(tmp_path, test_device, monkeypatch, capfd) -> None:
    from core.models.qwen3_tts import TTSRequest
    from core.pipeline.config import GraphConfig
    from core.pipeline.graph import StageGraph
    from omni_backends.registry import select
    from tests.core.conftest import _need_vllm
    from tests.fixtures.qwen3_tts.tiny_checkpoint import create_tiny_qwen3_tts

    _need_vllm(test_device)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_OMNI_QWEN3_CODE2WAV_BATCH_STATS", "1")  # read by the engine-core process it starts
    monkeypatch.setenv("VLLM_OMNI_QWEN3_CODE2WAV_BATCH_STATS_LOG_EVERY", "1")
    model = create_tiny_qwen3_tts(str(tmp_path / "tiny"), backend=select(test_device).backend, variant="custom_voice")
    greedy = {"temperature": 0, "ignore_eos": True, "stop_token_ids": []}  # every utterance makes its FRAMES
    cfg = GraphConfig(model=model, device=test_device, stage_overrides={
        "0": {"default_sampling_params": greedy, "max_num_seqs": 16, "max_model_len": 512},
        "1": {"dtype": "float32", "max_num_seqs": 16}})

    async def run():
        g = await StageGraph.start(cfg)
        try:
            async def one(i):
                chunks = 0
                async for item in g.synthesize(TTSRequest(text="Hello world, this is omni.", speaker="vivian",
                                                          seed=i, max_new_tokens=FRAMES)):
                    chunks += hasattr(item, "samples") and hasattr(item, "index")
                return chunks

            chunks = await asyncio.wait_for(asyncio.gather(*[one(i) for i in range(N)]), 600)
            state = (await g.engines["code2wav"].collective_rpc("omni_state"))[0]
            return chunks, state
        finally:
            await g.shutdown()

    chunks, state = asyncio.new_event_loop().run_until_complete(run())
    assert chunks == [3] * N  # 1 + 25 + 4 frames
    per_forward = {int(k): v for k, v in state["forward_requests"].items()}
    assert sum(k * v for k, v in per_forward.items()) == 3 * N  # every chunk request in exactly one forward
    assert max(per_forward) > 1, per_forward  # concurrent utterances' chunks in one forward
    # the model's own counters: the groups its decoder was handed
    cap = capfd.readouterr()
    logged = re.findall(r"Code2Wav batch stats:.*?bucket_groups=(\[.*?\])\s*$", cap.out + cap.err, re.M)
    assert logged, "the code2wav engine logged no batch stats (VLLM_OMNI_QWEN3_CODE2WAV_BATCH_STATS)"
    groups = ast.literal_eval(logged[-1])
    assert max(size for (size, _frames), _count in groups) > 1, groups
