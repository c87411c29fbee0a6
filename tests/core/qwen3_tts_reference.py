"""The plain-PyTorch reference of vLLM-Omni's Qwen3-TTS classes: what the served codes and waveforms must equal.

For a checkpoint in the released layout and a list of speech requests (:class:`core.models.qwen3_tts.TTSRequest`),
:func:`reference` returns per request the talker's codec frames ``[n, Q]`` (int64), its tokens, and code2wav's
waveform of those frames (float32, 24 kHz), computed in a fresh process (``python tests/core/qwen3_tts_reference.py
MODEL_DIR REQUESTS.json OUT.pt``) by a loop of vLLM-Omni's own, unchanged classes:

- the talker (``Qwen3TTSTalkerForConditionalGeneration``, its weights loaded by vLLM's loader on an in-process V1
  engine, which then does nothing else): per step ``preprocess`` -> the backbone forward -> ``postprocess`` ->
  ``compute_logits``, the code predictor (``talker_mtp``) before each decode forward, the per-request state merged
  from step to step as vLLM-Omni's runner does. The backbone forward is transformers' ``Qwen3Model`` over the same
  weights, recomputing the whole sequence each step (no KV cache, plain 1-D RoPE positions: the config's M-RoPE
  with the same position on every channel is that rotation). Codebook 0 is greedy (argmax) after the sampling
  constraints the request carries (``core.models.qwen3_tts.talker_inputs``): vLLM's repetition penalty over prompt
  and output tokens (transformers' ``RepetitionPenaltyLogitsProcessor``, the same rule), no stop token before
  ``min_tokens``, stop at ``stop_token_ids`` or ``max_tokens``. The code predictor samples with
  ``torch.Generator(device).manual_seed(seed)`` (``tts_local_seed``, as the core's talker MTP seeds it: one
  ``[1, steps, vocab]`` draw of Gumbel uniforms per decode step given as ``sample_uniforms``, vLLM-Omni's V2 rule)
  and the deploy's sub-talker sampling (the model's own defaults);
- code2wav (``Qwen3TTSCode2Wav``): its ``forward`` called directly on the whole utterance's codes.

The served request must therefore be greedy on codebook 0 (temperature 0) and carry a ``seed``. Device: the
``OMNI_TEST_DEVICE`` driver (default cpu), dtype float32 (the tiny checkpoint's), TF32 off
(``tests/core/precision.reference_settings``). Agreement: codes and tokens bit for bit; waveforms within
``tests/core/precision.tolerance(device, "float32", "waveform")``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mtp_noise(model: Any, gen: Any, device: Any) -> dict[str, Any]:
    """The code predictor's sampling noise for one decode step of one request: where the model takes it as an
    input (vLLM-Omni's ``mtp_sample_uniforms``), ``sample_uniforms`` ``[1, mtp_sample_steps, mtp_sample_vocab_size]``
    float32, one draw in ``(1e-20, 1 - 1e-20)`` from the request's generator (vLLM-Omni's V2 rule, the core's:
    ``core.hooks.talker_mtp``); else the generator itself (the head draws per residual step)."""
    import torch

    if not getattr(model, "mtp_sample_uniforms", False) or gen is None:
        return {"generator": gen}
    u = torch.empty(1, int(model.mtp_sample_steps), int(model.mtp_sample_vocab_size), dtype=torch.float32,
                    device=device)
    return {"sample_uniforms": u.uniform_(1e-20, 1.0 - 1e-20, generator=gen)}


def omni_engine(model_dir: str, stage: str, device: str, **kw: Any) -> Any:
    """An in-process engine of ``stage`` on ``device`` (``stage_engine_args``: the released architecture mapped
    per stage), float32, eager unless ``OMNI_TEST_GRAPHS`` says otherwise; ``kw`` overrides."""
    from core.models.qwen3_tts import deploy_defaults, read_checkpoint, stage_engine_args
    from core.stage import make_engine, prepare_device

    ckpt = read_checkpoint(model_dir)
    args = stage_engine_args(ckpt, deploy_defaults(), stage, prepare_device(device).backend, dtype="float32",
                             max_num_seqs=4, max_model_len=256 if stage == "talker" else None,
                             max_frames=kw.pop("max_frames", None))
    if os.environ.get("OMNI_TEST_GRAPHS", "eager") == "eager":
        args["enforce_eager"] = True
    args.update(kw)
    return make_engine(args.pop("model"), device=device, **args)


def runner_of(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def hf_backbone(model_dir: str) -> Any:
    """transformers' ``Qwen3Model`` with the talker backbone's weights (plain PyTorch, float32)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    with open(os.path.join(model_dir, "config.json")) as f:
        t = json.load(f)["talker_config"]
    cfg = transformers.Qwen3Config(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
        num_hidden_layers=t["num_hidden_layers"], num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t["num_key_value_heads"], head_dim=t["head_dim"], rms_norm_eps=t["rms_norm_eps"],
        max_position_embeddings=t["max_position_embeddings"], attention_bias=False, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": float(t["rope_theta"])},
    )
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3Model(cfg).eval()
    w = load_file(os.path.join(model_dir, "model.safetensors"))
    sd = {k.removeprefix("talker.model."): v for k, v in w.items() if k.startswith("talker.model.")}
    sd["embed_tokens.weight"] = sd.pop("codec_embedding.weight")
    sd.pop("text_embedding.weight")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model.float().to(torch.float32)


def reference_talker(model: Any, backbone: Any, prompt: dict, sp: Any, req_id: str, num_code_groups: int) -> dict:
    """The plain-PyTorch loop of one request (``prompt`` / ``sp`` from ``talker_inputs``) on the model's device:
    ``{"codes": int64 [n, Q] (CPU), "tokens": [...]}``. ``sp.temperature`` must be 0 (greedy codebook 0)."""
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor

    from core.hooks import MTP_SEED_KEY
    from core.payloads import EXTRA_ARGS_KEY, PayloadStore, unpack
    from tests.core.precision import reference_settings

    assert not sp.temperature, "the reference is greedy on codebook 0: send temperature 0"
    store = PayloadStore(model.gpu_resident_buffer_keys, lambda t: t)
    store.put(req_id, unpack(sp.extra_args[EXTRA_ARGS_KEY]))
    device = next(model.parameters()).device
    seed = sp.extra_args.get(MTP_SEED_KEY)
    gen = torch.Generator(device=device).manual_seed(int(seed)) if seed is not None else None
    prompt_ids = list(prompt["prompt_token_ids"])
    prompt_len, max_tokens = len(prompt_ids), int(sp.max_tokens)
    stop = set(sp.stop_token_ids or ()) if not sp.ignore_eos else set()
    penalty = RepetitionPenaltyLogitsProcessor(float(sp.repetition_penalty)) if sp.repetition_penalty != 1.0 else None
    rows, tokens, frames, computed = [], [], [], 0
    with reference_settings(device.type):
        while len(tokens) < max_tokens:
            ids = (torch.tensor(prompt_ids) if computed == 0 else torch.tensor([tokens[-1]])).to(device)
            n = int(ids.shape[0])
            info = store.put(req_id, None)
            info.update(request_id=req_id, _omni_prompt_len=prompt_len, _omni_num_computed_tokens=computed,
                        _omni_is_prefill=computed < prompt_len, _omni_max_tokens=max_tokens, _omni_seed=None)
            ids_out, emb, update = model.preprocess(input_ids=ids.clone(), input_embeds=model.embed_input_ids(ids),
                                                    **info)
            update = dict(update)
            mtp_inputs = update.pop("mtp_inputs", None)
            store.put(req_id, update)
            emb = emb.float()
            if mtp_inputs is not None and n == 1 and computed >= prompt_len:
                emb, codes = model.talker_mtp(ids_out.reshape(-1)[:1], emb, mtp_inputs[0].reshape(1, -1).float(),
                                              mtp_inputs[1].reshape(1, -1).float(), do_sample=None, temperature=None,
                                              top_k=None, top_p=None, **_mtp_noise(model, gen, device))
                emb = emb.float()
                store.put(req_id, {"codes": {"audio": codes}})
                frames.append(codes[0])
            rows.append(emb)
            x = torch.cat(rows)[None]
            h = backbone(inputs_embeds=x, position_ids=torch.arange(x.shape[1], device=device)[None]
                         ).last_hidden_state[0, -n:]
            info = store.get(req_id)
            store.put(req_id, model.postprocess(h, multimodal_outputs=None,
                                                **{k: v for k, v in info.items() if k != "hidden_states"}))
            logits = model.compute_logits(h[-1:]).float()
            if penalty is not None:
                logits = penalty(torch.tensor([prompt_ids + tokens], device=device), logits)
            if len(tokens) < int(sp.min_tokens or 0):
                for t in stop:
                    logits[..., t] = float("-inf")
            tokens.append(int(logits.argmax(-1)))
            computed += n
            if tokens[-1] in stop:
                break
    codes = torch.stack(frames).cpu().to(torch.long) if frames else torch.zeros((0, num_code_groups), dtype=torch.long)
    return {"codes": codes, "tokens": tokens}


def direct_waveforms(model: Any, frames: list) -> list:
    """Code2wav's forward called directly, one request at a time, each the whole utterance in one request, on the
    model's device (TF32 off); waveforms float32 on the CPU. Each call names its request and that it is finished
    (vLLM-Omni's ``meta``): a model that keeps per-request decoder state (``async_chunk``) decodes it as one
    first chunk and drops the state; a stateless one ignores it."""
    from tests.core.precision import reference_settings

    res = []
    device = next(model.parameters()).device
    with reference_settings(device.type):
        for i, f in enumerate(frames):
            # the class's forward: the engine's model-output adapter wraps the instance's
            out = type(model).forward(model, input_ids=f.t().reshape(-1).clone().to(device),
                                      runtime_additional_information=[
                                          {"meta": {"request_id": f"direct-{i}", "finished": True}}])
            res.append(out.multimodal_outputs["model_outputs"][0].float().cpu())
    return res


def compute(model_dir: str, requests: list, device: str, overrides: dict | None = None) -> list[dict]:
    """In this process: each request's ``{"codes", "tokens", "waveform", "prompt_len"}`` (see the module doc);
    ``overrides``: more ``SamplingParams`` fields for ``talker_inputs`` (e.g. ``ignore_eos``)."""
    from core.models.qwen3_tts import deploy_defaults, read_checkpoint, talker_inputs

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    ckpt, deploy = read_checkpoint(model_dir), deploy_defaults()
    built = [talker_inputs(ckpt, deploy, r, **{**(overrides or {}), "temperature": 0.0}) for r in requests]
    talker = omni_engine(model_dir, "talker", device)
    model = runner_of(talker).get_model()
    backbone = hf_backbone(model_dir).to(next(model.parameters()).device)
    out = []
    for i, (prompt, sp) in enumerate(built):
        r = reference_talker(model, backbone, prompt, sp, f"ref-{i}", ckpt.num_code_groups)
        r["prompt_len"] = len(prompt["prompt_token_ids"])
        out.append(r)
    frames = max((r["codes"].shape[0] for r in out), default=1)
    c2w = omni_engine(model_dir, "code2wav", device, max_frames=max(frames, 1))
    c2w_model = runner_of(c2w).get_model()
    for r, wav in zip(out, direct_waveforms(c2w_model, [r["codes"] for r in out])):
        r["waveform"] = wav
    return out


def reference(model_dir: str, requests: list, *, device: str = "cpu", out_dir: str | None = None,
              timeout: float = 900, overrides: dict | None = None, env: dict | None = None) -> list[dict]:
    """Each request's reference (``codes`` int64 ``[n, Q]``, ``tokens``, ``waveform`` float32, ``prompt_len``),
    computed in a fresh process on ``device`` (engines in-process there, so this process keeps no vLLM state).
    ``requests``: :class:`core.models.qwen3_tts.TTSRequest` with ``seed`` set; greedy codebook 0 is imposed;
    ``overrides``: JSON-able ``SamplingParams`` fields for ``talker_inputs`` (e.g. ``{"ignore_eos": True}``);
    ``env``: the process's environment (default this one's without a driver selection; tests pass
    ``tests/core/conftest.scenario_env(...)`` for the engine variant).
    Raises ``RuntimeError`` with the process's output tail when it fails."""
    import tempfile

    import torch

    tmp = out_dir or tempfile.mkdtemp(prefix="qwen3tts-ref-")
    spec, out = os.path.join(tmp, "requests.json"), os.path.join(tmp, "reference.pt")
    with open(spec, "w") as f:
        json.dump({"requests": [dataclasses.asdict(r) for r in requests], "overrides": overrides or {}}, f)
    env = dict(os.environ if env is None else env)
    env.pop("OMNI_BACKENDS_SELECTION", None)
    env.update(OMNI_TEST_DEVICE=device, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), model_dir, spec, out], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"qwen3_tts_reference.py exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return torch.load(out, weights_only=False)


def main(model_dir: str, spec: str, out: str) -> None:
    import torch

    from core.models.qwen3_tts import TTSRequest
    from tests.core.precision import set_engine_process_precision

    sys.path.insert(0, ROOT)
    set_engine_process_precision()
    with open(spec) as f:
        spec_obj = json.load(f)
    requests = [TTSRequest(**r) for r in spec_obj["requests"]]
    torch.save(compute(model_dir, requests, os.environ.get("OMNI_TEST_DEVICE", "cpu"), spec_obj["overrides"]), out)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main(*sys.argv[1:4])
