"""The demo pipeline as a declaration: thinker -> talker (+MTP) -> code2wav over the tiny random-weight demo
models (``core.models.demo``, written by ``core.models.create``).

- thinker (AR, ``<model_dir>/thinker``): the request's text -> text and per-token hidden states, sampled at
  temperature 0.8 / top_p 0.95 with the request's seed; hands over in full (the talker's prompt embeddings need
  every hidden state);
- talker (AR, ``<model_dir>/talker``): the thinker's hidden states + a voice id -> ``2 * max_tokens`` codec
  frames ``[T, 4]`` (greedy, ``ignore_eos``; codebooks 1..3 from its MTP head), streamed;
- code2wav (generation, ``<model_dir>/code2wav``): a causal decoder, so each chunk request carries every
  frame up to the chunk's end (no left-context bound) and the chunks' samples concatenated equal one
  whole-sequence forward; chunks of ``--chunk-frames`` (16 by default), the first one too.

Every stage runs fp32 (the demo weights are fp32 and the talker's codes must equal the plain-PyTorch
reference; vLLM's ``dtype="auto"`` would run an fp32 checkpoint in bf16), up to 8 sequences at once.
:class:`SpeechRequest` and its check (:func:`check_request`) are the demo's request. Importing this module
imports neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Collection

from core.kinds import AR, GENERATION
from core.pipeline.config import (
    DEFAULT_CHUNK_FRAMES,
    ENGINE_KW,
    MAX_SEED,
    TALKER_MAX_MODEL_LEN,
    THINKER_MAX_MODEL_LEN,
    default_model_dir,
)
from core.pipeline.inputs import check_prompt_fits
from core.pipeline.spec import CHUNKED, ChunkWindow, PipelineModel, PipelineSpec, StageSpec
from omni_backends.errors import BadInputError

#: the thinker's sampling (as ``omni-backends run`` always had it); the seed is the request's
THINKER_TEMPERATURE, THINKER_TOP_P = 0.8, 0.95
#: the voice names: ``voice-0`` .. ``voice-{num_voices-1}`` = the talker's voice ids
VOICE_PREFIX = "voice-"


@dataclasses.dataclass(frozen=True)
class SpeechRequest:
    """One synthesis of the demo pipeline, checked by :func:`check_request` before any engine work.

    ``text``: the thinker prompt, non-empty, fitting ``THINKER_MAX_MODEL_LEN`` tokens with ``max_tokens``;
    ``voice``: talker voice id, ``0..num_voices-1``; ``seed``: the thinker's sampling seed, ``0..2**32-1``
    (temperature 0.8, top_p 0.95); ``max_tokens``: thinker tokens, ``1..THINKER_MAX_MODEL_LEN-1`` (the talker
    makes ``2 * max_tokens`` frames, bounded by its context); ``request_id``: ``None`` for a fresh id."""

    text: str
    voice: int = 0
    seed: int = 0
    max_tokens: int = 32
    request_id: str | None = None


def voice_names(num_voices: int) -> list[str]:
    """``["voice-0", ..., "voice-{num_voices-1}"]``: the demo talker's voices by name."""
    return [f"{VOICE_PREFIX}{i}" for i in range(num_voices)]


def check_request_id(request_id: Any, in_flight: Collection[str]) -> None:
    """``request_id`` non-empty text or ``None``, and not in ``in_flight``; :class:`BadInputError` otherwise."""
    if request_id is not None:
        if not isinstance(request_id, str) or not request_id.strip():
            raise BadInputError(f"request_id must be non-empty text or None, got {request_id!r}")
        if request_id in in_flight:
            raise BadInputError(f"request_id {request_id!r} is already in flight; use another id")


def check_request(req: SpeechRequest, *, num_voices: int, count_tokens: Callable[[str], int],
                  in_flight: Collection[str] = ()) -> None:
    """Check ``req`` without engine work: its type, ``text`` non-empty, ``voice`` in ``0..num_voices-1``,
    ``seed`` in ``0..MAX_SEED``, ``max_tokens`` in ``1..THINKER_MAX_MODEL_LEN-1`` (integers, not bools),
    ``request_id`` non-empty text or ``None`` and not in ``in_flight``, then the prompt (``count_tokens(text)``
    thinker tokens) plus ``max_tokens`` fitting the thinker's context (:func:`check_prompt_fits`). Raises
    :class:`BadInputError` (a ``ValueError``) naming the field."""
    if not isinstance(req, SpeechRequest):
        raise BadInputError(f"expected a SpeechRequest, got {type(req).__name__}")
    if not isinstance(req.text, str) or not req.text.strip():
        raise BadInputError(f"text must be non-empty text, got {req.text!r}"[:200])
    for name, lo, hi in (("voice", 0, num_voices - 1), ("seed", 0, MAX_SEED),
                         ("max_tokens", 1, THINKER_MAX_MODEL_LEN - 1)):
        value = getattr(req, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadInputError(f"{name} must be an integer, got {value!r}")
        if not lo <= value <= hi:
            raise BadInputError(f"{name} must be in {lo}..{hi}, got {value}")
    check_request_id(req.request_id, in_flight)
    check_prompt_fits(count_tokens(req.text), req.max_tokens, field="max_tokens")


def talker_frames(prompt_embeds: int, max_tokens: int) -> int:
    """Frames the talker makes for ``prompt_embeds`` thinker rows and ``max_tokens`` thinker tokens: twice
    ``max_tokens``, bounded by the talker's context, at least one."""
    return max(1, min(max_tokens * 2, TALKER_MAX_MODEL_LEN - prompt_embeds - 1))


# ------------------------------------------------------------------ reading the models
def load(cfg: Any, backend: Any, say: Callable[[str], None]) -> PipelineModel:
    """The demo models of ``cfg.model_dir`` (``None``: the cache's, created on first use) checked
    (:func:`core.pipeline.inputs.validate_models`: files, head sizes the device runs) and the thinker's
    tokenizer loaded; :class:`BadInputError` saying how to recreate them."""
    from core.pipeline.inputs import _thinker_tokenizer, validate_models

    if any("default_sampling_params" in v for v in (getattr(cfg, "stage_overrides", None) or {}).values()):
        raise BadInputError("the demo pipeline's sampling is fixed (the thinker's temperature 0.8 / top_p 0.95 with "
                            "the request's seed, a greedy talker); default_sampling_params is for a checkpoint")
    model_dir = cfg.model_dir
    if model_dir is None:
        model_dir = default_model_dir()
        if not os.path.isdir(model_dir):
            from core.models.create import create_demo_models

            say(f"creating demo models in {model_dir} (first run)")
            create_demo_models(model_dir)
    configs = validate_models(model_dir, backend)
    chunk = cfg.chunk_frames or DEFAULT_CHUNK_FRAMES
    return PipelineModel(
        model_dir=model_dir, sample_rate=int(configs["code2wav"].get("sample_rate", 16000)),
        samples_per_frame=int(configs["code2wav"].get("hop_length", 160)),
        voices=voice_names(int(configs["talker"].get("num_voices", 1))),
        window=ChunkWindow(first_chunk_frames=chunk, chunk_frames=chunk, left_context_frames=None),
        info={"configs": configs, "tokenizer": _thinker_tokenizer(model_dir)})


def check(model: PipelineModel, req: Any, in_flight: Collection[str]) -> None:
    """:func:`check_request` with the talker's voices and the thinker's tokenizer."""
    tok = model.info["tokenizer"]
    check_request(req, num_voices=len(model.voices), in_flight=in_flight,
                  count_tokens=lambda text: len(tok(text)["input_ids"]))


def request_of_run(cfg: Any) -> SpeechRequest:
    """``omni-backends run``'s request: ``--prompt``, ``--voice`` (an id), ``--seed``, ``--max-tokens``; the
    options of a checkpoint's request are refused (:class:`BadInputError` naming them)."""
    given = [f"--{n.replace('_', '-')}" for n in ("language", "instructions", "task_type", "max_new_tokens")
             if getattr(cfg, n) is not None]
    if given:
        raise BadInputError(f"the demo pipeline takes no {', '.join(given)} (a checkpoint's request options; "
                            "pass --model DIR)")
    return SpeechRequest(cfg.prompt, voice=0 if cfg.voice is None else cfg.voice, seed=cfg.seed,
                         max_tokens=cfg.max_tokens)


# ------------------------------------------------------------------ the stages
def _engine_args(stage: str, max_model_len: int) -> Callable[[PipelineModel, Any], dict[str, Any]]:
    def engine_args(model: PipelineModel, cfg: Any) -> dict[str, Any]:
        extra = {} if stage == "thinker" else {"skip_tokenizer_init": True, "enable_prefix_caching": False}
        return {"model": os.path.join(model.model_dir, stage), "max_model_len": max_model_len, **ENGINE_KW, **extra}

    return engine_args


def thinker_inputs(model: PipelineModel, req: SpeechRequest, upstream: None) -> tuple[Any, Any]:
    from vllm.sampling_params import SamplingParams

    return req.text, SamplingParams(max_tokens=req.max_tokens, temperature=THINKER_TEMPERATURE, top_p=THINKER_TOP_P,
                                    seed=req.seed)


def thinker_output(model: PipelineModel, state: Any, out: Any) -> Any:
    """The thinker's per-token hidden states, float ``[prompt + generated - 1, H]``."""
    return out.multimodal_outputs["hidden"]


def talker_inputs(model: PipelineModel, req: SpeechRequest, hidden: Any) -> tuple[Any, Any]:
    from vllm.sampling_params import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack

    frames = talker_frames(hidden.shape[0], req.max_tokens)
    # one token more than frames: a frame is a token plus its MTP residuals, made at the next decode step
    params = SamplingParams(max_tokens=frames + 1, temperature=0.0, ignore_eos=True, detokenize=False,
                            extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": hidden, "voice": req.voice})})
    return {"prompt_token_ids": [0] * hidden.shape[0]}, params


def talker_output(model: PipelineModel, state: Any, out: Any) -> Any:
    """A delta's new frames, int64 ``[k, 4]`` (the prompt rows carry -1 and are dropped)."""
    import torch

    codes = out.multimodal_outputs.get("codes.audio")
    if codes is None or not codes.numel():
        return torch.zeros((0, 0), dtype=torch.int64)
    codes = codes.to(torch.int64)
    return codes[codes[:, 0] >= 0]


def code2wav_inputs(model: PipelineModel, req: SpeechRequest, codes: Any) -> tuple[Any, Any]:
    from vllm.sampling_params import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack

    params = SamplingParams(max_tokens=1, detokenize=False, extra_args={EXTRA_ARGS_KEY: pack({"codes": codes})})
    return {"prompt_token_ids": [0] * codes.shape[0]}, params


def code2wav_output(model: PipelineModel, state: Any, out: Any) -> Any:
    """The waveform, float32 ``[frames * hop_length]``."""
    return out.multimodal_outputs["waveform"].reshape(-1)


DEMO = PipelineSpec(
    name="demo",
    stages=(
        StageSpec("thinker", AR, _engine_args("thinker", THINKER_MAX_MODEL_LEN), thinker_inputs, thinker_output),
        StageSpec("talker", AR, _engine_args("talker", TALKER_MAX_MODEL_LEN), talker_inputs, talker_output),
        StageSpec("code2wav", GENERATION, _engine_args("code2wav", TALKER_MAX_MODEL_LEN), code2wav_inputs,
                  code2wav_output, hand_over=CHUNKED),
    ),
    load=load, check=check, request_of_run=request_of_run, speech_api="openai",
    text_stage="thinker",
)
