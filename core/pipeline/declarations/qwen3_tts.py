"""Qwen3-TTS as a declaration: talker -> code2wav over a checkpoint in the released layout, vLLM-Omni 0.30's
stage topology (its ``model_executor/models/qwen3_tts/pipeline.py``) and deploy defaults
(``deploy/qwen3_tts.yaml``, read from the installed wheel by :func:`core.models.qwen3_tts.deploy_defaults`).

- talker (AR, vLLM-Omni's ``Qwen3TTSTalkerForConditionalGeneration``, its code predictor as the talker MTP): the
  request (:class:`core.models.qwen3_tts.TTSRequest`, built into the talker's prompt and ``SamplingParams`` by
  :func:`core.models.qwen3_tts.talker_inputs` through vLLM-Omni's own functions) -> codec frames ``[T, Q]``,
  streamed;
- code2wav (generation, vLLM-Omni's ``Qwen3TTSCode2Wav``): fed the talker's frames in chunks as vLLM-Omni's
  ``async_chunk`` connector feeds them: the first chunk after ``initial_codec_chunk_frames`` (1), then every
  ``codec_chunk_frames`` (25; ``--chunk-frames`` overrides), each only its new frames: the model keeps the
  utterance's decoder state across its chunk requests (the deploy's ``async_chunk``; the graph names the
  utterance in each chunk's payload and releases the state when it ends). Without ``async_chunk`` each chunk
  would carry up to ``codec_left_context_frames`` (72, the decoder's attention window) earlier frames whose
  samples are dropped. 24 kHz.

A frame is a talker row past the prompt that the model marks valid (``meta.codec_frame_valid``, the flag
vLLM-Omni's async-chunk producer ``talker2code2wav_async_chunk`` reads; a row the model emits for an invalid
token, e.g. the codec EOS, is no frame). The checkpoint is read and checked by
:func:`core.models.qwen3_tts.read_checkpoint` before any engine starts. Its speech request is vLLM-Omni's
(:func:`parse_tts_speech`: ``OpenAICreateSpeechRequest``'s fields, ``speech.audio.*`` SSE events), its ``run``
options ``--language``, ``--instructions``, ``--task-type``, ``--max-new-tokens``. Importing this module imports
neither vLLM nor torch.
"""

from __future__ import annotations

from typing import Any, Callable, Collection

from core.kinds import AR, GENERATION
from core.pipeline.fields import (
    RESPONSE_FORMATS,
    FieldError,
    SpeechOptions,
    check_int,
    input_text,
    known_fields,
    optional_field,
    response_format,
    served_model,
    stream_fields,
    unit_speed,
)
from core.pipeline.spec import CHUNKED, ChunkWindow, PipelineModel, PipelineSpec, RequestOption, SpeechApi, StageSpec
from omni_backends.backend import Backend
from omni_backends.errors import BadInputError

#: the per-row validity flag of the talker's multimodal output (vLLM-Omni's ``meta.codec_frame_valid``)
FRAME_VALID_KEY = "meta.codec_frame_valid"


def _tts() -> Any:
    import core.models.qwen3_tts as tts

    return tts


def load(cfg: Any, backend: Backend, say: Callable[[str], None]) -> PipelineModel:
    """The checkpoint ``cfg.model`` read and checked (:func:`core.models.qwen3_tts.read_checkpoint`: every file of
    the release, what the core can run of its config) and vLLM-Omni's deploy defaults; the chunk window is the
    deploy's (``cfg.chunk_frames`` overrides its chunk size). :class:`BadInputError` naming the file or value."""
    tts = _tts()
    overrides = getattr(cfg, "stage_overrides", None) or {}
    if "default_sampling_params" in overrides.get("code2wav", {}):
        raise BadInputError("--stage-overrides: code2wav runs one forward per chunk; only the talker (stage 0) takes "
                            "default_sampling_params")
    ckpt = tts.read_checkpoint(cfg.model)
    deploy = tts.deploy_defaults()
    chunk = cfg.chunk_frames or int(deploy.chunk_frames)
    # async_chunk (the deploy's): code2wav keeps each utterance's decoder state, so a chunk carries no left context
    window = ChunkWindow(first_chunk_frames=min(int(deploy.initial_chunk_frames), chunk), chunk_frames=chunk,
                         left_context_frames=0 if deploy.async_chunk else int(deploy.left_context_frames))
    return PipelineModel(model_dir=ckpt.path, sample_rate=int(ckpt.sample_rate),
                         samples_per_frame=int(ckpt.samples_per_frame), voices=list(ckpt.speakers), window=window,
                         info={"checkpoint": ckpt, "deploy": deploy, "talker_sampling":
                               dict(overrides.get("talker", {}).get("default_sampling_params") or {})},
                         audio_request_state=bool(deploy.async_chunk))


def check(model: PipelineModel, req: Any, in_flight: Collection[str]) -> None:
    """:func:`core.models.qwen3_tts.check_tts_request` against the checkpoint (its error's ``param`` names the
    request field: unknown speaker -> the checkpoint's speakers, a task type it does not serve, empty input,
    Base where its encoders cannot run)."""
    tts = _tts()
    if not isinstance(req, tts.TTSRequest):
        raise BadInputError(f"expected a Qwen3-TTS TTSRequest, got {type(req).__name__}")
    deploy = model.info["deploy"]
    tts.check_tts_request(model.info["checkpoint"], req, max_instructions_length=deploy.max_instructions_length)


# ------------------------------------------------------------------ the speech request (vLLM-Omni's)
#: every field the Qwen3-TTS speech endpoint reads (vLLM-Omni 0.30's ``OpenAICreateSpeechRequest`` names; ``speaker``
#: is its alias of ``voice``); any other is refused (naming these)
TTS_FIELDS = ("model", "input", "voice", "speaker", "instructions", "language", "task_type", "response_format",
              "speed", "sample_rate", "stream", "stream_format", "seed", "max_new_tokens", "ref_audio", "ref_text",
              "x_vector_only_mode", "non_streaming_mode")
#: vLLM-Omni's ``task_type`` values
TTS_TASK_TYPES = ("CustomVoice", "VoiceDesign", "Base")
#: response formats vLLM-Omni offers that this server does not encode (a 400 saying so)
UNSUPPORTED_FORMATS = ("flac", "mp3", "opus")


def parse_tts_speech(body: Any, *, model_name: str, model: PipelineModel, request_id: str | None = None
                     ) -> SpeechOptions:
    """Check a vLLM-Omni Qwen3-TTS speech request body (the decoded JSON) field by field into a
    :class:`~core.models.qwen3_tts.TTSRequest` (checked against the checkpoint by :func:`check`); no engine work.

    As vLLM-Omni 0.30's ``OpenAICreateSpeechRequest`` reads it: ``model`` optional, else the served name
    (:class:`~core.pipeline.fields.UnknownModelError` otherwise); ``input`` non-empty text (at most
    ``MAX_INPUT_CHARS`` characters); ``voice`` (alias ``speaker``, or ``{"id": name}``), ``instructions``,
    ``language`` text; ``task_type`` one of :data:`TTS_TASK_TYPES` (whether the checkpoint serves it is
    :func:`check`'s); ``response_format`` wav | pcm (flac / mp3 / opus: refused, saying this server encodes wav and
    pcm); ``speed`` 1.0; ``sample_rate`` absent or the model's (no resampling); ``stream`` a boolean and
    ``stream_format`` audio | sse, with vLLM-Omni's meaning: ``audio`` streams raw bytes (a WAV with a header of
    placeholder sizes first), ``sse`` or ``stream: true`` alone streams ``speech.audio.*`` events; ``seed``,
    ``max_new_tokens`` integers; ``ref_audio`` text or list of text, ``ref_text`` text, ``x_vector_only_mode`` and
    ``non_streaming_mode`` booleans (Base voice cloning). Fields this endpoint does not read are refused naming
    them (vLLM-Omni drops them silently). Raises :class:`~core.pipeline.fields.FieldError` naming the field.
    ``request_id``: unused (the graph names the request)."""
    known_fields(body, TTS_FIELDS, "'input' and 'voice'")
    if body.get("model") is not None:
        served_model(body["model"], model_name)
    text = input_text(body)
    voices = [v["id"] if isinstance(v, dict) and set(v) == {"id"} else v
              for v in (body.get("voice"), body.get("speaker")) if v is not None]
    for v in voices:
        if not isinstance(v, str) or not v:
            raise FieldError(f"'voice' must be a speaker name (or {{\"id\": name}}), got {v!r}", "voice")
    if len(set(voices)) > 1:
        raise FieldError(f"'voice' and 'speaker' name different speakers ({voices[0]!r}, {voices[1]!r}); send one",
                         "voice")
    fields = {name: optional_field(body, name, (str,), "text") for name in ("instructions", "language", "ref_text")}
    task_type = body.get("task_type")
    if task_type is not None and task_type not in TTS_TASK_TYPES:
        raise FieldError(f"'task_type' must be one of {', '.join(TTS_TASK_TYPES)}, got {task_type!r}", "task_type")
    fmt = body.get("response_format", "wav")
    if fmt in UNSUPPORTED_FORMATS:
        raise FieldError(f"response_format {fmt!r} is not encoded by this server; use one of "
                         f"{', '.join(RESPONSE_FORMATS)}", "response_format")
    response_format(fmt)
    unit_speed(body)
    rate, sample_rate = body.get("sample_rate"), int(model.sample_rate)
    if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool) or rate != sample_rate):
        raise FieldError(f"'sample_rate' must be {sample_rate} (the model's; this server does not resample), "
                         f"got {rate!r}", "sample_rate")
    stream, stream_format = stream_fields(body)
    mode = "audio" if stream_format == "audio" else "sse" if (stream or stream_format == "sse") else None
    ref_audio = body.get("ref_audio")
    if ref_audio is not None and not (isinstance(ref_audio, str) or (
            isinstance(ref_audio, list) and ref_audio and all(isinstance(x, str) for x in ref_audio))):
        raise FieldError("'ref_audio' must be text (a URL, base64 or file URI) or a list of them", "ref_audio")
    ints = {name: optional_field(body, name, (int,), "an integer") for name in ("seed", "max_new_tokens")}
    flags = {name: optional_field(body, name, (bool,), "true or false") for name in ("x_vector_only_mode",
                                                                                     "non_streaming_mode")}
    request = _tts().TTSRequest(text=text, task_type=task_type, speaker=voices[0] if voices else None,
                                language=fields["language"], instructions=fields["instructions"], seed=ints["seed"],
                                max_new_tokens=ints["max_new_tokens"], ref_audio=ref_audio,
                                ref_text=fields["ref_text"], x_vector_only_mode=flags["x_vector_only_mode"],
                                non_streaming_mode=flags["non_streaming_mode"])
    return SpeechOptions(request=request, response_format=fmt, stream=mode is not None, stream_format=mode)


# ------------------------------------------------------------------ the run options
def _text(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not isinstance(value, str):
            raise BadInputError(f"{name} (--{name.replace('_', '-')}) must be text, got {value!r}")

    return check


def _check_max_new_tokens(value: Any) -> None:
    check_int(value, "max_new_tokens", "--max-new-tokens", 1)


OPTIONS = (
    RequestOption("language", check=_text("language"),
                  help="with --model: the language (vLLM-Omni's 'language'; default Auto)"),
    RequestOption("instructions", check=_text("instructions"),
                  help="with --model: how to speak (vLLM-Omni's 'instructions')"),
    RequestOption("task_type", check=_text("task_type"), metavar="TYPE",
                  help="with --model: CustomVoice / VoiceDesign / Base (default: the checkpoint's tts_model_type)"),
    RequestOption("max_new_tokens", type=int, check=_check_max_new_tokens, instead="--max-tokens", metavar="N",
                  help="with --model: the most codec frames to make (default: the deploy config's)"),
)


def request_of_run(cfg: Any) -> Any:
    """``omni-backends run --model``'s request: the fields a speech request carries (``--prompt`` is ``input``,
    ``--voice`` the speaker, ``--language``, ``--instructions``, ``--task-type``, ``--seed``,
    ``--max-new-tokens``), the same :class:`~core.models.qwen3_tts.TTSRequest` the server builds; another
    pipeline's option is refused (:class:`BadInputError` naming it)."""
    mine = {o.name: o for o in OPTIONS}
    other = [n for n, v in cfg.options.items() if v is not None and n not in mine]
    if other:
        raise BadInputError(f"the qwen3_tts pipeline takes no {', '.join('--' + n.replace('_', '-') for n in other)}")
    values = {name: o.value(cfg.options) for name, o in mine.items()}
    return _tts().TTSRequest(text=cfg.prompt, speaker=None if cfg.voice is None else str(cfg.voice), seed=cfg.seed,
                             **values)


def _engine_args(stage: str) -> Callable[[PipelineModel, Any], dict[str, Any]]:
    def engine_args(model: PipelineModel, cfg: Any) -> dict[str, Any]:
        """:func:`core.models.qwen3_tts.stage_engine_args` (the deploy's engine arguments, the architecture per
        stage, the checkpoint's dtype); code2wav sized for the widest chunk with its left context, its model
        given the deploy's connector config with this chunk window."""
        w = model.window
        kw = _tts().stage_engine_args(model.info["checkpoint"], model.info["deploy"], stage, seed=cfg.seed,
                                      max_frames=w.left_context_frames + max(w.chunk_frames, w.first_chunk_frames)
                                      if stage == "code2wav" else None, window=w if stage == "code2wav" else None)
        kw.pop("kind", None)  # the declaration's StageSpec.kind says it
        return kw

    return engine_args


def talker_inputs(model: PipelineModel, req: Any, upstream: None) -> tuple[Any, Any]:
    """:func:`core.models.qwen3_tts.talker_inputs` (vLLM-Omni's request building, the deploy's sampling), with
    the talker's ``default_sampling_params`` of ``--stage-overrides`` over the deploy's."""
    return _tts().talker_inputs(model.info["checkpoint"], model.info["deploy"], req, **model.info["talker_sampling"])


def talker_output(model: PipelineModel, state: Any, out: Any) -> Any:
    """A ``DELTA`` output's new frames, int64 ``[k, Q]``: its rows past the prompt that the model marks valid.
    ``state`` counts the rows seen so far (``rows``) and keeps the prompt's length (``prompt``)."""
    import torch

    mm = getattr(out, "multimodal_outputs", None) or {}
    rows = mm.get("codes.audio")
    if getattr(state, "prompt", None) is None and out.prompt_token_ids is not None:
        state.prompt = len(out.prompt_token_ids)
    seen = getattr(state, "rows", 0)
    if rows is None or rows.numel() == 0:
        return torch.zeros((0, 0), dtype=torch.int64)
    rows = rows.reshape(rows.shape[0], -1)
    state.rows = seen + int(rows.shape[0])
    skip = max(0, (state.prompt or 0) - seen)
    keep = rows[skip:].to(torch.int64)
    valid = mm.get(FRAME_VALID_KEY)
    if valid is not None and valid.numel() == rows.shape[0]:
        keep = keep[valid.reshape(-1)[skip:].to(torch.bool).cpu()]
    return keep.cpu()


def code2wav_inputs(model: PipelineModel, req: Any, codes: Any) -> tuple[Any, Any]:
    return _tts().code2wav_inputs(codes)


def code2wav_output(model: PipelineModel, state: Any, out: Any) -> Any:
    """The chunk's waveform (its left context included; the graph keeps the chunk's own frames' samples)."""
    return _tts().code2wav_waveform(out)


QWEN3_TTS = PipelineSpec(
    name="qwen3_tts",
    stages=(
        StageSpec("talker", AR, _engine_args("talker"), talker_inputs, talker_output),
        StageSpec("code2wav", GENERATION, _engine_args("code2wav"), code2wav_inputs, code2wav_output,
                  hand_over=CHUNKED, kv_cache=False),  # Qwen3TTSCode2Wav: no attention layer
    ),
    load=load, check=check, request_of_run=request_of_run,
    speech=SpeechApi(parse=parse_tts_speech, named_events=True, error_event="speech.audio.error"),
    options=OPTIONS,
)
