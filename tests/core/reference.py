"""Plain-PyTorch reference implementations of the demo talker and code2wav.

Independent of vLLM: transformers' ``LlamaForCausalLM`` (plain PyTorch) for
the decoder stack and torch ops for the extra heads, all fp32, greedy, on the
``device`` given (the engine's: ``tests/core/precision.py`` has the settings
the callers run it under and the tolerances). Results come back on the CPU.
"""

from __future__ import annotations

import os

import torch


def _load(stage_dir: str, device: str):
    import transformers
    from safetensors.torch import load_file

    model = transformers.LlamaForCausalLM.from_pretrained(stage_dir, torch_dtype=torch.float32).to(device)
    model.eval()
    return model, load_file(os.path.join(stage_dir, "model.safetensors"), device=str(device))


def reference_hidden(thinker_dir: str, device: str = "cpu"):
    """``f(token_ids) -> [len, H]`` float32 CPU: the thinker's last hidden states (after the final norm)."""
    model, _ = _load(thinker_dir, device)

    @torch.no_grad()
    def hidden(ids: list[int]) -> torch.Tensor:
        return model.model(torch.tensor([ids], device=device)).last_hidden_state[0].cpu()

    return hidden


class ReferenceTalker:
    def __init__(self, talker_dir: str, device: str = "cpu"):
        self.device = device
        self.model, self.w = _load(talker_dir, device)
        self.k = self.model.config.num_codebooks

    @torch.no_grad()
    def generate(self, thinker_hidden: torch.Tensor, voice: int, n_frames: int) -> torch.Tensor:
        """codes int64 ``[n_frames, K]``: codebook 0 greedy, 1..K-1 from the MTP head.

        vLLM-Omni's order: a sampled token's frame is made at the next step,
        before the forward (MTP on the previous position's hidden state); that
        step's input row is the token's embedding + voice + the residual
        codebooks' embeddings."""
        w = self.w
        voice_row = w["voice_embed.weight"][voice]
        rows = list(thinker_hidden.to(self.device).float() @ w["thinker_proj.weight"].T + voice_row)
        emb = self.model.model.embed_tokens
        codes = []
        h = self.model.model(inputs_embeds=torch.stack(rows)[None]).last_hidden_state[0, -1]
        for _ in range(n_frames):
            code0 = int(self.model.lm_head(h).argmax())
            y = h + w["mtp.code0_embed.weight"][code0]
            row, x = [code0], emb(torch.tensor(code0, device=self.device)) + voice_row
            for j in range(self.k - 1):
                c = int((y @ w[f"mtp.heads.{j}.weight"].T).argmax())
                row.append(c)
                y = y + w[f"mtp.residual_embed.{j}.weight"][c]
                x = x + w[f"mtp.residual_embed.{j}.weight"][c]
            codes.append(row)
            rows.append(x)
            h = self.model.model(inputs_embeds=torch.stack(rows)[None]).last_hidden_state[0, -1]
        return torch.tensor(codes, dtype=torch.int64)  # CPU


class ReferenceCode2Wav:
    def __init__(self, code2wav_dir: str, device: str = "cpu"):
        self.device = device
        self.model, self.w = _load(code2wav_dir, device)

    @torch.no_grad()
    def synthesize(self, codes: torch.Tensor) -> torch.Tensor:
        """waveform float32 ``[T * hop_length]`` (CPU)."""
        codes = codes.to(self.device)
        x = sum(self.w[f"code_embeds.{k}.weight"][codes[:, k]] for k in range(codes.shape[1]))
        h = self.model.model(inputs_embeds=x[None]).last_hidden_state[0]
        return torch.tanh(h @ self.w["wave_head.weight"].T).reshape(-1).cpu()
