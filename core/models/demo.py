"""The demo omni models, built from vLLM's Llama layers (attention, paged KV),
written against vLLM-Omni's model contract (``core.hooks.contract``), the one
the core speaks.

- :class:`OmniDemoThinker`: text in -> text tokens; returns an
  :class:`~core.outputs.OmniOutput` whose ``multimodal_outputs["hidden"]`` is
  the per-token final hidden state ``[num_tokens, hidden]``.
- :class:`OmniDemoTalker`: ``preprocess`` every step: prompt rows are the
  thinker's hidden states projected (state ``thinker_hidden``), every row gets
  the request's voice embedding (state ``voice``); samples codebook-0 codec
  tokens; its MTP head (``talker_mtp``, vLLM-Omni's form: before the forward,
  on decode rows) predicts codebooks 1..K-1 of the previous token from the
  talker's last hidden state (``postprocess`` keeps it in ``hidden_states.last``)
  and returns the frame ``codes.audio`` ``[1, K]``.
- :class:`OmniDemoCode2Wav`: non-autoregressive: codes ``[T, K]`` (state
  ``codes``) -> summed codebook embeddings on the prompt rows (``preprocess``)
  -> one decoder layer -> ``hop_length`` samples per frame: multimodal output
  ``waveform`` ``[T, hop_length]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.model_executor.models.llama import LlamaForCausalLM

from core.outputs import OmniOutput


class OmniDemoThinker(LlamaForCausalLM):
    """Decoder LM whose forward also returns the per-token hidden states."""

    have_multimodal_outputs = True

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        # only what it reads (as LlamaForCausalLM.forward): the omni hooks then build none of vLLM-Omni's
        # per-request kwargs for it (core.hooks.contract: ModelContract.forward_params)
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


def _prompt_rows(info: dict, n: int) -> tuple[int, int]:
    """(offset into the prompt, prompt rows among this step's ``n`` rows) of a request."""
    offset = int(info.get("_omni_num_computed_tokens", 0))
    return offset, max(0, min(n, int(info.get("_omni_prompt_len", 0)) - offset))


class OmniDemoTalker(LlamaForCausalLM):
    """Codec-token decoder conditioned on thinker hidden states and a voice id.

    Request state (``additional_information``): ``thinker_hidden`` float
    ``[prompt_len, thinker_hidden_size]``, ``voice`` int in ``[0, num_voices)``.
    Multimodal output ``codes.audio`` ``[num_tokens, K]``: a decode row's frame
    (the previous token + its MTP residuals), ``-1`` on prompt rows.
    """

    have_multimodal_outputs = True
    has_preprocess = True
    has_postprocess = True
    gpu_resident_buffer_keys = {("hidden_states", "last"), ("codes", "audio")}
    talker_mtp_graph_safe = True
    talker_mtp_output_key = ("codes", "audio")

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        cfg = self.config
        self.thinker_proj = nn.Linear(cfg.thinker_hidden_size, cfg.hidden_size, bias=False)
        self.voice_embed = nn.Embedding(cfg.num_voices, cfg.hidden_size)
        self.mtp = DemoTalkerMTP(cfg.hidden_size, cfg.vocab_size, cfg.num_codebooks)
        self.mtp_hidden_size = int(cfg.hidden_size)

    @classmethod
    def validate_omni_payload(cls, hf_config: Any, payload: dict, prompt_len: int | None) -> None:
        """Raise ``ValueError`` saying what to fix; called in the caller's process
        (``core.engine``) before the request reaches the engine, and again in the
        worker by ``preprocess`` (``prompt_len=None``: length not checked)."""
        _payload_rows(payload, "thinker_hidden", hf_config.thinker_hidden_size, prompt_len,
                      stage="talker", layout="float [prompt_len, {width}]", row="row")
        voice = payload.get("voice", 0)
        if not isinstance(voice, int) or not 0 <= voice < hf_config.num_voices:
            raise ValueError(f"voice id {voice!r} out of range: use 0..{hf_config.num_voices - 1}")

    def preprocess(self, input_ids: torch.Tensor, input_embeds: torch.Tensor | None, **info: Any):
        """vLLM-Omni's per-step ``preprocess``: this request's rows ``[n, H]``
        (projected thinker hidden states on prompt rows, token embeddings after)
        plus its voice embedding; a decode row hands ``mtp_inputs`` to the MTP."""
        self.validate_omni_payload(self.config, info, None)
        n = int(input_ids.shape[0])
        w = self.thinker_proj.weight
        embeds = self.embed_input_ids(input_ids).to(w.dtype)
        offset, k = _prompt_rows(info, n)
        if k:
            th = info["thinker_hidden"][offset : offset + k].to(device=w.device, dtype=w.dtype)
            embeds = torch.cat([self.thinker_proj(th), embeds[k:]])
        voice = torch.tensor([int(info.get("voice", 0))], device=w.device)
        embeds = embeds + self.voice_embed(voice)
        update: dict[str, Any] = {}
        if n == 1 and not info.get("_omni_is_prefill", k > 0):
            last = (info.get("hidden_states") or {}).get("last")
            if last is None:
                last = torch.zeros(1, self.config.hidden_size, device=w.device, dtype=w.dtype)
            update["mtp_inputs"] = (last.reshape(1, -1), torch.zeros_like(embeds))
        else:
            update["codes"] = {"audio": torch.full((n, self.config.num_codebooks), -1, dtype=torch.int64,
                                                   device=w.device)}
        return input_ids, embeds, update

    def postprocess(self, hidden_states: torch.Tensor, multimodal_outputs: Any = None, **info: Any) -> dict:
        """Keep the request's last hidden state for its next decode step's MTP."""
        if hidden_states.numel() == 0:
            return {}
        return {"hidden_states": {"last": hidden_states[-1:].detach()}}

    def talker_mtp(self, input_ids: torch.Tensor, input_embeds: torch.Tensor, last_talker_hidden: torch.Tensor,
                   text_step: torch.Tensor, **sampling: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM-Omni's MTP form: ``(embeds [n, H], codes [n, K])``; ``codes[:, 0]``
        is the input token (codebook 0), the rest from :class:`DemoTalkerMTP`
        (greedy); ``embeds`` add the residual codebooks' embeddings."""
        code0 = input_ids.reshape(-1).to(torch.int64)
        residual = self.mtp(last_talker_hidden.to(input_embeds.dtype), code0)
        embeds = input_embeds + text_step
        for k, emb in enumerate(self.mtp.residual_embed):
            embeds = embeds + emb(residual[:, k])
        return embeds, torch.cat([code0[:, None], residual], dim=1)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                model_intermediate_buffer: list[dict] | None = None, request_token_spans: list | None = None,
                **kwargs: Any):
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        hidden = super().forward(None, positions, intermediate_tensors, inputs_embeds)
        if not model_intermediate_buffer:  # dummy / profile runs
            return hidden
        none = torch.full((1, self.config.num_codebooks), -1, dtype=torch.int64, device=hidden.device)
        codes = torch.cat([  # a request without state (vLLM's own warm-up request) gets -1 rows
            (info.get("codes") or {}).get("audio", none.expand(e - s, -1))
            for info, (s, e) in zip(model_intermediate_buffer, request_token_spans)])
        return OmniOutput(text_hidden_states=hidden, multimodal_outputs={"codes": {"audio": codes}})


class OmniDemoCode2Wav(LlamaForCausalLM):
    """Codes ``[T, K]`` -> mono waveform ``[T, hop_length]`` in one forward.

    Request state: ``codes`` int64 ``[T, K]`` (prompt = T placeholder tokens).
    """

    have_multimodal_outputs = True
    has_preprocess = True

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        cfg = self.config
        self.code_embeds = nn.ModuleList(nn.Embedding(cfg.codebook_size, cfg.hidden_size) for _ in range(cfg.num_codebooks))
        self.wave_head = nn.Linear(cfg.hidden_size, cfg.hop_length, bias=False)

    @classmethod
    def validate_omni_payload(cls, hf_config: Any, payload: dict, prompt_len: int | None) -> None:
        """Raise ``ValueError`` saying what to fix (see the talker's)."""
        codes = _payload_rows(payload, "codes", hf_config.num_codebooks, prompt_len,
                              stage="code2wav", layout="int [T, {width}]", row="frame")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= hf_config.codebook_size):
            raise ValueError(f"codes must lie in [0, {hf_config.codebook_size})")

    def preprocess(self, input_ids: torch.Tensor, input_embeds: torch.Tensor | None, **info: Any):
        """Prompt rows: the summed codebook embeddings of this request's frames."""
        self.validate_omni_payload(self.config, info, None)
        n = int(input_ids.shape[0])
        dev = self.wave_head.weight.device
        offset, k = _prompt_rows(info, n)
        embeds = self.embed_input_ids(input_ids)
        if k:
            codes = info["codes"][offset : offset + k].to(device=dev, dtype=torch.int64)
            embeds = torch.cat([sum(emb(codes[:, j]) for j, emb in enumerate(self.code_embeds)), embeds[k:]])
        return input_ids, embeds, {}

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs: Any):
        # always the embeddings path into the compiled decoder: vLLM's dummy runs pass input_ids, real steps
        # pass the prompt embeddings, and a compiled (no-guard) decoder must see one kind of input
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        hidden = super().forward(None, positions, intermediate_tensors, inputs_embeds)
        if not kwargs.get("model_intermediate_buffer"):  # dummy / profile runs
            return hidden
        wave = torch.tanh(self.wave_head(hidden)).float()
        return OmniOutput(text_hidden_states=hidden, multimodal_outputs={"waveform": wave})
