"""Create the demo models on disk: config.json + model.safetensors (+ tokenizer).

Random weights from a fixed seed (``torch.Generator``), real safetensors, a
byte-level BPE tokenizer trained locally with ``tokenizers`` for the thinker.
Shapes are chosen for vLLM's CPU attention backend (head_dim 32).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from core.models.writing import ShardWriter, fresh_directory

DEFAULT_SEED = 1234
HIDDEN = 128
HEADS = 4
KV_HEADS = 2
FORMAT_VERSION = 1  # bump when configs/weights layout change

_CORPUS = """\
The quick brown fox jumps over the lazy dog. Omni models hear, think and speak.
A thinker writes text, a talker turns its thoughts into codec tokens, and a
code-to-wave generator turns codes into sound. Hello world! How are you today?
Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation , . ; : ! ? ' " ( ) [ ] { } - _ / \\
"""


def _llama_config(arch: str, *, vocab: int, layers: int, max_pos: int, **extra: Any) -> dict[str, Any]:
    return {
        "architectures": [arch],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": extra.pop("bos_token_id", 0),
        "eos_token_id": extra.pop("eos_token_id", 1),
        "omni_demo_format": FORMAT_VERSION,
        **extra,
    }


def thinker_config() -> dict[str, Any]:
    return _llama_config("OmniDemoThinker", vocab=512, layers=2, max_pos=512)


def talker_config() -> dict[str, Any]:
    return _llama_config(
        "OmniDemoTalker", vocab=128, layers=2, max_pos=1024, thinker_hidden_size=HIDDEN, num_voices=4, num_codebooks=4
    )


def code2wav_config() -> dict[str, Any]:
    return _llama_config(
        "OmniDemoCode2Wav", vocab=16, layers=1, max_pos=1024, codebook_size=128, num_codebooks=4, hop_length=160,
        sample_rate=16000,
    )


def _llama_weights(cfg: dict[str, Any], g: torch.Generator) -> dict[str, torch.Tensor]:
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def rnd(*shape: int, std: float = 0.05) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    w = {"model.embed_tokens.weight": rnd(v, h, std=0.5), "model.norm.weight": 1.0 + rnd(h, std=0.1), "lm_head.weight": rnd(v, h, std=0.3)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({
            p + "self_attn.q_proj.weight": rnd(q, h, std=0.2),
            p + "self_attn.k_proj.weight": rnd(kv, h, std=0.2),
            p + "self_attn.v_proj.weight": rnd(kv, h),
            p + "self_attn.o_proj.weight": rnd(h, q),
            p + "mlp.gate_proj.weight": rnd(inter, h),
            p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
            p + "input_layernorm.weight": 1.0 + rnd(h, std=0.1),
            p + "post_attention_layernorm.weight": 1.0 + rnd(h, std=0.1),
        })
    return w


def _write_tokenizer(out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|bos|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|bos|>",
                "eos_token": "<|endoftext|>",
                "model_max_length": 512,
                "clean_up_tokenization_spaces": False,
            },
            f,
            indent=2,
        )


def _write_model(out: str, cfg: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    writer = ShardWriter(out, "model", None)  # one model.safetensors
    for name, tensor in weights.items():
        writer.add(name, tensor)
    writer.close()


def create_demo_models(directory: str, seed: int = DEFAULT_SEED) -> dict[str, str]:
    """Write ``thinker/``, ``talker/``, ``code2wav/`` under ``directory``.

    Written into a temporary sibling first and renamed, so an interrupted
    run never leaves a half-written model. Returns stage -> path. Raises
    ``OSError`` if ``directory`` is not writable.
    """
    directory = os.path.abspath(directory)
    with fresh_directory(directory, ".omni-demo-") as tmp:
        g = torch.Generator().manual_seed(int(seed))
        th = thinker_config()
        _write_model(os.path.join(tmp, "thinker"), th, _llama_weights(th, g))
        _write_tokenizer(os.path.join(tmp, "thinker"))

        tk = talker_config()
        w = _llama_weights(tk, g)
        h, cb = tk["hidden_size"], tk["vocab_size"]
        w["thinker_proj.weight"] = torch.randn(h, tk["thinker_hidden_size"], generator=g) * 0.1
        w["voice_embed.weight"] = torch.randn(tk["num_voices"], h, generator=g) * 0.5
        w["mtp.code0_embed.weight"] = torch.randn(cb, h, generator=g) * 0.5
        for k in range(tk["num_codebooks"] - 1):
            w[f"mtp.heads.{k}.weight"] = torch.randn(cb, h, generator=g) * 0.3
            w[f"mtp.residual_embed.{k}.weight"] = torch.randn(cb, h, generator=g) * 0.5
        _write_model(os.path.join(tmp, "talker"), tk, w)

        cw = code2wav_config()
        w = _llama_weights(cw, g)
        for k in range(cw["num_codebooks"]):
            w[f"code_embeds.{k}.weight"] = torch.randn(cw["codebook_size"], cw["hidden_size"], generator=g) * 0.5
        w["wave_head.weight"] = torch.randn(cw["hop_length"], cw["hidden_size"], generator=g) * 0.1
        _write_model(os.path.join(tmp, "code2wav"), cw, w)
        with open(os.path.join(tmp, "omni-demo.json"), "w") as f:
            json.dump({"format": FORMAT_VERSION, "seed": int(seed)}, f)
    return {s: os.path.join(directory, s) for s in ("thinker", "talker", "code2wav")}


def stock_thinker_view(thinker_dir: str, out_dir: str) -> str:
    """A copy of the thinker that stock vLLM runs as plain ``LlamaForCausalLM``.

    Same weights (symlinked safetensors) and tokenizer; only ``architectures``
    differs. Used as the stock-vLLM side of equivalence tests and benchmarks.
    """
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(thinker_dir):
        src, dst = os.path.join(thinker_dir, name), os.path.join(out_dir, name)
        if name == "config.json":
            with open(src) as f:
                cfg = json.load(f)
            cfg["architectures"] = ["LlamaForCausalLM"]
            with open(dst, "w") as f:
                json.dump(cfg, f, indent=2, sort_keys=True)
        elif not os.path.exists(dst):
            os.symlink(os.path.abspath(src), dst)
    return out_dir
