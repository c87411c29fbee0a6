"""Random-weight Qwen3-TTS checkpoints in the released layout, config verbatim: tiny (tests), 0.6B / 1.7B (bench).

:func:`write_qwen3_tts` writes what a ``Qwen/Qwen3-TTS-12Hz-*`` folder holds (:mod:`.layout`): ``config.json``
with every key of the release (``architectures: ["Qwen3TTSForConditionalGeneration"]``, ``tokenizer_type``,
``tts_model_type``, ``tts_model_size``, the special token ids, ``talker_config`` with its ``rope_scaling``
(interleaved M-RoPE, ``mrope_section``) and ``position_id_per_seconds``, ``speaker_encoder_config`` for Base),
``generation_config.json``, the talker weights (``talker.*``; ``speaker_encoder.*`` for Base), the text tokenizer
as released (Qwen2 byte-level BPE: ``vocab.json``, ``merges.txt``, ``tokenizer_config.json`` with the special
tokens as added tokens after the BPE vocabulary), ``preprocessor_config.json`` and ``speech_tokenizer/``
(``config.json``, ``configuration.json``, ``preprocessor_config.json``, ``model.safetensors``: Mimi encoder +
Qwen3-TTS decoder). Names are the Hugging Face checkpoint's, so vLLM's loader (``load_weights``) runs. Nothing
private goes into the config; the writer's own record (size, variant, seed) is ``omni-checkpoint.json`` beside it.

Variants (:data:`VARIANTS`, the release's ``tts_model_type``): ``custom_voice`` (speakers in
``talker_config.spk_id``), ``voice_design`` (no speakers: the voice comes from the instructions), ``base``
(voice clone from reference audio: speaker encoder config and weights).

Sizes (:data:`SIZES`):

- ``tiny``: the tests' checkpoint. The released config with small shapes (hidden 64, head_dim 32 -- what vLLM's
  CPU attention supports -- 4 codebooks, ``mrope_section`` [6, 5, 5] = the released [24, 20, 20] scaled to
  head_dim 32) and the released values otherwise: codec vocabulary 3072 with codebook 2048 and the special codec
  ids 2148-2157 (so vLLM-Omni's stop token 2150 is this checkpoint's codec EOS), the language ids, the decoder's
  1920 samples per frame at 24 kHz and its 72-frame window; float32. Drawn on the CPU from
  ``torch.Generator().manual_seed(seed)``.
- ``0.6b`` / ``1.7b``: the shapes of ``Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice`` / ``-1.7B-CustomVoice`` (bfloat16
  talker, float32 speech tokenizer as released). Sources, read 2026-12-02 (each number cross-checked by parameter
  count against the released files, 0.6B ``model.safetensors`` 1.81 GB and 1.7B ~3.6 GiB):

  * talker, both sizes (layers 28, heads 16, kv heads 8, head_dim 128, codec vocab 3072, text vocab 151936,
    text hidden 2048, 16 code groups, rope_theta 1e6, codec special ids 2148-2157, language ids):
    ``ivan-digital/qwen3-asr-swift`` docs/tts-model.md (0.6B: hidden 1024, intermediate 3072) and the
    mlx-audio Swift test fixture "matching mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-bf16" (1.7B: hidden
    2048, intermediate 6144);
  * code predictor (hidden 1024, 5 layers, 16 heads, 8 kv heads, head_dim 128, intermediate 3072, vocab 2048):
    both sources above and ``DePasqualeOrg/mlx-audio-plus`` docs/qwen3_tts_components.md;
  * speech tokenizer decoder (codebook 2048 x dim 512, hidden 512, latent 1024, 8 layers, 16 heads of 64,
    intermediate 1024, sliding window 72, decoder_dim 1536, upsample 8x5x4x3 after 2x2 = 1920 samples per
    frame at 24 kHz) and the Mimi encoder (transformers' ``MimiConfig`` defaults: 12.5 Hz, 32 quantizers of
    which the talker uses 16): mlx-audio-plus's table above;
  * root config keys, ``rope_scaling`` ``{"interleaved": true, "mrope_section": [24, 20, 20], "rope_type":
    "default"}``, ``position_id_per_seconds`` 13, ``assistant_token_id``: several independent projects' copies
    of the released config.json (``/work/shared/research/vllm-omni-serving.md`` 1e).

  Real-size weights are drawn on ``backend.device()`` (a seeded generator there), scaled ``1/sqrt(fan_in)`` so
  activations stay finite in bfloat16, and streamed to safetensors shards of ``shard_bytes``.

Speaker names and ids are the release's where a source gives them; the tiny dialect speaker (``eric``,
``sichuan_dialect``) exercises ``spk_is_dialect``. The text tokenizer is a small byte-level BPE trained here at
every size (its ids are the config's special token ids; ``text_vocab_size`` covers it).

The classes come from the product, :mod:`core.models.qwen3_tts` (vLLM-Omni 0.30.0's, loaded by
:mod:`core.models.vllm_omni`); this module only writes what they read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable, Iterator

from core.models.qwen3_tts import PACKAGE
from core.models.qwen3_tts.layout import (
    MODEL_TYPE, RELEASED_ARCH, SAMPLE_RATE, SPEECH_TOKENIZER_DIR, SPEECH_TOKENIZER_MODEL_TYPE, TOKENIZER_TYPE_12HZ,
)
from core.models.writing import ShardWriter, fresh_directory

DEFAULT_SEED = 1234
#: what the writer records beside the checkpoint (never in config.json)
RECORD_FILE = "omni-checkpoint.json"
VARIANTS = ("custom_voice", "voice_design", "base")

# Released codec vocabulary (all sizes): codes [0, 2048), special ids 2148-2157, speaker ids up to 3071.
CODEC_VOCAB = 3072
CODEBOOK = 2048
CODEC = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
             codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069}
SPEAKERS = {"vivian": 3065, "serena": 3066, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861}
#: tiny only: one dialect speaker and its dialect's language id (vLLM-Omni's prompt builder reads both)
TINY_DIALECT = ("eric", 2875, "sichuan_dialect", 2062)
#: the decoder's samples per codec frame (24 kHz / 12.5 Hz) and its attention window (frames)
UPSAMPLE_RATES, UPSAMPLING_RATIOS = [8, 5, 4, 3], [2, 2]
SAMPLES_PER_FRAME = 1920
DECODER_WINDOW = 72
POSITION_ID_PER_SECONDS = 13

# Tiny shapes. Talker and code predictor share the hidden size (no projection).
HIDDEN = 64
HEAD_DIM = 32
NUM_CODE_GROUPS = 4  # Q: codebook 0 + 3 residual codebooks
TEXT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tts_pad|>", "<|tts_bos|>", "<|tts_eos|>"]

REAL_CODE_PREDICTOR = dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                           num_attention_heads=16, num_key_value_heads=8, head_dim=128)
REAL_DECODER = dict(codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024,
                    max_position_embeddings=8000, rope_theta=10000, num_attention_heads=16, num_key_value_heads=16,
                    head_dim=64, attention_bias=False, sliding_window=DECODER_WINDOW, intermediate_size=1024,
                    hidden_act="silu", layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, num_hidden_layers=8,
                    num_quantizers=16, upsample_rates=UPSAMPLE_RATES, upsampling_ratios=UPSAMPLING_RATIOS,
                    decoder_dim=1536, attention_dropout=0.0)

_CORPUS = """\
Hello world! The quick brown fox jumps over the lazy dog. A talker turns text into
codec frames and code2wav turns frames into sound. How are you today? Numbers
0 1 2 3 4 5 6 7 8 9, punctuation . , ; : ! ? ' " ( ) - and a new line.
""" + "system\nuser\nassistant\n" * 40


@dataclasses.dataclass(frozen=True)
class Size:
    """One checkpoint size: the talker's shapes and what the writer does with them."""

    name: str  # tts_model_size in config.json
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    text_vocab: int | None  # None: the local tokenizer's size, rounded up
    text_hidden: int
    num_code_groups: int
    rope_theta: float
    max_position_embeddings: int
    mrope_section: tuple[int, int, int]
    code_predictor: dict[str, Any]
    dtype: str  # torch_dtype of the talker weights
    real: bool  # released shapes: weights scaled by fan-in, drawn on the backend's device, sharded


SIZES: dict[str, Size] = {
    "tiny": Size("tiny", HIDDEN, 2 * HIDDEN, 2, 2, 1, HEAD_DIM, None, HIDDEN, NUM_CODE_GROUPS, 10000, 512, (6, 5, 5),
                 dict(vocab_size=CODEBOOK, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM, max_position_embeddings=64),
                 "float32", False),
    "0.6b": Size("0b6", 1024, 3072, 28, 16, 8, 128, 151936, 2048, 16, 1e6, 32768, (24, 20, 20),
                 dict(REAL_CODE_PREDICTOR, max_position_embeddings=65536), "bfloat16", True),
    "1.7b": Size("1b7", 2048, 6144, 28, 16, 8, 128, 151936, 2048, 16, 1e6, 32768, (24, 20, 20),
                 dict(REAL_CODE_PREDICTOR, max_position_embeddings=65536), "bfloat16", True),
}
#: codec frames per second of the 12 Hz tokenizer (24000 / 1920), every size
FRAME_RATE_HZ = SAMPLE_RATE / SAMPLES_PER_FRAME


def size_spec(size: str) -> Size:
    """The :class:`Size` named ``size`` (a key of :data:`SIZES`); ``ValueError`` naming the choices otherwise."""
    if size not in SIZES:
        raise ValueError(f"unknown Qwen3-TTS checkpoint size {size!r}; choose one of {', '.join(SIZES)}")
    return SIZES[size]


# ------------------------------------------------------------------ configs
def tokenizer_12hz_config(size: str = "tiny") -> dict[str, Any]:
    """``speech_tokenizer/config.json``: Mimi encoder + Qwen3-TTS decoder (tiny, or the released shapes); both
    at 1920 samples per frame, 24 kHz."""
    common = {"model_type": SPEECH_TOKENIZER_MODEL_TYPE, "architectures": ["Qwen3TTSTokenizerV2Model"],
              "input_sample_rate": SAMPLE_RATE, "output_sample_rate": SAMPLE_RATE,
              "decode_upsample_rate": SAMPLES_PER_FRAME, "encode_downsample_rate": SAMPLES_PER_FRAME}
    if size_spec(size).real:
        return {**common, "encoder_valid_num_quantizers": 16, "encoder_config": {},
                "decoder_config": dict(REAL_DECODER)}
    return {
        **common,
        "encoder_valid_num_quantizers": NUM_CODE_GROUPS,
        "encoder_config": {
            "audio_channels": 1, "sampling_rate": SAMPLE_RATE, "frame_rate": FRAME_RATE_HZ, "hidden_size": 32,
            "num_filters": 4, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 3,
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
            "num_key_value_heads": 2, "head_dim": 16, "attention_bias": False, "sliding_window": DECODER_WINDOW,
            "intermediate_size": 64, "hidden_act": "silu", "layer_scale_initial_scale": 0.1, "rms_norm_eps": 1e-5,
            "num_hidden_layers": 1, "num_quantizers": NUM_CODE_GROUPS, "upsample_rates": UPSAMPLE_RATES,
            "upsampling_ratios": UPSAMPLING_RATIOS, "decoder_dim": 32, "attention_dropout": 0.0,
        },
    }


def feature_extractor_config() -> dict[str, Any]:
    """``speech_tokenizer/preprocessor_config.json`` and the root ``preprocessor_config.json`` (the talker reads
    the former at construction)."""
    return {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "sampling_rate": SAMPLE_RATE,
            "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True, "chunk_length_s": None,
            "overlap": None}


def generation_config() -> dict[str, Any]:
    """``generation_config.json`` as released (the talker's and the code predictor's ``subtalker_*`` sampling)."""
    return {"do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
            "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
            "max_new_tokens": 8192}


def speakers_of(size: str, variant: str) -> tuple[dict[str, int], dict[str, Any]]:
    """(``spk_id``, ``spk_is_dialect``) of ``variant`` at ``size``: the released speakers (tiny adds a dialect
    speaker) for ``custom_voice``; none otherwise (VoiceDesign and Base take no named speaker)."""
    if variant != "custom_voice":
        return {}, {}
    spk, dialect = dict(SPEAKERS), {name: False for name in SPEAKERS}
    if not size_spec(size).real:
        name, sid, dialect_name, _ = TINY_DIALECT
        spk[name], dialect[name] = sid, dialect_name
    return spk, dialect


def qwen3_tts_config(text_ids: dict[str, int], size: str = "tiny", variant: str = "custom_voice") -> dict[str, Any]:
    """The root ``config.json`` for ``size`` / ``variant`` in the released form; ``text_ids``: the local
    tokenizer's special token ids and ``__size__`` (its vocabulary size)."""
    s = size_spec(size)
    if variant not in VARIANTS:
        raise ValueError(f"unknown Qwen3-TTS variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    cp = dict(s.code_predictor, model_type="qwen3_tts_talker_code_predictor", hidden_act="silu", rms_norm_eps=1e-6,
              rope_theta=s.rope_theta, attention_bias=False, num_code_groups=s.num_code_groups,
              tie_word_embeddings=False, use_cache=True)
    spk, dialect = speakers_of(size, variant)
    languages = dict(LANGUAGES)
    if not s.real:
        languages[TINY_DIALECT[2]] = TINY_DIALECT[3]
    text_vocab = s.text_vocab or -(-text_ids["__size__"] // 64) * 64
    talker = {
        "model_type": "qwen3_tts_talker", "vocab_size": CODEC_VOCAB, "hidden_size": s.hidden,
        "intermediate_size": s.intermediate, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "hidden_act": "silu",
        "max_position_embeddings": s.max_position_embeddings, "rms_norm_eps": 1e-6, "rope_theta": s.rope_theta,
        "rope_scaling": {"interleaved": True, "mrope_section": list(s.mrope_section), "rope_type": "default"},
        "position_id_per_seconds": POSITION_ID_PER_SECONDS, "use_cache": True, "tie_word_embeddings": False,
        "attention_bias": False, "num_code_groups": s.num_code_groups, "text_hidden_size": s.text_hidden,
        "text_vocab_size": text_vocab, "spk_id": spk, "spk_is_dialect": dialect, "codec_language_id": languages,
        **CODEC, "code_predictor_config": cp,
    }
    cfg = {
        "architectures": [RELEASED_ARCH],
        "model_type": MODEL_TYPE,
        "tokenizer_type": TOKENIZER_TYPE_12HZ,
        "tts_model_type": variant,
        "tts_model_size": s.name,
        "assistant_token_id": text_ids["assistant"],
        "im_start_token_id": text_ids["<|im_start|>"],
        "im_end_token_id": text_ids["<|im_end|>"],
        "tts_pad_token_id": text_ids["<|tts_pad|>"],
        "tts_bos_token_id": text_ids["<|tts_bos|>"],
        "tts_eos_token_id": text_ids["<|tts_eos|>"],
        "torch_dtype": s.dtype,
        "talker_config": talker,
    }
    if variant == "base":
        cfg["speaker_encoder_config"] = (
            {"enc_dim": s.hidden, "sample_rate": SAMPLE_RATE} if s.real else
            {"mel_dim": 16, "enc_dim": HIDDEN, "enc_channels": [32, 32, 32, 32, 96],
             "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 16,
             "enc_res2net_scale": 4, "enc_se_channels": 16, "sample_rate": SAMPLE_RATE})
    return cfg


# ------------------------------------------------------------------ weights
#: one tensor to draw: (name, shape, tiny std, base) -> value = base + N(0, std^2) (real sizes: std from fan-in)
Spec = tuple[str, tuple[int, ...], float, float]


def _layer_specs(prefix: str, layers: int, *, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 inter: int) -> Iterator[Spec]:
    """Hugging Face Qwen3 decoder-layer weights (separate q/k/v, gate/up), then the final norm."""
    for i in range(layers):
        p = f"{prefix}.layers.{i}."
        yield p + "self_attn.q_proj.weight", (heads * head_dim, hidden), 0.15, 0.0
        yield p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden), 0.15, 0.0
        yield p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden), 0.1, 0.0
        yield p + "self_attn.o_proj.weight", (hidden, heads * head_dim), 0.1, 0.0
        yield p + "self_attn.q_norm.weight", (head_dim,), 0.05, 1.0
        yield p + "self_attn.k_norm.weight", (head_dim,), 0.05, 1.0
        yield p + "mlp.gate_proj.weight", (inter, hidden), 0.1, 0.0
        yield p + "mlp.up_proj.weight", (inter, hidden), 0.1, 0.0
        yield p + "mlp.down_proj.weight", (hidden, inter), 0.1, 0.0
        yield p + "input_layernorm.weight", (hidden,), 0.05, 1.0
        yield p + "post_attention_layernorm.weight", (hidden,), 0.05, 1.0
    yield f"{prefix}.norm.weight", (hidden,), 0.05, 1.0


def talker_specs(cfg: dict[str, Any]) -> Iterator[Spec]:
    """Every ``talker.*`` tensor of ``config.json``'s talker, in the order the writer draws them."""
    t = cfg["talker_config"]
    cp = t["code_predictor_config"]
    h, th = t["hidden_size"], t["text_hidden_size"]
    yield from _layer_specs("talker.model", t["num_hidden_layers"], hidden=h, heads=t["num_attention_heads"],
                            kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"], inter=t["intermediate_size"])
    yield "talker.model.codec_embedding.weight", (t["vocab_size"], h), 0.5, 0.0
    yield "talker.model.text_embedding.weight", (t["text_vocab_size"], th), 0.5, 0.0
    yield "talker.codec_head.weight", (t["vocab_size"], h), 0.4, 0.0
    yield "talker.text_projection.linear_fc1.weight", (th, th), 0.2, 0.0
    yield "talker.text_projection.linear_fc1.bias", (th,), 0.05, 0.0
    yield "talker.text_projection.linear_fc2.weight", (h, th), 0.2, 0.0
    yield "talker.text_projection.linear_fc2.bias", (h,), 0.05, 0.0
    yield from _layer_specs("talker.code_predictor.model", cp["num_hidden_layers"], hidden=cp["hidden_size"],
                            heads=cp["num_attention_heads"], kv_heads=cp["num_key_value_heads"],
                            head_dim=cp["head_dim"], inter=cp["intermediate_size"])
    for k in range(cp["num_code_groups"] - 1):
        yield f"talker.code_predictor.model.codec_embedding.{k}.weight", (cp["vocab_size"], h), 0.5, 0.0
        yield f"talker.code_predictor.lm_head.{k}.weight", (cp["vocab_size"], cp["hidden_size"]), 0.4, 0.0
    if cp["hidden_size"] != h:  # vLLM-Omni's CodePredictorWrapper projects talker hidden -> predictor hidden
        yield "talker.code_predictor.small_to_mtp_projection.weight", (cp["hidden_size"], h), 0.1, 0.0
        yield "talker.code_predictor.small_to_mtp_projection.bias", (cp["hidden_size"],), 0.05, 0.0


def _fan_in_std(name: str, shape: tuple[int, ...], std: float, base: float) -> float:
    """Real sizes: norms / biases keep the small tiny noise; matrices and convolutions 1/sqrt(fan_in);
    embedding tables and codebooks unit-ish (0.5, as the tiny ones), fed through RMSNorm."""
    if base != 0.0 or len(shape) < 2:
        return min(std, 0.05)
    if "embedding" in name or "codebook" in name or name.endswith(("embed", "embed_sum")):
        return std
    return 1.0 / math.sqrt(max(1, math.prod(shape[1:])))


class _Drawer:
    """Random tensors from one seeded generator, in call order.

    tiny: on the CPU, ``base + randn * std`` in float32 (the fixture's historical bytes); real sizes: on
    ``device``, std from :func:`_fan_in_std`, cast to ``dtype`` and moved to the CPU."""

    def __init__(self, seed: int, real: bool, device: Any = None, dtype: Any = None) -> None:
        import torch

        self.real = real
        self.device = torch.device("cpu") if (device is None or not real) else torch.device(device)
        self.g = torch.Generator(device=self.device).manual_seed(int(seed))
        self.dtype = dtype

    def __call__(self, name: str, shape: tuple[int, ...], std: float, base: float = 0.0, dtype: Any = None) -> Any:
        import torch

        if not self.real:
            x = torch.randn(*shape, generator=self.g) * std
            return (x + base) if base else x
        x = torch.randn(*shape, generator=self.g, device=self.device)
        x.mul_(_fan_in_std(name, shape, std, base))
        if base:
            x.add_(base)
        return x.to(dtype or self.dtype).cpu()


def _module_specs(module: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``module.state_dict()`` as (name, tensor): what a real checkpoint holds (parameters and persistent buffers)."""
    for name, t in module.state_dict().items():
        yield f"{prefix}{name}", t


def _module_weights(module: Any, prefix: str, draw: _Drawer) -> Iterator[tuple[str, Any]]:
    """``module``'s state dict, floating tensors re-drawn (std 0.1; norms and scales around 1)."""
    for name, t in _module_specs(module, prefix):
        if not t.dtype.is_floating_point:
            yield name, t.detach().clone().cpu()
        elif (name.endswith(("norm.weight", "scale", ".alpha", ".beta")) or "layer_scale" in name
              or (draw.real and name.endswith("cluster_usage"))):  # real sizes: VQ codebooks = embed_sum / usage ~ 1
            yield name, draw(name, tuple(t.shape), 0.02, 1.0, dtype=t.dtype)
        else:
            yield name, draw(name, tuple(t.shape), 0.1, 0.0, dtype=t.dtype).to(t.dtype)


def _speech_tokenizer_weights(tok_cfg: dict[str, Any], draw: _Drawer) -> Iterator[tuple[str, Any]]:
    import torch

    from core.models.vllm_omni import load_module

    conf = load_module(f"{PACKAGE}.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    modeling = load_module(f"{PACKAGE}.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    c = conf.Qwen3TTSTokenizerV2Config(**tok_cfg)
    with torch.device(draw.device):  # real sizes: built where the weights are drawn (fast on an accelerator)
        dec = modeling.Qwen3TTSTokenizerV2Decoder._from_config(c.decoder_config)
    yield from _module_weights(dec, "decoder.", draw)
    del dec
    with torch.device(draw.device):
        enc = modeling.Qwen3TTSTokenizerV2Encoder._from_config(c.encoder_config)
    yield from _module_weights(enc, "encoder.", draw)


def _speaker_encoder_weights(cfg: dict[str, Any], draw: _Drawer) -> Iterator[tuple[str, Any]]:
    from core.models.vllm_omni import load_module

    talker = load_module(f"{PACKAGE}.qwen3_tts_talker")
    conf = load_module(f"{PACKAGE}.configuration_qwen3_tts")
    enc = talker.Qwen3TTSSpeakerEncoder(conf.Qwen3TTSSpeakerEncoderConfig(**cfg["speaker_encoder_config"]))
    yield from _module_weights(enc, "speaker_encoder.", draw)


# ------------------------------------------------------------------ writer
def _write_text_tokenizer(out: str) -> dict[str, int]:
    """The released text tokenizer's files (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``): a
    byte-level BPE trained on a small corpus, the special tokens as added tokens after its vocabulary (as
    Qwen's are). Returns the ids the config names, and ``__size__``: the vocabulary with the added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=384, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.model.save(out)  # vocab.json + merges.txt
    base = tok.get_vocab_size()
    ids = {name: base + i for i, name in enumerate(TEXT_SPECIALS)}
    vocab = tok.get_vocab()
    for word in ("assistant", "user", "system"):  # one BPE token each, as in Qwen's vocabulary
        if word not in vocab:
            raise RuntimeError(f"the local BPE did not learn {word!r} as one token; enlarge its corpus")
        ids[word] = vocab[word]
    added = {str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for name, i in ids.items() if name in TEXT_SPECIALS}
    _json(os.path.join(out, "tokenizer_config.json"), {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": TEXT_SPECIALS[1:], "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    return ids | {"__size__": base + len(TEXT_SPECIALS)}


def _json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


def write_qwen3_tts(directory: str, size: str = "tiny", seed: int = DEFAULT_SEED, backend: Any = None,
                    shard_bytes: int | None = 2 << 30, progress: Callable[[str], None] | None = None,
                    variant: str = "custom_voice") -> str:
    """Write a random-weight Qwen3-TTS checkpoint of ``size`` (a key of :data:`SIZES`) and ``variant`` (one of
    :data:`VARIANTS`, the config's ``tts_model_type``) into ``directory``, in the released layout.

    Written into a temporary sibling and renamed, so an interrupted run leaves nothing half-written.
    ``backend``: the driver vLLM-Omni's module code sees while the writer builds its modules, and (real
    sizes) whose ``device()`` draws the weights (default: the process's). ``shard_bytes``: the talker
    weights' shard size at real sizes (tiny: always one ``model.safetensors``). ``progress``: called with a
    line per part written. Returns ``directory``. Raises ``ValueError`` for an unknown size or variant and
    :class:`~core.models.vllm_omni.VllmOmniNotInstalled` without the wheel.
    """
    import time

    s = size_spec(size)
    if variant not in VARIANTS:
        raise ValueError(f"unknown Qwen3-TTS variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    say = progress or (lambda line: None)
    directory = os.path.abspath(directory)
    t0 = time.perf_counter()
    with fresh_directory(directory, ".qwen3-tts-") as tmp:
        import torch

        from core.models.vllm_omni import load_module

        load_module("platforms", backend)
        if backend is None and s.real:
            from omni_backends.registry import get_backend

            backend = get_backend()
        draw = _Drawer(seed, s.real, backend.device() if s.real else None, getattr(torch, s.dtype))
        cfg = qwen3_tts_config(_write_text_tokenizer(tmp), size, variant)
        _json(os.path.join(tmp, "config.json"), cfg)
        _json(os.path.join(tmp, "generation_config.json"), generation_config())
        _json(os.path.join(tmp, "preprocessor_config.json"), feature_extractor_config())
        talker = ShardWriter(tmp, "model", shard_bytes if s.real else None)
        for name, shape, std, base in talker_specs(cfg):
            talker.add(name, draw(name, shape, std, base))
        if variant == "base":
            for name, t in _speaker_encoder_weights(cfg, draw):
                talker.add(name, t)
        files = talker.close()
        say(f"talker: {talker.total_bytes / 2**30:.2f} GiB in {len(files)} file(s), {time.perf_counter() - t0:.1f} s")
        st = os.path.join(tmp, SPEECH_TOKENIZER_DIR)
        os.makedirs(st)
        tok_cfg = tokenizer_12hz_config(size)
        _json(os.path.join(st, "config.json"), tok_cfg)
        _json(os.path.join(st, "configuration.json"), {"framework": "pytorch", "task": "feature-extraction",
                                                        "allow_remote": True})
        _json(os.path.join(st, "preprocessor_config.json"), feature_extractor_config())
        speech = ShardWriter(st, "model", None)
        for name, t in _speech_tokenizer_weights(tok_cfg, draw):
            speech.add(name, t)
        speech.close()
        say(f"speech tokenizer: {speech.total_bytes / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s")
        _json(os.path.join(tmp, RECORD_FILE), {"seed": int(seed), "vllm_omni": "0.30.0", "size": size,
                                               "variant": variant, "device": str(draw.device)})
    return directory


def checkpoint_info(directory: str) -> dict[str, Any]:
    """What :func:`write_qwen3_tts` recorded in :data:`RECORD_FILE` (size, variant, seed, ...); ``{}`` when absent
    (e.g. a downloaded checkpoint)."""
    try:
        with open(os.path.join(directory, RECORD_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
