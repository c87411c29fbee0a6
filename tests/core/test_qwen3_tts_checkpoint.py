"""Qwen3-TTS checkpoints in the released layout, without an engine: the writer's file set and config, the
reader's one error per kind of bad checkpoint, vLLM-Omni's deploy defaults read from the installed wheel, and
the speech request checked and built through vLLM-Omni's own prompt-length function.

The tiny checkpoints (CustomVoice, VoiceDesign, Base) are written once per module
(``tests/fixtures/qwen3_tts/tiny_checkpoint.py``); each bad checkpoint is a copy with one thing broken.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("torch")

from core.models import vllm_omni  # noqa: E402

pytestmark = pytest.mark.skipif(vllm_omni.installed_version() is None,
                                reason="vllm-omni is not installed (scripts/setup.sh test installs it)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from tests.fixtures.qwen3_tts.tiny_checkpoint import VARIANTS, create_tiny_qwen3_tts

    root = tmp_path_factory.mktemp("qwen3tts-layout")
    return {v: create_tiny_qwen3_tts(str(root / f"Qwen3-TTS-tiny-{v}"), variant=v) for v in VARIANTS}


def _copy(src: str, tmp_path, name: str = "ckpt") -> str:
    dst = str(tmp_path / name)
    shutil.copytree(src, dst)
    return dst


def _edit_config(d: str, edit) -> None:
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    edit(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f)


# ---------------------------------------------------------------- the writer: the released layout
@pytest.mark.parametrize("tts_type", ["custom_voice", "voice_design", "base"])
def test_writer_writes_the_released_file_set_and_config(tiny, tts_type) -> None:
    from core.models.qwen3_tts.layout import ROOT_KEYS, TALKER_KEYS, released_files

    d = tiny[tts_type]
    files = sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)
    assert files == sorted([*released_files(), "omni-checkpoint.json"])  # the writer's record is beside, not inside
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["Qwen3TTSForConditionalGeneration"]
    assert cfg["tokenizer_type"] == "qwen3_tts_tokenizer_12hz" and cfg["tts_model_type"] == tts_type
    assert set(ROOT_KEYS) <= set(cfg) and set(TALKER_KEYS) <= set(cfg["talker_config"])
    assert ("speaker_encoder_config" in cfg) == (tts_type == "base")
    assert not [k for k in json.dumps(cfg).split('"') if k.startswith("omni")]  # no private keys
    rope = cfg["talker_config"]["rope_scaling"]
    assert rope["interleaved"] is True and rope["rope_type"] == "default"
    assert sum(rope["mrope_section"]) * 2 == cfg["talker_config"]["head_dim"]
    assert cfg["talker_config"]["codec_eos_token_id"] == 2150  # vLLM-Omni's pipeline stop token
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        tok = json.load(f)
    assert tok["tokenizer_class"] == "Qwen2Tokenizer"
    specials = {v["content"]: int(k) for k, v in tok["added_tokens_decoder"].items()}
    assert specials["<|im_start|>"] == cfg["im_start_token_id"] and specials["<|tts_pad|>"] == cfg["tts_pad_token_id"]


def test_real_size_configs_are_the_released_ones() -> None:
    """0.6B / 1.7B: the released shapes and rope settings (no weights drawn)."""
    from core.models.qwen3_tts.checkpoint_writer import qwen3_tts_config

    ids = {"assistant": 77091, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|tts_pad|>": 151671,
           "<|tts_bos|>": 151672, "<|tts_eos|>": 151673, "__size__": 151936}
    for size, hidden, name in (("0.6b", 1024, "0b6"), ("1.7b", 2048, "1b7")):
        cfg = qwen3_tts_config(ids, size)
        t = cfg["talker_config"]
        assert (cfg["tts_model_size"], t["hidden_size"], t["num_hidden_layers"], t["head_dim"]) == (name, hidden, 28, 128)
        assert t["rope_scaling"] == {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"}
        assert t["position_id_per_seconds"] == 13 and t["text_vocab_size"] == 151936 and t["vocab_size"] == 3072


# ---------------------------------------------------------------- the reader
def test_read_checkpoint_describes_each_variant(tiny) -> None:
    from core.models.qwen3_tts import read_checkpoint

    cv = read_checkpoint(tiny["custom_voice"])
    assert cv.name == "Qwen3-TTS-tiny-custom_voice" and cv.task_types == ("CustomVoice",)
    assert set(cv.speakers) == {"vivian", "serena", "uncle_fu", "ryan", "aiden", "eric"}
    assert cv.languages[0] == "Auto" and "english" in cv.languages
    assert (cv.sample_rate, cv.num_code_groups, cv.samples_per_frame, cv.decoder_window) == (24000, 4, 1920, 72)
    assert cv.talker_dtype == "float32" and cv.base_unsupported_reason is None
    vd = read_checkpoint(tiny["voice_design"])
    assert vd.task_types == ("VoiceDesign",) and vd.speakers == ()
    base = read_checkpoint(tiny["base"])
    assert base.task_types == ("Base",)
    import importlib.util

    if importlib.util.find_spec("torchaudio") is None:
        assert "torchaudio" in base.base_unsupported_reason


def _drop(rel: str):
    def breaks(d: str) -> None:
        os.remove(os.path.join(d, rel))
    return breaks


def _truncate(rel: str):
    def breaks(d: str) -> None:
        path = os.path.join(d, rel)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    return breaks


def _misshape(d: str) -> None:
    from safetensors.torch import load_file, save_file

    path = os.path.join(d, "model.safetensors")
    w = load_file(path)
    w["talker.codec_head.weight"] = w["talker.codec_head.weight"][:-1].clone()
    save_file(w, path)


def _config(key: str, value):
    def breaks(d: str) -> None:
        _edit_config(d, lambda cfg: cfg.__setitem__(key, value))
    return breaks


BAD = {
    "missing config.json": (_drop("config.json"), "config.json: missing"),
    "missing vocab.json": (_drop("vocab.json"), "vocab.json: missing"),
    "missing merges.txt": (_drop("merges.txt"), "merges.txt: missing"),
    "missing generation_config.json": (_drop("generation_config.json"), "generation_config.json: missing"),
    "missing speech_tokenizer/configuration.json": (_drop("speech_tokenizer/configuration.json"),
                                                    "configuration.json: missing"),
    "missing weights": (_drop("model.safetensors"), "no talker weights"),
    "missing speech tokenizer weights": (_drop("speech_tokenizer/model.safetensors"), "model.safetensors: missing"),
    "truncated weights": (_truncate("model.safetensors"), "model.safetensors: unreadable or truncated"),
    "truncated speech tokenizer": (_truncate("speech_tokenizer/model.safetensors"), "unreadable or truncated"),
    "mis-shaped tensor": (_misshape, "talker.codec_head.weight has shape [3071, 64]"),
    "25 Hz tokenizer": (_config("tokenizer_type", "qwen3_tts_tokenizer_25hz"),
                        "tokenizer_type 'qwen3_tts_tokenizer_25hz' is not supported"),
    "wrong model_type": (_config("model_type", "qwen3_omni_moe"), "model_type 'qwen3_omni_moe' is not supported"),
    "wrong tts_model_type": (_config("tts_model_type", "voice_clone"), "tts_model_type 'voice_clone' is not supported"),
    "unreadable config": (lambda d: open(os.path.join(d, "config.json"), "w").write("{not json"), "unreadable JSON"),
    "released key missing": (lambda d: _edit_config(d, lambda c: c.pop("tts_model_size")), "missing key(s) tts_model_size"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_checkpoint_is_one_error_naming_the_file_or_value(tiny, tmp_path, kind) -> None:
    from core.models.qwen3_tts import read_checkpoint
    from omni_backends.errors import BadInputError

    breaks, says = BAD[kind]
    d = _copy(tiny["custom_voice"], tmp_path)
    breaks(d)
    with pytest.raises(BadInputError) as err:
        read_checkpoint(d)
    msg = str(err.value)
    assert says in msg, msg
    assert d in msg  # names where


def test_not_a_directory(tmp_path) -> None:
    from core.models.qwen3_tts import read_checkpoint
    from omni_backends.errors import BadInputError

    with pytest.raises(BadInputError, match="not a directory"):
        read_checkpoint(str(tmp_path / "nowhere"))


# ---------------------------------------------------------------- deploy defaults from the wheel
def test_deploy_defaults_come_from_the_installed_wheel() -> None:
    import yaml

    from core.models.qwen3_tts import deploy_defaults

    d = deploy_defaults()
    from core.models.qwen3_tts.deploy import _package_dirs

    pkg = _package_dirs()[0]
    assert os.path.isfile(os.path.join(pkg, "version.py"))
    assert d.source[0] == os.path.join(pkg, "deploy", "qwen3_tts.yaml")
    with open(d.source[0]) as f:
        raw = yaml.safe_load(f)
    talker = raw["stages"][0]
    assert d.talker_sampling["temperature"] == talker["default_sampling_params"]["temperature"]
    assert d.subtalker_sampling == talker["subtalker_sampling_params"]
    assert d.engine_args["code2wav"]["dtype"] == raw["stages"][1]["dtype"]
    if d.version == "0.30.0":  # the values of the release this project pairs with
        assert (d.initial_chunk_frames, d.chunk_frames, d.left_context_frames) == (1, 25, 72)
        assert d.talker_sampling["stop_token_ids"] == [2150] and d.talker_sampling["min_tokens"] == 2
        assert d.talker_sampling["repetition_penalty"] == 1.05 and d.talker_sampling["top_k"] == 50
        assert d.model_arch == {"talker": "Qwen3TTSTalkerForConditionalGeneration", "code2wav": "Qwen3TTSCode2Wav"}
        assert d.max_instructions_length == 500 and d.model_runner == "v2"


# ---------------------------------------------------------------- the speech request
def _req(**kw):
    from core.models.qwen3_tts import TTSRequest

    return TTSRequest(**{"text": "Hello world!", **kw})


@pytest.mark.parametrize("tts_type,kw,param,says", [
    ("custom_voice", dict(text="  "), "input", "empty"),
    ("custom_voice", dict(speaker="nobody"), "voice", "aiden, eric, ryan, serena, uncle_fu, vivian"),
    ("custom_voice", dict(task_type="VoiceDesign", instructions="calm"), "task_type", "CustomVoice checkpoint"),
    ("custom_voice", dict(language="klingon"), "language", "supported: Auto"),
    ("custom_voice", dict(ref_text="hi"), "task_type", "does not support task_type='Base'"),
    ("custom_voice", dict(max_new_tokens=0), "max_new_tokens", "1..4096"),
    ("custom_voice", dict(seed=-1), "seed", "non-negative"),
    ("custom_voice", dict(instructions="x" * 501), "instructions", "max 500"),
    ("voice_design", dict(task_type="VoiceDesign"), "instructions", "requires 'instructions'"),
    ("voice_design", dict(), "task_type", "VoiceDesign checkpoint"),  # vLLM-Omni's default task is CustomVoice
])
def test_check_tts_request_names_the_field(tiny, tts_type, kw, param, says) -> None:
    from core.models.qwen3_tts import TTSRequestError, check_tts_request, read_checkpoint

    with pytest.raises(TTSRequestError) as err:
        check_tts_request(read_checkpoint(tiny[tts_type]), _req(**kw))
    assert err.value.param == param and says in str(err.value), (err.value.param, str(err.value))


def test_base_request_on_this_stack(tiny) -> None:
    from core.models.qwen3_tts import TTSRequestError, check_tts_request, read_checkpoint

    ckpt = read_checkpoint(tiny["base"])
    req = _req(task_type="Base", ref_audio="data:audio/wav;base64,AAAA", ref_text="hi")
    if ckpt.base_unsupported_reason:
        with pytest.raises(TTSRequestError, match="torchaudio") as err:
            check_tts_request(ckpt, req)
        assert err.value.param == "task_type"
    else:
        assert check_tts_request(ckpt, req).task_type == "Base"


def test_check_tts_request_normalises_as_vllm_omni(tiny) -> None:
    from core.models.qwen3_tts import check_tts_request, read_checkpoint

    ckpt = read_checkpoint(tiny["custom_voice"])
    r = check_tts_request(ckpt, _req(speaker="Vivian", language="ENGLISH"))
    assert (r.task_type, r.speaker, r.language) == ("CustomVoice", "vivian", "English")
    assert check_tts_request(ckpt, _req()).speaker == ckpt.speakers[0]  # the default speaker
    vd = check_tts_request(read_checkpoint(tiny["voice_design"]), _req(task_type="VoiceDesign", instructions="calm"))
    assert vd.speaker is None and vd.language == "Auto"


def test_talker_inputs_through_vllm_omnis_prompt_length(tiny) -> None:
    """The placeholder length is vLLM-Omni's estimate with the checkpoint's dialect map: a dialect speaker with
    language Auto adds the dialect's language id (one more row than a plain speaker)."""
    from core.models.qwen3_tts import deploy_defaults, read_checkpoint, talker_inputs
    from core.payloads import EXTRA_ARGS_KEY

    ckpt, deploy = read_checkpoint(tiny["custom_voice"]), deploy_defaults()
    plain, sp = talker_inputs(ckpt, deploy, _req(speaker="vivian", seed=7, max_new_tokens=30))
    dialect, _ = talker_inputs(ckpt, deploy, _req(speaker="eric"))
    assert set(plain["prompt_token_ids"]) == {1}
    assert len(dialect["prompt_token_ids"]) == len(plain["prompt_token_ids"]) + 1
    assert sp.seed == 7 and sp.extra_args["tts_local_seed"] == 7 and EXTRA_ARGS_KEY in sp.extra_args
    assert sp.max_tokens == 30 and sp.min_tokens == 2 and sp.stop_token_ids == [2150]
    assert sp.temperature == deploy.talker_sampling["temperature"] and not sp.detokenize
    _, default = talker_inputs(ckpt, deploy, _req())
    assert default.max_tokens == deploy.talker_sampling["max_tokens"] and default.seed is None
    assert "tts_local_seed" not in default.extra_args


def test_stage_engine_args_map_the_released_architecture(tiny) -> None:
    from core.models.qwen3_tts import deploy_defaults, read_checkpoint, stage_engine_args

    ckpt, deploy = read_checkpoint(tiny["custom_voice"]), deploy_defaults()
    talker = stage_engine_args(ckpt, deploy, "talker")
    c2w = stage_engine_args(ckpt, deploy, "code2wav", max_num_seqs=2)
    assert talker["hf_overrides"] == {"architectures": ["Qwen3TTSTalkerForConditionalGeneration"]}
    assert c2w["hf_overrides"] == {"architectures": ["Qwen3TTSCode2Wav"]}
    assert talker["kind"] == "ar" and c2w["kind"] == "generation"
    assert talker["dtype"] == "float32" and c2w["dtype"] == deploy.engine_args["code2wav"]["dtype"]
    assert talker["max_model_len"] == 512  # the tiny talker's max_position_embeddings caps the deploy's 4096
    assert c2w["max_model_len"] == 4 * (72 + 25) + 1 and c2w["max_num_batched_tokens"] == 2 * c2w["max_model_len"]


def test_code2wav_model_gets_the_deploys_connector_config_and_async_chunk(tiny) -> None:
    """The code2wav engine carries what vLLM-Omni's ``OmniEngineArgs.create_model_config`` gives stage 1: the
    deploy YAML's talker -> code2wav connector (its ``extra`` as the YAML writes it, ``stage_id`` 1), read by
    the model's ``load_weights`` (``decode_batch_max_size``, the codec chunking, its decoder CUDA graph), and the
    deploy's ``async_chunk``. A chunk window given (e.g. ``--chunk-frames``) sets the chunk sizes; the talker
    carries none. The declaration's window follows ``async_chunk``: no left context when the model keeps it."""
    import yaml

    from core.models.qwen3_tts import deploy_defaults, read_checkpoint, stage_engine_args
    from core.models.qwen3_tts.stages import decoder_graph_batch_sizes
    from core.patches.model_config_fields import ADDITIONAL_CONFIG_KEY
    from core.pipeline.config import GraphConfig
    from core.pipeline.declarations.qwen3_tts import load
    from core.pipeline.spec import ChunkWindow

    ckpt, deploy = read_checkpoint(tiny["custom_voice"]), deploy_defaults()
    with open(deploy.source[0]) as f:
        raw = yaml.safe_load(f)
    name = next(iter(raw["stages"][1]["input_connectors"].values()))
    declared = raw["connectors"][name]
    assert "additional_config" not in stage_engine_args(ckpt, deploy, "talker")
    fields = stage_engine_args(ckpt, deploy, "code2wav")["additional_config"][ADDITIONAL_CONFIG_KEY]
    # the decoder graph's batch sizes reach the deploy's decode_batch_max_size (the deploy names none: vLLM-Omni's
    # decoder would capture batch 1 only and replay concurrent chunks one by one)
    graph_batches = declared["extra"].get("decode_cudagraph_batch_sizes") or decoder_graph_batch_sizes(
        int(declared["extra"].get("decode_batch_max_size") or 0))
    assert fields == {"async_chunk": bool(raw["async_chunk"]), "stage_connector_config": {
        "name": declared["name"], "extra": {**declared["extra"], "stage_id": 1,
                                            **({"decode_cudagraph_batch_sizes": graph_batches} if graph_batches else {})}}}
    if deploy.version == "0.30.0":
        assert fields["async_chunk"] is True and fields["stage_connector_config"]["extra"]["decode_batch_max_size"] == 4
        assert fields["stage_connector_config"]["extra"]["decode_cudagraph_batch_sizes"] == [1, 2, 4]
    assert [decoder_graph_batch_sizes(m) for m in (0, 1, 2, 4, 6)] == [[], [], [1, 2], [1, 2, 4], [1, 2, 4, 6]]
    window = ChunkWindow(first_chunk_frames=2, chunk_frames=10, left_context_frames=30)
    extra = stage_engine_args(ckpt, deploy, "code2wav", window=window)["additional_config"][ADDITIONAL_CONFIG_KEY][
        "stage_connector_config"]["extra"]
    assert (extra["initial_codec_chunk_frames"], extra["codec_chunk_frames"]) == (2, 10)
    assert extra["codec_left_context_frames"] == (declared["extra"]["codec_left_context_frames"]
                                                  if deploy.async_chunk else 30)
    assert extra["decode_batch_max_size"] == declared["extra"]["decode_batch_max_size"]
    model = load(GraphConfig(model=tiny["custom_voice"]), None, print)
    assert model.audio_request_state is deploy.async_chunk
    assert model.window.left_context_frames == (0 if deploy.async_chunk else deploy.left_context_frames)


def test_undecoded_reference_audio_is_refused_by_name(tiny) -> None:
    """vLLM-Omni's server decodes URL / base64 ``ref_audio`` itself; talker_inputs takes it decoded or refuses it."""
    from core.models.qwen3_tts import TTSRequestError, deploy_defaults, read_checkpoint, talker_inputs

    ckpt = read_checkpoint(tiny["base"])
    req = _req(task_type="Base", ref_audio="data:audio/wav;base64,AAAA", ref_text="hi")
    with pytest.raises(TTSRequestError, match="decoded audio") as err:
        talker_inputs(ckpt, deploy_defaults(), req, check=False)
    assert err.value.param == "ref_audio"
