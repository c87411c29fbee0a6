"""The demo pipeline's request check (``core.pipeline.declarations.demo.check_request``), the one the demo
declaration gives ``StageGraph.check`` and the serving tests' fake graph runs: each bad field refused naming it,
before any engine work (no engine here: the graph is built bare, with a word-counting tokenizer)."""

from __future__ import annotations

import pytest

from core.pipeline.declarations.demo import THINKER_MAX_MODEL_LEN, DEMO, SpeechRequest, check_request, voice_names
from core.pipeline.fields import MAX_SEED
from core.pipeline.graph import StageGraph
from core.pipeline.spec import ChunkWindow, PipelineModel
from omni_backends.errors import BadInputError


def _words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("req, words", [
    (SpeechRequest(""), "text must be non-empty"),
    (SpeechRequest("   "), "text must be non-empty"),
    (SpeechRequest("hi", voice=3), "voice must be in 0..2"),
    (SpeechRequest("hi", voice=True), "voice must be an integer"),
    (SpeechRequest("hi", seed=-1), f"seed must be in 0..{MAX_SEED}"),
    (SpeechRequest("hi", seed=1.5), "seed must be an integer"),
    (SpeechRequest("hi", max_tokens=0), f"max_tokens must be in 1..{THINKER_MAX_MODEL_LEN - 1}"),
    (SpeechRequest("hi", request_id=" "), "request_id must be non-empty"),
    (SpeechRequest("hi", request_id="busy"), "already in flight"),
    (SpeechRequest("w " * (THINKER_MAX_MODEL_LEN - 31), max_tokens=32), "exceeds the thinker's context"),
    ("hi", "expected a SpeechRequest"),
])
def test_each_bad_field_is_refused_naming_it(req, words):
    with pytest.raises(BadInputError, match=words):
        check_request(req, num_voices=3, count_tokens=_words, in_flight={"busy"})


def test_a_good_request_passes_at_the_bounds():
    for req in (SpeechRequest("hi", voice=2, seed=MAX_SEED, request_id="free"),
                SpeechRequest("w " * (THINKER_MAX_MODEL_LEN - 32), max_tokens=32)):
        assert check_request(req, num_voices=3, count_tokens=_words, in_flight={"busy"}) is None


def test_the_graph_checks_with_its_voices_tokenizer_and_requests_in_flight():
    model = PipelineModel(model_dir="demo", sample_rate=16000, samples_per_frame=160, voices=voice_names(2),
                          window=ChunkWindow(16, 16), info={"tokenizer": lambda text: {"input_ids": [0] * _words(text)}})
    graph = StageGraph(None, DEMO, model, {}, {})
    graph.check(SpeechRequest("hi", voice=1))
    with pytest.raises(BadInputError, match="voice must be in 0..1"):
        graph.check(SpeechRequest("hi", voice=2))
    with pytest.raises(BadInputError, match="exceeds"):
        graph.check(SpeechRequest("w " * THINKER_MAX_MODEL_LEN))
    graph._in_flight.add("r1")
    with pytest.raises(BadInputError, match="already in flight"):
        graph.check(SpeechRequest("hi", request_id="r1"))
