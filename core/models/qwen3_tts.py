"""vLLM-Omni's Qwen3-TTS models on the core runner, and a tiny random-weight checkpoint.

The classes are vLLM-Omni 0.30.0's own, unchanged, imported through
:mod:`core.models.vllm_omni` (no ``vllm_omni/__init__``, no patches):

- ``Qwen3TTSTalkerForConditionalGeneration`` (AR kind): text -> codec frames
  ``[T, Q]``; codebook 0 is sampled by vLLM, codebooks 1..Q-1 by its code
  predictor, which the runner calls as the talker MTP before each decode forward;
- ``Qwen3TTSCode2Wav`` (generation kind): codec frames -> waveform, in one forward.

Attribute access on this module (``core.models.qwen3_tts:Qwen3TTSCode2Wav``,
the qualified name :func:`core.models.register` gives vLLM's ``ModelRegistry``)
loads the class on first use, in whichever process vLLM builds the model.

:func:`create_tiny_qwen3_tts` writes a checkpoint those classes load: a
``config.json`` (``model_type: qwen3_tts``) with a tiny talker (head_dim 32,
what vLLM's CPU attention supports), code predictor and speaker encoder, a
``speech_tokenizer/`` folder (tokenizer config, feature-extractor config,
encoder + decoder weights) and a byte-level BPE text tokenizer trained locally
with the special tokens the prompt builder uses. Weights are random from a
fixed seed; names are the Hugging Face checkpoint's (``talker.*``,
``speaker_encoder.*``, ``speech_tokenizer/{encoder,decoder}.*``), so vLLM's
own loader path (``load_weights``) runs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

TALKER_ARCH = "Qwen3TTSTalkerForConditionalGeneration"
CODE2WAV_ARCH = "Qwen3TTSCode2Wav"
MODEL_TYPE = "qwen3_tts"
#: vLLM architecture name -> vLLM-Omni module (under ``vllm_omni.model_executor.models.qwen3_tts``)
ARCHITECTURES = {TALKER_ARCH: "qwen3_tts_talker", CODE2WAV_ARCH: "qwen3_tts_code2wav"}
_PKG = "model_executor.models.qwen3_tts"
DEFAULT_SEED = 1234
FORMAT_VERSION = 1

# Tiny shapes. Talker and code predictor share the hidden size (no projection).
HIDDEN = 64
HEAD_DIM = 32
NUM_CODE_GROUPS = 4  # Q: codebook 0 + 3 residual codebooks
CODEBOOK = 64  # real codec ids are [0, CODEBOOK); > the code predictor's default top_k (50)
TALKER_VOCAB = 96  # CODEBOOK codes + the special codec ids below
CODEC = dict(codec_pad_id=70, codec_bos_id=71, codec_eos_token_id=72, codec_think_id=73, codec_nothink_id=74,
             codec_think_bos_id=75, codec_think_eos_id=76)
SPEAKERS = {"alice": 80, "bob": 81}
LANGUAGES = {"english": 85, "chinese": 86}
SAMPLE_RATE = 24000
UPSAMPLE = (2, 2)  # decoder blocks' rates
UPSAMPLING_RATIOS = (2,)  # pre-decoder upsampling
TEXT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tts_pad|>", "<|tts_bos|>", "<|tts_eos|>",
                 "assistant", "user", "system"]

_CORPUS = """\
Hello world! The quick brown fox jumps over the lazy dog. A talker turns text into
codec frames and code2wav turns frames into sound. How are you today? Numbers
0 1 2 3 4 5 6 7 8 9, punctuation . , ; : ! ? ' " ( ) - and a new line.
"""


def model_class(arch: str) -> type:
    """vLLM-Omni's class for ``arch`` (a key of :data:`ARCHITECTURES`), unchanged."""
    from core.models.vllm_omni import load_module

    return getattr(load_module(f"{_PKG}.{ARCHITECTURES[arch]}"), arch)


def config_class() -> type:
    """vLLM-Omni's ``Qwen3TTSConfig`` (``model_type: qwen3_tts``)."""
    from core.models.vllm_omni import load_module

    return load_module(f"{_PKG}.configuration_qwen3_tts", platform=False).Qwen3TTSConfig


def register_config() -> bool:
    """Make ``model_type: qwen3_tts`` resolve in vLLM's and transformers' config
    registries (what vLLM-Omni's plugin does, without its patches). Returns
    False when vLLM-Omni is not installed (nothing registered)."""
    from core.models.vllm_omni import installed_version

    if installed_version() is None:
        return False
    from transformers import AutoConfig
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    cls = config_class()
    try:
        AutoConfig.register(MODEL_TYPE, cls)
    except ValueError:  # already registered
        pass
    if MODEL_TYPE not in _CONFIG_REGISTRY:
        _CONFIG_REGISTRY[MODEL_TYPE] = cls
    return True


def __getattr__(name: str) -> Any:
    if name in ARCHITECTURES:
        return model_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------ configs
def tokenizer_12hz_config() -> dict[str, Any]:
    """``speech_tokenizer/config.json``: tiny Mimi encoder + Qwen3-TTS decoder."""
    return {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "encoder_valid_num_quantizers": NUM_CODE_GROUPS,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": 8,
        "encode_downsample_rate": 8,
        "encoder_config": {
            "audio_channels": 1, "sampling_rate": SAMPLE_RATE, "frame_rate": 3000.0, "hidden_size": 32,
            "num_filters": 4, "num_residual_layers": 1, "upsampling_ratios": [2, 2, 2], "kernel_size": 3,
            "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2, "compress": 2,
            "codebook_size": CODEBOOK, "codebook_dim": 32, "num_quantizers": NUM_CODE_GROUPS,
            "num_semantic_quantizers": 1, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "sliding_window": 16,
            "max_position_embeddings": 256, "upsample_groups": 32, "use_conv_shortcut": False,
            "vector_quantization_hidden_dimension": 32,
        },
        "decoder_config": {
            "codebook_size": CODEBOOK, "codebook_dim": 32, "hidden_size": 32, "latent_dim": 32,
            "max_position_embeddings": 512, "rope_theta": 10000, "num_attention_heads": 2,
            "num_key_value_heads": 2, "head_dim": 16, "attention_bias": False, "sliding_window": 8,
            "intermediate_size": 64, "hidden_act": "silu", "layer_scale_initial_scale": 0.1, "rms_norm_eps": 1e-5,
            "num_hidden_layers": 1, "num_quantizers": NUM_CODE_GROUPS, "upsample_rates": list(UPSAMPLE),
            "upsampling_ratios": list(UPSAMPLING_RATIOS), "decoder_dim": 32, "attention_dropout": 0.0,
        },
    }


def feature_extractor_config() -> dict[str, Any]:
    """``speech_tokenizer/preprocessor_config.json`` (read by the talker at construction)."""
    return {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "sampling_rate": SAMPLE_RATE,
            "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True, "chunk_length_s": None,
            "overlap": None}


def qwen3_tts_config(text_vocab: int, special_ids: dict[str, int]) -> dict[str, Any]:
    """The top-level ``config.json``."""
    talker = {
        "vocab_size": TALKER_VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": HEAD_DIM, "hidden_act": "silu",
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000, "tie_word_embeddings": False,
        "attention_bias": False, "num_code_groups": NUM_CODE_GROUPS, "text_hidden_size": HIDDEN,
        "text_vocab_size": text_vocab, "spk_id": dict(SPEAKERS), "spk_is_dialect": {"alice": False, "bob": False},
        "codec_language_id": dict(LANGUAGES), **CODEC,
        "code_predictor_config": {
            "vocab_size": CODEBOOK, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": HEAD_DIM, "hidden_act": "silu",
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000, "attention_bias": False,
            "num_code_groups": NUM_CODE_GROUPS, "tie_word_embeddings": False,
        },
    }
    return {
        "architectures": [TALKER_ARCH],
        "model_type": MODEL_TYPE,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_type": "custom_voice",
        "tts_model_size": "tiny",
        "im_start_token_id": special_ids["<|im_start|>"],
        "im_end_token_id": special_ids["<|im_end|>"],
        "tts_pad_token_id": special_ids["<|tts_pad|>"],
        "tts_bos_token_id": special_ids["<|tts_bos|>"],
        "tts_eos_token_id": special_ids["<|tts_eos|>"],
        "torch_dtype": "float32",
        "talker_config": talker,
        "speaker_encoder_config": {
            "mel_dim": 16, "enc_dim": HIDDEN, "enc_channels": [32, 32, 32, 32, 96], "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 16, "enc_res2net_scale": 4,
            "enc_se_channels": 16, "sample_rate": SAMPLE_RATE,
        },
        "omni_tiny_format": FORMAT_VERSION,
    }


# ------------------------------------------------------------------ writer
def _write_text_tokenizer(out: str) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=TEXT_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "model_max_length": 512, "clean_up_tokenization_spaces": False}, f,
                  indent=2)
    return {s: tok.token_to_id(s) for s in TEXT_SPECIALS} | {"__size__": tok.get_vocab_size()}


def _rnd(g: Any, *shape: int, std: float) -> Any:
    import torch

    return torch.randn(*shape, generator=g) * std


def _qwen3_layers(prefix: str, layers: int, g: Any, *, hidden: int, heads: int, kv_heads: int, head_dim: int,
                  inter: int) -> dict[str, Any]:
    """Hugging Face Qwen3 decoder-layer weights (separate q/k/v, gate/up)."""
    import torch

    w = {}
    for i in range(layers):
        p = f"{prefix}.layers.{i}."
        w.update({
            p + "self_attn.q_proj.weight": _rnd(g, heads * head_dim, hidden, std=0.15),
            p + "self_attn.k_proj.weight": _rnd(g, kv_heads * head_dim, hidden, std=0.15),
            p + "self_attn.v_proj.weight": _rnd(g, kv_heads * head_dim, hidden, std=0.1),
            p + "self_attn.o_proj.weight": _rnd(g, hidden, heads * head_dim, std=0.1),
            p + "self_attn.q_norm.weight": 1.0 + _rnd(g, head_dim, std=0.05),
            p + "self_attn.k_norm.weight": 1.0 + _rnd(g, head_dim, std=0.05),
            p + "mlp.gate_proj.weight": _rnd(g, inter, hidden, std=0.1),
            p + "mlp.up_proj.weight": _rnd(g, inter, hidden, std=0.1),
            p + "mlp.down_proj.weight": _rnd(g, hidden, inter, std=0.1),
            p + "input_layernorm.weight": 1.0 + _rnd(g, hidden, std=0.05),
            p + "post_attention_layernorm.weight": 1.0 + _rnd(g, hidden, std=0.05),
        })
    w[f"{prefix}.norm.weight"] = torch.ones(hidden) + _rnd(g, hidden, std=0.05)
    return w


def _talker_weights(cfg: dict[str, Any], g: Any) -> dict[str, Any]:
    t, cp = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    h = t["hidden_size"]
    w = _qwen3_layers("talker.model", t["num_hidden_layers"], g, hidden=h, heads=t["num_attention_heads"],
                      kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"], inter=t["intermediate_size"])
    w["talker.model.codec_embedding.weight"] = _rnd(g, t["vocab_size"], h, std=0.5)
    w["talker.model.text_embedding.weight"] = _rnd(g, t["text_vocab_size"], t["text_hidden_size"], std=0.5)
    w["talker.codec_head.weight"] = _rnd(g, t["vocab_size"], h, std=0.4)
    th = t["text_hidden_size"]
    w.update({
        "talker.text_projection.linear_fc1.weight": _rnd(g, th, th, std=0.2),
        "talker.text_projection.linear_fc1.bias": _rnd(g, th, std=0.05),
        "talker.text_projection.linear_fc2.weight": _rnd(g, h, th, std=0.2),
        "talker.text_projection.linear_fc2.bias": _rnd(g, h, std=0.05),
    })
    w.update(_qwen3_layers("talker.code_predictor.model", cp["num_hidden_layers"], g, hidden=cp["hidden_size"],
                           heads=cp["num_attention_heads"], kv_heads=cp["num_key_value_heads"],
                           head_dim=cp["head_dim"], inter=cp["intermediate_size"]))
    for k in range(cp["num_code_groups"] - 1):
        w[f"talker.code_predictor.model.codec_embedding.{k}.weight"] = _rnd(g, cp["vocab_size"], h, std=0.5)
        w[f"talker.code_predictor.lm_head.{k}.weight"] = _rnd(g, cp["vocab_size"], cp["hidden_size"], std=0.4)
    return w


def _module_weights(module: Any, prefix: str, g: Any) -> dict[str, Any]:
    """``module.state_dict()`` (what a real checkpoint holds: parameters and
    persistent buffers), floating tensors re-drawn from ``g`` (std 0.1; norms
    and scales around 1)."""
    import torch

    out = {}
    for name, t in module.state_dict().items():
        if not t.dtype.is_floating_point:
            out[f"{prefix}{name}"] = t.detach().clone()
            continue
        if name.endswith(("norm.weight", "scale", ".alpha", ".beta")) or "layer_scale" in name:
            out[f"{prefix}{name}"] = torch.ones_like(t) + _rnd(g, *t.shape, std=0.02)
        else:
            out[f"{prefix}{name}"] = _rnd(g, *t.shape, std=0.1).to(t.dtype)
    return out


def _speech_tokenizer_weights(tok_cfg: dict[str, Any], g: Any) -> dict[str, Any]:
    from core.models.vllm_omni import load_module

    conf = load_module(f"{_PKG}.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    modeling = load_module(f"{_PKG}.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    c = conf.Qwen3TTSTokenizerV2Config(**tok_cfg)
    w = _module_weights(modeling.Qwen3TTSTokenizerV2Decoder._from_config(c.decoder_config), "decoder.", g)
    w.update(_module_weights(modeling.Qwen3TTSTokenizerV2Encoder._from_config(c.encoder_config), "encoder.", g))
    return w


def _speaker_encoder_weights(cfg: dict[str, Any], g: Any) -> dict[str, Any]:
    from core.models.vllm_omni import load_module

    talker = load_module(f"{_PKG}.qwen3_tts_talker")
    conf = load_module(f"{_PKG}.configuration_qwen3_tts")
    enc = talker.Qwen3TTSSpeakerEncoder(conf.Qwen3TTSSpeakerEncoderConfig(**cfg["speaker_encoder_config"]))
    return _module_weights(enc, "speaker_encoder.", g)


def _save(path: str, weights: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sorted(weights.items())}, path)


def create_tiny_qwen3_tts(directory: str, seed: int = DEFAULT_SEED, backend: Any = None) -> str:
    """Write a tiny random-weight Qwen3-TTS checkpoint into ``directory``.

    Written into a temporary sibling and renamed, so an interrupted run leaves
    nothing half-written. ``backend`` is the driver vLLM-Omni's module code
    sees while the writer builds its speech-tokenizer modules (default: the
    process's). Returns ``directory``. Raises
    :class:`~core.models.vllm_omni.VllmOmniNotInstalled` without the wheel.
    """
    import torch

    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".qwen3-tts-", dir=parent)
    try:
        from core.models.vllm_omni import load_module

        load_module("platforms", backend)
        g = torch.Generator().manual_seed(int(seed))
        ids = _write_text_tokenizer(tmp)
        cfg = qwen3_tts_config(ids.pop("__size__"), ids)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
        w = _talker_weights(cfg, g)
        w.update(_speaker_encoder_weights(cfg, g))
        _save(os.path.join(tmp, "model.safetensors"), w)
        st = os.path.join(tmp, "speech_tokenizer")
        os.makedirs(st)
        tok_cfg = tokenizer_12hz_config()
        with open(os.path.join(st, "config.json"), "w") as f:
            json.dump(tok_cfg, f, indent=2, sort_keys=True)
        with open(os.path.join(st, "preprocessor_config.json"), "w") as f:
            json.dump(feature_extractor_config(), f, indent=2, sort_keys=True)
        _save(os.path.join(st, "model.safetensors"), _speech_tokenizer_weights(tok_cfg, g))
        with open(os.path.join(tmp, "omni-tiny.json"), "w") as f:
            json.dump({"format": FORMAT_VERSION, "seed": int(seed), "vllm_omni": "0.30.0"}, f)
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory
