"""The demo omni models, built from vLLM's Llama layers (attention, paged KV).

- :class:`OmniDemoThinker`: text in -> text tokens; returns an
  :class:`~core.outputs.OmniOutput` whose ``multimodal_outputs["hidden"]`` is
  the per-token final hidden state ``[num_tokens, hidden]``.
- :class:`OmniDemoTalker`: prompt = ``prompt_embeds`` projected from the
  thinker's hidden states (``omni_preprocess``), plus a per-request voice
  embedding added to every row (``runtime_additional_information``); samples
  codebook-0 codec tokens; its MTP head (``talker_mtp``) predicts residual
  codebooks 1..K-1 for each sampled token.
- :class:`OmniDemoCode2Wav`: non-autoregressive: codes ``[T, K]`` -> summed
  codebook embeddings as the prompt -> one decoder layer -> ``hop_length``
  samples per frame (``omni_postprocess_request``): a mono waveform.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.model_executor.models.llama import LlamaForCausalLM

from core.kinds import AR, GENERATION
from core.outputs import OmniOutput


def _model_state_cls(kind: str) -> type:
    """vLLM's V2 runner builds this model's state from ``get_model_state_cls()``."""
    from core.model_state import model_state_cls  # lazy: V1 never imports the V2 state

    return model_state_cls(kind)


class OmniDemoThinker(LlamaForCausalLM):
    """Decoder LM whose forward also returns the per-token hidden states."""

    @staticmethod
    def get_model_state_cls() -> type:
        """The omni ``ModelState`` (AR kind) vLLM's V2 runner uses for this model."""
        return _model_state_cls(AR)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs: Any):
        hidden = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        return OmniOutput(text_hidden_states=hidden, multimodal_outputs={"hidden": hidden})


class DemoTalkerMTP(nn.Module):
    """Multi-token-prediction head: residual codebooks 1..K-1 from one hidden state.

    ``forward(hidden [n, H] float, code0 [n] int64) -> [n, K-1] int64``:
    ``x = hidden + code0_embed(code0)``; for k = 1..K-1:
    ``code_k = argmax(heads[k-1](x))`` then ``x = x + residual_embed[k-1](code_k)``.
    Greedy and shape-static, so it can be graph-captured.
    """

    def __init__(self, hidden_size: int, codebook_size: int, num_codebooks: int):
        super().__init__()
        self.code0_embed = nn.Embedding(codebook_size, hidden_size)
        self.heads = nn.ModuleList(nn.Linear(hidden_size, codebook_size, bias=False) for _ in range(num_codebooks - 1))
        self.residual_embed = nn.ModuleList(nn.Embedding(codebook_size, hidden_size) for _ in range(num_codebooks - 1))

    def forward(self, hidden: torch.Tensor, code0: torch.Tensor) -> torch.Tensor:
        x = hidden + self.code0_embed(code0)
        codes = []
        for head, emb in zip(self.heads, self.residual_embed):
            code = head(x).argmax(dim=-1)
            codes.append(code)
            x = x + emb(code)
        return torch.stack(codes, dim=-1)


def _voice_rows(inputs_embeds: torch.Tensor, voice_embed: nn.Embedding, payloads: list[dict], spans: list) -> torch.Tensor:
    """``[num_tokens, H]`` rows of each request's voice embedding over its span."""
    add = torch.zeros_like(inputs_embeds)
    for payload, (start, end) in zip(payloads, spans):
        voice = torch.tensor([int(payload.get("voice", 0))], device=inputs_embeds.device)
        add[start:end] = voice_embed(voice).to(add.dtype)
    return add


def _payload_rows(payload: dict, key: str, width: int, prompt_len: int | None, *, stage: str, layout: str,
                  row: str) -> torch.Tensor:
    """``payload[key]`` as a 2-D tensor ``[prompt_len, width]``: one row per
    placeholder prompt token. Raises ``ValueError`` saying what to pass."""
    t = payload.get(key)
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] != width:
        raise ValueError(f"{stage} request needs {key!r} {layout.format(width=width)} in its payload")
    if prompt_len is not None and t.shape[0] != prompt_len:
        raise ValueError(f"{key!r} has {t.shape[0]} {row}s but the prompt has {prompt_len} tokens; "
                         f"pass one placeholder token per {row}")
    return t


class OmniDemoTalker(LlamaForCausalLM):
    """Codec-token decoder conditioned on thinker hidden states and a voice id.

    Payload (``additional_information``): ``thinker_hidden`` float
    ``[prompt_len, thinker_hidden_size]``, ``voice`` int in ``[0, num_voices)``.
    """

    @staticmethod
    def get_model_state_cls() -> type:
        """The omni ``ModelState`` (AR kind) vLLM's V2 runner uses for this model."""
        return _model_state_cls(AR)

    accepts_omni_kwargs = True
    device_resident_payload_keys = ("prompt_embeds",)
    talker_mtp_graph_safe = True
    talker_mtp_output_key = "residual_codes"

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        cfg = self.config
        self.thinker_proj = nn.Linear(cfg.thinker_hidden_size, cfg.hidden_size, bias=False)
        self.voice_embed = nn.Embedding(cfg.num_voices, cfg.hidden_size)
        self.mtp = DemoTalkerMTP(cfg.hidden_size, cfg.vocab_size, cfg.num_codebooks)

    @classmethod
    def validate_omni_payload(cls, hf_config: Any, payload: dict, prompt_len: int | None) -> None:
        """Raise ``ValueError`` saying what to fix; called in the caller's process
        (``core.engine``) before the request reaches the engine, and again in the
        worker by ``omni_preprocess`` (``prompt_len=None``: length not checked)."""
        _payload_rows(payload, "thinker_hidden", hf_config.thinker_hidden_size, prompt_len,
                      stage="talker", layout="float [prompt_len, {width}]", row="row")
        voice = payload.get("voice", 0)
        if not isinstance(voice, int) or not 0 <= voice < hf_config.num_voices:
            raise ValueError(f"voice id {voice!r} out of range: use 0..{hf_config.num_voices - 1}")

    def omni_preprocess(self, payload: dict) -> dict:
        self.validate_omni_payload(self.config, payload, None)
        thinker_hidden = payload["thinker_hidden"]
        w = self.thinker_proj.weight
        return {"prompt_embeds": self.thinker_proj(thinker_hidden.to(device=w.device, dtype=w.dtype))}

    def talker_mtp(self, hidden: torch.Tensor, code0: torch.Tensor) -> torch.Tensor:
        return self.mtp(hidden, code0)

    def forward(
        self,
        input_ids,
        positions,
        intermediate_tensors=None,
        inputs_embeds=None,
        runtime_additional_information: list[dict] | None = None,
        request_token_spans: list | None = None,
        **kwargs: Any,
    ):
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        if runtime_additional_information:
            inputs_embeds = inputs_embeds + _voice_rows(
                inputs_embeds, self.voice_embed, runtime_additional_information, request_token_spans
            )
        return super().forward(None, positions, intermediate_tensors, inputs_embeds)


class OmniDemoCode2Wav(LlamaForCausalLM):
    """Codes ``[T, K]`` -> mono waveform ``[T * hop_length]`` in one forward.

    Payload: ``codes`` int64 ``[T, K]`` (prompt = T placeholder tokens).
    """

    @staticmethod
    def get_model_state_cls() -> type:
        """The omni ``ModelState`` (GENERATION kind) vLLM's V2 runner uses for this model."""
        return _model_state_cls(GENERATION)

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        cfg = self.config
        self.code_embeds = nn.ModuleList(nn.Embedding(cfg.codebook_size, cfg.hidden_size) for _ in range(cfg.num_codebooks))
        self.wave_head = nn.Linear(cfg.hidden_size, cfg.hop_length, bias=False)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs: Any):
        # always the embeddings path into the compiled decoder: vLLM's dummy runs pass input_ids, real steps
        # pass the prompt embeddings, and a compiled (no-guard) decoder must see one kind of input
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        return super().forward(None, positions, intermediate_tensors, inputs_embeds)

    @classmethod
    def validate_omni_payload(cls, hf_config: Any, payload: dict, prompt_len: int | None) -> None:
        """Raise ``ValueError`` saying what to fix (see the talker's)."""
        codes = _payload_rows(payload, "codes", hf_config.num_codebooks, prompt_len,
                              stage="code2wav", layout="int [T, {width}]", row="frame")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= hf_config.codebook_size):
            raise ValueError(f"codes must lie in [0, {hf_config.codebook_size})")

    def omni_preprocess(self, payload: dict) -> dict:
        self.validate_omni_payload(self.config, payload, None)
        codes = payload["codes"]
        dev = self.wave_head.weight.device
        codes = codes.to(device=dev, dtype=torch.int64)
        return {"prompt_embeds": sum(emb(codes[:, k]) for k, emb in enumerate(self.code_embeds))}

    def omni_postprocess_request(self, hidden: torch.Tensor, payload: dict) -> dict:
        return {"waveform": torch.tanh(self.wave_head(hidden)).reshape(-1).float()}
