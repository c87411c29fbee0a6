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
:class:`SpeechRequest` and its check (:func:`check_request`) are the demo's request; :func:`parse_speech` its
``POST /v1/audio/speech`` (OpenAI's fields, ``voice-N``), ``--max-tokens`` its ``run`` option. Importing this
module imports neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Collection

from core.kinds import AR, GENERATION
from core.pipeline.fields import (
    MAX_SEED,
    FieldError,
    SpeechOptions,
    check_int,
    check_request_id,
    input_text,
    int_field,
    known_fields,
    response_format,
    served_model,
    stream_fields,
    unit_speed,
)
from core.pipeline.inputs import check_prompt_fits
from core.pipeline.spec import CHUNKED, ChunkWindow, PipelineModel, PipelineSpec, RequestOption, SpeechApi, StageSpec
from omni_backends.backend import Backend
from omni_backends.errors import BadInputError

#: the stages, each a folder of the demo models
STAGES = ("thinker", "talker", "code2wav")
#: the engine settings of every stage, on every device. fp32: the demo weights are fp32 and the talker's codes must
#: equal the plain-PyTorch reference (vLLM's ``dtype="auto"`` would run an fp32 checkpoint in bf16).
ENGINE_KW: dict[str, Any] = dict(dtype="float32", max_num_seqs=8)
THINKER_MAX_MODEL_LEN = 512
TALKER_MAX_MODEL_LEN = 1024
#: talker frames per code2wav request (``--chunk-frames``): audio streams out every this many frames
DEFAULT_CHUNK_FRAMES = 16
#: thinker tokens when the request names none
DEFAULT_MAX_TOKENS = 32
#: the thinker's sampling (as ``omni-backends run`` always had it); the seed is the request's
THINKER_TEMPERATURE, THINKER_TOP_P = 0.8, 0.95
#: the voice names: ``voice-0`` .. ``voice-{num_voices-1}`` = the talker's voice ids
VOICE_PREFIX = "voice-"


def default_model_dir() -> str:
    """``$OMNI_BACKENDS_CACHE`` or ``~/.cache/omni-backends``, then ``demo-v<format>``."""
    from core.models.create import FORMAT_VERSION

    root = os.environ.get("OMNI_BACKENDS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "omni-backends"
    )
    return os.path.join(root, f"demo-v{FORMAT_VERSION}")


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
    max_tokens: int = DEFAULT_MAX_TOKENS
    request_id: str | None = None


def voice_names(num_voices: int) -> list[str]:
    """``["voice-0", ..., "voice-{num_voices-1}"]``: the demo talker's voices by name."""
    return [f"{VOICE_PREFIX}{i}" for i in range(num_voices)]


def check_request(req: SpeechRequest, *, num_voices: int, count_tokens: Callable[[str], int],
                  in_flight: Collection[str] = ()) -> None:
    """Check ``req`` without engine work: its type, ``text`` non-empty, ``voice`` in ``0..num_voices-1``,
    ``seed`` in ``0..MAX_SEED``, ``max_tokens`` in ``1..THINKER_MAX_MODEL_LEN-1`` (integers, not bools),
    ``request_id`` non-empty text or ``None`` and not in ``in_flight``, then the prompt (``count_tokens(text)``
    thinker tokens) plus ``max_tokens`` fitting the thinker's context (:func:`check_prompt_fits`). Raises
    :class:`~core.pipeline.fields.FieldError` (a ``BadInputError``) whose ``param`` names the speech request's
    field (``input`` for the text)."""
    if not isinstance(req, SpeechRequest):
        raise BadInputError(f"expected a SpeechRequest, got {type(req).__name__}")
    if not isinstance(req.text, str) or not req.text.strip():
        raise FieldError(f"text must be non-empty text, got {req.text!r}"[:200], "input")
    for name, lo, hi in (("voice", 0, num_voices - 1), ("seed", 0, MAX_SEED),
                         ("max_tokens", 1, THINKER_MAX_MODEL_LEN - 1)):
        value = getattr(req, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise FieldError(f"{name} must be an integer, got {value!r}", name)
        if not lo <= value <= hi:
            raise FieldError(f"{name} must be in {lo}..{hi}, got {value}", name)
    check_request_id(req.request_id, in_flight)
    try:
        check_prompt_fits(count_tokens(req.text), req.max_tokens, THINKER_MAX_MODEL_LEN, field="max_tokens")
    except BadInputError as exc:  # the prompt's length: the request's text
        raise FieldError(str(exc), "input") from None


def talker_frame_budget(prompt_embeds: int, max_tokens: int) -> int:
    """Frames the talker makes for ``prompt_embeds`` thinker rows and ``max_tokens`` thinker tokens: twice
    ``max_tokens``, bounded by the talker's context, at least one."""
    return max(1, min(max_tokens * 2, TALKER_MAX_MODEL_LEN - prompt_embeds - 1))


# ------------------------------------------------------------------ the speech request (OpenAI's)
#: every field the demo's speech endpoint reads; any other is refused (naming these)
FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed", "stream", "stream_format",
          "seed", "max_tokens")


def _voice(value: Any, names: list[str]) -> int:
    if isinstance(value, dict) and set(value) == {"id"}:  # OpenAI's custom-voice form {"id": ...}
        value = value["id"]
    if not isinstance(value, str) or value not in names:
        raise FieldError(f"unknown voice {value!r}; this model's voices are {', '.join(names)} "
                         f"(GET /v1/audio/voices)", "voice")
    return names.index(value)


def parse_speech(body: Any, *, model_name: str, model: PipelineModel, request_id: str) -> SpeechOptions:
    """Check an OpenAI speech request body (the decoded JSON) field by field into a :class:`SpeechRequest`
    named ``request_id``; no engine work.

    ``model`` must be ``model_name`` (:class:`~core.pipeline.fields.UnknownModelError` otherwise); ``input``
    non-empty text of at most ``MAX_INPUT_CHARS`` characters; ``voice`` one of the model's voices (``voice-N``, or
    ``{"id": name}``); ``response_format`` wav | pcm (default ``wav``, ``pcm`` when streamed); ``speed`` absent or
    1.0; ``instructions`` absent or empty; ``stream`` a boolean; ``stream_format`` audio | sse (``sse`` streams
    even without ``stream``); ``seed`` 0..2**32-1 (default 0); ``max_tokens`` 1..THINKER_MAX_MODEL_LEN-1 (default
    32). Raises :class:`~core.pipeline.fields.FieldError` naming the field and what to send instead."""
    known_fields(body, FIELDS, "'model', 'input' and 'voice'")
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise FieldError(f"'model' is required: {model_name!r} (GET /v1/models)", "model")
    served_model(name, model_name)
    text = input_text(body)
    if "voice" not in body:
        raise FieldError(f"'voice' is required: one of {', '.join(model.voices)}", "voice")
    voice = _voice(body["voice"], list(model.voices))
    if body.get("instructions") not in (None, ""):
        raise FieldError("'instructions' are not supported by this model; leave them out", "instructions")
    unit_speed(body)
    stream, stream_format = stream_fields(body)
    stream = stream or stream_format == "sse"
    fmt = body.get("response_format")
    if fmt is not None:
        response_format(fmt)
    if stream and fmt == "wav":
        raise FieldError("a streamed response carries raw 16-bit PCM; send response_format 'pcm', or "
                         "stream false for a complete WAV", "response_format")
    req = SpeechRequest(text=text, voice=voice, seed=int_field(body, "seed", 0, 0, MAX_SEED),
                        max_tokens=int_field(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, THINKER_MAX_MODEL_LEN - 1),
                        request_id=request_id)
    return SpeechOptions(request=req, response_format=fmt or ("pcm" if stream else "wav"), stream=stream,
                         stream_format=(stream_format or "audio") if stream else None)


# ------------------------------------------------------------------ the run options
def _check_max_tokens(value: Any) -> None:
    check_int(value, "max_tokens", "--max-tokens", 1, THINKER_MAX_MODEL_LEN - 1)


MAX_TOKENS = RequestOption("max_tokens", type=int, check=_check_max_tokens, default=DEFAULT_MAX_TOKENS,
                           instead="--max-new-tokens",
                           help=f"the demo: thinker tokens to generate, 1..{THINKER_MAX_MODEL_LEN - 1} (default: "
                                f"{DEFAULT_MAX_TOKENS})")


# ------------------------------------------------------------------ reading the models
def load(cfg: Any, backend: Backend, say: Callable[[str], None]) -> PipelineModel:
    """The demo models of ``cfg.model_dir`` (``None``: the cache's, created on first use) checked
    (:func:`core.pipeline.inputs.validate_models`: files, head sizes the device runs) and the thinker's
    tokenizer loaded; :class:`BadInputError` saying how to recreate them."""
    from core.pipeline.inputs import thinker_tokenizer, validate_models

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
    configs = validate_models(model_dir, backend, STAGES)
    chunk = cfg.chunk_frames or DEFAULT_CHUNK_FRAMES
    return PipelineModel(
        model_dir=model_dir, sample_rate=int(configs["code2wav"].get("sample_rate", 16000)),
        samples_per_frame=int(configs["code2wav"].get("hop_length", 160)),
        voices=voice_names(int(configs["talker"].get("num_voices", 1))),
        window=ChunkWindow(first_chunk_frames=chunk, chunk_frames=chunk, left_context_frames=None),
        info={"configs": configs, "tokenizer": thinker_tokenizer(model_dir)})


def check(model: PipelineModel, req: Any, in_flight: Collection[str]) -> None:
    """:func:`check_request` with the talker's voices and the thinker's tokenizer."""
    tok = model.info["tokenizer"]
    check_request(req, num_voices=len(model.voices), in_flight=in_flight,
                  count_tokens=lambda text: len(tok(text)["input_ids"]))


def request_of_run(cfg: Any) -> SpeechRequest:
    """``omni-backends run``'s request: ``--prompt``, ``--voice`` (an id, default 0), ``--seed``, ``--max-tokens``
    (``cfg.options``); another pipeline's options and a speaker name as ``--voice`` are refused
    (:class:`BadInputError` naming them)."""
    given = [f"--{n.replace('_', '-')}" for n, v in cfg.options.items() if v is not None and n != MAX_TOKENS.name]
    if given:
        raise BadInputError(f"the demo pipeline takes no {', '.join(given)} (a checkpoint's request options; "
                            "pass --model DIR)")
    voice = 0 if cfg.voice is None else cfg.voice
    if isinstance(voice, str):
        try:
            voice = int(voice)
        except ValueError:
            raise BadInputError(f"--voice {voice!r}: a speaker name needs --model DIR (a checkpoint's speakers); "
                                "the demo's voices are numbers, 0..num_voices-1") from None
        check_int(voice, "voice", "--voice", 0)
    return SpeechRequest(cfg.prompt, voice=voice, seed=cfg.seed, max_tokens=MAX_TOKENS.value(cfg.options))


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

    frames = talker_frame_budget(hidden.shape[0], req.max_tokens)
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
    load=load, check=check, request_of_run=request_of_run, speech=SpeechApi(parse=parse_speech),
    options=(MAX_TOKENS,), text_stage="thinker", served_name="omni-demo",
)
