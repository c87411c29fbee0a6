"""Pipelines as declarations (``core.pipeline.spec``, ``core.pipeline.declarations``), without engines: which
declaration a model runs, the chunk schedule a ``ChunkWindow`` gives, the shape a ``PipelineSpec`` may have, and a
checkpoint refused before any engine starts by ``run --model`` / ``serve --model`` (exit 2, one error line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.pipeline.declarations import PIPELINES, declaration, pipeline_name, resolve
from core.pipeline.spec import CHUNKED, FULL, ChunkWindow, PipelineSpec, SpeechApi, StageSpec
from omni_backends.errors import BadInputError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def _schedule(window: ChunkWindow, frames: int) -> list[tuple[int, int, int]]:
    """``(context start, start, end)`` of each chunk the graph sends for ``frames`` frames (its loop, on paper)."""
    out, sent, index = [], 0, 0
    while sent < frames:
        end = min(window.next_end(sent, index), frames)
        out.append((window.context_start(sent), sent, end))
        sent, index = end, index + 1
    return out


def test_the_demo_and_qwen3_tts_are_declarations_the_graph_runs():
    demo, tts = resolve(None), declaration("qwen3_tts")
    assert demo.stage_names == ("thinker", "talker", "code2wav") and not demo.speech.named_events
    assert tts.stage_names == ("talker", "code2wav") and tts.speech.error_event == "speech.audio.error"
    assert [o.name for o in demo.options] == ["max_tokens"]
    assert [o.name for o in tts.options] == ["language", "instructions", "task_type", "max_new_tokens"]
    assert [s.hand_over for s in demo.stages] == [FULL, FULL, CHUNKED]
    assert tts.producer.name == "talker" and tts.audio.name == "code2wav"
    assert set(PIPELINES) == {"demo", "qwen3_tts"}


def test_a_chunk_window_gives_vllm_omnis_schedule():
    # Qwen3-TTS's deploy defaults: first chunk after 1 frame, then 25, each with up to 72 frames of left context
    assert _schedule(ChunkWindow(1, 25, 72), 60) == [(0, 0, 1), (0, 1, 26), (0, 26, 51), (0, 51, 60)]
    assert _schedule(ChunkWindow(1, 25, 72), 130)[-2:] == [(29, 101, 126), (54, 126, 130)]
    # the demo: a causal decoder, every earlier frame as context
    assert _schedule(ChunkWindow(16, 16, None), 40) == [(0, 0, 16), (0, 16, 32), (0, 32, 40)]
    with pytest.raises(BadInputError, match="chunk_frames must be an integer >= 1"):
        ChunkWindow(1, 0, 72)
    with pytest.raises(BadInputError, match="left_context_frames must be an integer >= 0"):
        ChunkWindow(1, 25, -1)


def test_only_the_last_stage_may_be_fed_in_chunks():
    def stage(name, hand_over=FULL):
        return StageSpec(name, "ar", dict, lambda *a: None, lambda *a: None, hand_over=hand_over)

    kw = dict(load=None, check=None, request_of_run=None, speech=SpeechApi(parse=None))
    with pytest.raises(ValueError, match="only the last stage"):
        PipelineSpec("x", (stage("a"), stage("b", CHUNKED), stage("c")), **kw)
    with pytest.raises(ValueError, match="distinct names"):
        PipelineSpec("x", (stage("a"), stage("a")), **kw)
    with pytest.raises(ValueError, match="kind must be one of"):
        StageSpec("a", "diffusion", dict, None, None)


@pytest.mark.parametrize("write, words", [
    (None, "does not exist"),
    ({}, "config.json is missing"),
    ("{not json", "is not readable JSON"),
    ({"model_type": "qwen3_omni_moe"}, "model_type 'qwen3_omni_moe' is not supported; supported: qwen3_tts"),
])
def test_a_folder_no_declaration_serves_is_refused_naming_what(tmp_path, write, words):
    d = tmp_path / "ckpt"
    if write is not None:
        d.mkdir()
        if write != {}:
            (d / "config.json").write_text(write if isinstance(write, str) else json.dumps(write))
    with pytest.raises(BadInputError, match=words):
        pipeline_name(str(d))


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_bad_checkpoint_is_one_error_line_exit_2_before_any_engine(tmp_path, command, test_device):
    d = tmp_path / "Qwen3-TTS-broken"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "tokenizer_type": "qwen3_tts_tokenizer_25hz"}))
    extra = ["--out", str(tmp_path / "out"), "--voice", "vivian"] if command == "run" else ["--port", "0"]
    p = subprocess.run([sys.executable, "-m", "omni_backends.cli", command, "--device", test_device, "--model", str(d),
                        *extra], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    errors = [line for line in p.stderr.splitlines() if line.startswith("omni-backends: error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-3000:]
    assert "Qwen3-TTS checkpoint" in errors[0] and "Traceback" not in p.stderr
    assert "engine" not in p.stderr.split("omni-backends: error:")[0].lower()  # nothing started before it
    assert not (tmp_path / "out").exists()


def test_model_and_model_dir_exclude_each_other():
    from core.pipeline.config import GraphConfig, RunConfig

    for cls in (GraphConfig, RunConfig):
        with pytest.raises(BadInputError, match="exclude each other"):
            cls(model="a", model_dir="b")


def test_stage_overrides_are_vllm_omnis_json_keyed_by_stage_id_or_name():
    from core.pipeline.config import parse_stage_overrides
    from core.pipeline.graph.engines import engine_overrides, stage_overrides_by_name

    tts = declaration("qwen3_tts")
    given = parse_stage_overrides('{"0": {"default_sampling_params": {"temperature": 0}, "max_num_seqs": 4},'
                                  ' "code2wav": {"dtype": "float32"}}')
    by_name = stage_overrides_by_name(given, tts)
    assert by_name == {"talker": {"default_sampling_params": {"temperature": 0}, "max_num_seqs": 4},
                       "code2wav": {"dtype": "float32"}}
    assert engine_overrides(by_name, "talker") == {"max_num_seqs": 4}  # the sampling is the declaration's
    with pytest.raises(BadInputError, match="stages are 0 \\(talker\\), 1 \\(code2wav\\)"):
        stage_overrides_by_name({"2": {}}, tts)
    with pytest.raises(BadInputError, match="max_num_seq is not an engine argument"):
        engine_overrides({"talker": {"max_num_seq": 4}}, "talker")
    with pytest.raises(BadInputError, match="not valid JSON"):
        parse_stage_overrides("{0: 1}")
