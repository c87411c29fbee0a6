"""Random-weight Qwen3-TTS checkpoints that vLLM-Omni's own classes load: tiny, and the released 0.6B / 1.7B sizes.

:func:`write_qwen3_tts` writes a ``config.json`` (``model_type: qwen3_tts``), the talker weights
(``talker.*``: Qwen3 backbone, codec / text embeddings, text projection, codec head, the code predictor),
a ``speech_tokenizer/`` folder (tokenizer config, feature-extractor config, Mimi encoder + Qwen3-TTS decoder
weights) and a byte-level BPE text tokenizer trained locally with the special tokens the prompt builder uses.
Names are the Hugging Face checkpoint's, so vLLM's own loader path (``load_weights``) runs.

Sizes (:data:`SIZES`):

- ``tiny``: the tests' fixture (head_dim 32, what vLLM's CPU attention supports; float32; 4 codebooks;
  speaker encoder included). Weights are drawn on the CPU from ``torch.Generator().manual_seed(seed)``,
  byte for byte what ``tests/fixtures/qwen3_tts/tiny_checkpoint.py`` wrote before this module existed.
- ``0.6b`` / ``1.7b``: the shapes of ``Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice`` / ``-1.7B-CustomVoice``
  (bfloat16 talker, float32 speech tokenizer as released; ``tts_model_type: custom_voice``, so no speaker
  encoder weights: the talker keeps its own initialisation, ``load_weights``). Sources, read 2026-12-02
  (no single public config.json was readable whole; each number is from a source below and cross-checked by
  parameter count against the released files, 0.6B ``model.safetensors`` 1.81 GB and 1.7B ~3.6 GiB):

  * talker, both sizes (layers 28, heads 16, kv heads 8, head_dim 128, codec vocab 3072, text vocab 151936,
    text hidden 2048, 16 code groups, rope_theta 1e6, codec special ids 2148-2157, language ids):
    ``ivan-digital/qwen3-asr-swift`` docs/tts-model.md (0.6B: hidden 1024, intermediate 3072) and the
    mlx-audio Swift test fixture "matching mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-bf16" (1.7B: hidden
    2048, intermediate 6144; the Swift doc's 8192 would make the file ~0.7 GB larger than released);
  * code predictor (hidden 1024, 5 layers, 16 heads, 8 kv heads, head_dim 128, intermediate 3072, vocab 2048):
    both sources above and ``DePasqualeOrg/mlx-audio-plus`` docs/qwen3_tts_components.md; its codec
    embeddings are talker-hidden wide and ``small_to_mtp_projection`` maps 2048 -> 1024 on 1.7B (vLLM-Omni
    0.30.0 ``common/qwen3_code_predictor.py``);
  * speech tokenizer decoder (codebook 2048 x dim 512, hidden 512, latent 1024, 8 layers, 16 heads of 64,
    intermediate 1024, sliding window 72, decoder_dim 1536, upsample 8x5x4x3 after 2x2 = 1920 samples per
    frame at 24 kHz) and the Mimi encoder (transformers' ``MimiConfig`` defaults = Kyutai Mimi: 12.5 Hz,
    hidden 512, 8 layers, 32 quantizers of which the talker uses 16): mlx-audio-plus's table above (the
    wheel's ``Qwen3TTSTokenizerV2DecoderConfig`` defaults, hidden 1024 / intermediate 3072, are Qwen3-Omni's
    code2wav and would not fit the released 682 MB file).

  Left out on purpose: the talker's interleaved M-RoPE (``mrope_section [24, 20, 20]``): for text-only TTS
  prompts the three position components are equal, so it rotates exactly as 1-D RoPE with the same
  frequencies; the checkpoint says plain RoPE and the cost per token is the same.
  Real-size weights are drawn on ``backend.device()`` (a seeded generator there: the same seed on the same
  device type gives the same bytes), scaled ``1/sqrt(fan_in)`` so activations stay finite in bfloat16, and
  streamed to safetensors shards of ``shard_bytes`` (``model-0000N.safetensors`` + ``model.safetensors.index.json``).
  The text tokenizer is the small local one at every size (its ids are the config's special token ids).

The classes come from the product, :mod:`core.models.qwen3_tts` (vLLM-Omni 0.30.0's, loaded by
:mod:`core.models.vllm_omni`); this module only writes what they read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable, Iterator

from core.models.qwen3_tts import MODEL_TYPE, PACKAGE, TALKER_ARCH
from core.models.writing import ShardWriter, fresh_directory

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

# Released sizes (sources in the module docstring).
REAL_CODEC = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
                  codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
REAL_LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
                  "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069}
REAL_SPEAKERS = {"vivian": 3065, "serena": 3066, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861}
REAL_CODE_PREDICTOR = dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                           num_attention_heads=16, num_key_value_heads=8, head_dim=128)
REAL_DECODER = dict(codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024,
                    max_position_embeddings=8000, rope_theta=10000, num_attention_heads=16, num_key_value_heads=16,
                    head_dim=64, attention_bias=False, sliding_window=72, intermediate_size=1024, hidden_act="silu",
                    layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, num_hidden_layers=8, num_quantizers=16,
                    upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=1536, attention_dropout=0.0)

_CORPUS = """\
Hello world! The quick brown fox jumps over the lazy dog. A talker turns text into
codec frames and code2wav turns frames into sound. How are you today? Numbers
0 1 2 3 4 5 6 7 8 9, punctuation . , ; : ! ? ' " ( ) - and a new line.
"""


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
    vocab: int
    text_vocab: int | None  # None: the local tokenizer's size
    text_hidden: int
    num_code_groups: int
    codebook: int
    rope_theta: float
    max_position_embeddings: int
    code_predictor: dict[str, Any]
    dtype: str  # torch_dtype of the talker weights
    real: bool  # released shapes: weights scaled by fan-in, drawn on the backend's device, sharded


SIZES: dict[str, Size] = {
    "tiny": Size("tiny", HIDDEN, 2 * HIDDEN, 2, 2, 1, HEAD_DIM, TALKER_VOCAB, None, HIDDEN, NUM_CODE_GROUPS,
                 CODEBOOK, 10000, 512,
                 dict(vocab_size=CODEBOOK, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM, max_position_embeddings=64),
                 "float32", False),
    "0.6b": Size("0b6", 1024, 3072, 28, 16, 8, 128, 3072, 151936, 2048, 16, 2048, 1e6, 32768,
                 dict(REAL_CODE_PREDICTOR, max_position_embeddings=65536), "bfloat16", True),
    "1.7b": Size("1b7", 2048, 6144, 28, 16, 8, 128, 3072, 151936, 2048, 16, 2048, 1e6, 32768,
                 dict(REAL_CODE_PREDICTOR, max_position_embeddings=65536), "bfloat16", True),
}
#: codec frames per second of the 12 Hz tokenizer at the released sizes (24000 / 1920)
FRAME_RATE_HZ = 12.5


def size_spec(size: str) -> Size:
    """The :class:`Size` named ``size`` (a key of :data:`SIZES`); ``ValueError`` naming the choices otherwise."""
    if size not in SIZES:
        raise ValueError(f"unknown Qwen3-TTS checkpoint size {size!r}; choose one of {', '.join(SIZES)}")
    return SIZES[size]


# ------------------------------------------------------------------ configs
def tokenizer_12hz_config(size: str = "tiny") -> dict[str, Any]:
    """``speech_tokenizer/config.json``: Mimi encoder + Qwen3-TTS decoder (tiny, or the released shapes)."""
    if size_spec(size).real:
        return {"model_type": "qwen3_tts_tokenizer_12hz", "architectures": ["Qwen3TTSTokenizerV2Model"],
                "encoder_valid_num_quantizers": 16, "input_sample_rate": SAMPLE_RATE,
                "output_sample_rate": SAMPLE_RATE, "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
                "encoder_config": {}, "decoder_config": dict(REAL_DECODER)}
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


def qwen3_tts_config(text_vocab: int, special_ids: dict[str, int], size: str = "tiny") -> dict[str, Any]:
    """The top-level ``config.json`` for ``size``; ``text_vocab`` is the local tokenizer's size."""
    s = size_spec(size)
    cp = dict(s.code_predictor, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=s.rope_theta, attention_bias=False,
              num_code_groups=s.num_code_groups, tie_word_embeddings=False)
    talker = {
        "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim, "hidden_act": "silu", "max_position_embeddings": s.max_position_embeddings,
        "rms_norm_eps": 1e-6, "rope_theta": s.rope_theta, "tie_word_embeddings": False, "attention_bias": False,
        "num_code_groups": s.num_code_groups, "text_hidden_size": s.text_hidden,
        "text_vocab_size": s.text_vocab or text_vocab,
        "spk_id": dict(REAL_SPEAKERS if s.real else SPEAKERS),
        "spk_is_dialect": {k: False for k in (REAL_SPEAKERS if s.real else SPEAKERS)},
        "codec_language_id": dict(REAL_LANGUAGES if s.real else LANGUAGES), **(REAL_CODEC if s.real else CODEC),
        "code_predictor_config": cp,
    }
    cfg = {
        "architectures": [TALKER_ARCH],
        "model_type": MODEL_TYPE,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_type": "custom_voice",
        "tts_model_size": s.name,
        "im_start_token_id": special_ids["<|im_start|>"],
        "im_end_token_id": special_ids["<|im_end|>"],
        "tts_pad_token_id": special_ids["<|tts_pad|>"],
        "tts_bos_token_id": special_ids["<|tts_bos|>"],
        "tts_eos_token_id": special_ids["<|tts_eos|>"],
        "torch_dtype": s.dtype,
        "talker_config": talker,
        "omni_tiny_format": FORMAT_VERSION,
    }
    if not s.real:
        cfg["speaker_encoder_config"] = {
            "mel_dim": 16, "enc_dim": HIDDEN, "enc_channels": [32, 32, 32, 32, 96], "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 16, "enc_res2net_scale": 4,
            "enc_se_channels": 16, "sample_rate": SAMPLE_RATE,
        }
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


def _json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


def write_qwen3_tts(directory: str, size: str = "tiny", seed: int = DEFAULT_SEED, backend: Any = None,
                    shard_bytes: int | None = 2 << 30, progress: Callable[[str], None] | None = None) -> str:
    """Write a random-weight Qwen3-TTS checkpoint of ``size`` (a key of :data:`SIZES`) into ``directory``.

    Written into a temporary sibling and renamed, so an interrupted run leaves nothing half-written.
    ``backend``: the driver vLLM-Omni's module code sees while the writer builds its modules, and (real
    sizes) whose ``device()`` draws the weights (default: the process's). ``shard_bytes``: the talker
    weights' shard size at real sizes (tiny: always one ``model.safetensors``). ``progress``: called with a
    line per part written. Returns ``directory``. Raises ``ValueError`` for an unknown size and
    :class:`~core.models.vllm_omni.VllmOmniNotInstalled` without the wheel.
    """
    import time

    s = size_spec(size)
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
        ids = _write_text_tokenizer(tmp)
        cfg = qwen3_tts_config(ids.pop("__size__"), ids, size)
        _json(os.path.join(tmp, "config.json"), cfg)
        talker = ShardWriter(tmp, "model", shard_bytes if s.real else None)
        for name, shape, std, base in talker_specs(cfg):
            talker.add(name, draw(name, shape, std, base))
        if not s.real:
            for name, t in _speaker_encoder_weights(cfg, draw):
                talker.add(name, t)
        files = talker.close()
        say(f"talker: {talker.total_bytes / 2**30:.2f} GiB in {len(files)} file(s), {time.perf_counter() - t0:.1f} s")
        st = os.path.join(tmp, "speech_tokenizer")
        os.makedirs(st)
        tok_cfg = tokenizer_12hz_config(size)
        _json(os.path.join(st, "config.json"), tok_cfg)
        _json(os.path.join(st, "preprocessor_config.json"), feature_extractor_config())
        speech = ShardWriter(st, "model", None)
        for name, t in _speech_tokenizer_weights(tok_cfg, draw):
            speech.add(name, t)
        speech.close()
        say(f"speech tokenizer: {speech.total_bytes / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s")
        with open(os.path.join(tmp, "omni-tiny.json"), "w") as f:
            json.dump({"format": FORMAT_VERSION, "seed": int(seed), "vllm_omni": "0.30.0", "size": size,
                       "device": str(draw.device)}, f)
    return directory


def create_tiny_qwen3_tts(directory: str, seed: int = DEFAULT_SEED, backend: Any = None) -> str:
    """Write the tiny checkpoint (:func:`write_qwen3_tts` with ``size="tiny"``). Returns ``directory``."""
    return write_qwen3_tts(directory, "tiny", seed, backend)


def checkpoint_info(directory: str) -> dict[str, Any]:
    """What :func:`write_qwen3_tts` recorded in ``omni-tiny.json`` (size, seed, ...); ``{}`` when absent."""
    try:
        with open(os.path.join(directory, "omni-tiny.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
