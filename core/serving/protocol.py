"""The speech API's wire format: ``POST /v1/audio/speech``'s request, checked field by field before any engine
work -- OpenAI's for the demo (:func:`parse_speech`), vLLM-Omni's for Qwen3-TTS (:func:`parse_tts_speech`) -- and
its OpenAI-style error body.

Light: importing it imports neither vLLM nor torch; the error body is built from vLLM's own ``ErrorResponse``
(``core.seams.OPENAI_ERROR_RESPONSE``) only when an error is sent.
"""

from __future__ import annotations

import dataclasses
import math
from http import HTTPStatus
from typing import Any

from core.pipeline.config import MAX_SEED, THINKER_MAX_MODEL_LEN
from core.pipeline.declarations.demo import VOICE_PREFIX, voice_names
from core.seams import OPENAI_ERROR_RESPONSE

#: what a non-streamed response can be: a complete mono 16-bit WAV, or the same samples as raw PCM
RESPONSE_FORMATS = ("wav", "pcm")
#: how a streamed response is framed: raw PCM chunks (``audio/pcm``) or server-sent events (base64 PCM)
STREAM_FORMATS = ("audio", "sse")
#: OpenAI's limit on ``input`` (characters); the thinker's own token limit is checked by the stage graph
MAX_INPUT_CHARS = 4096
#: thinker tokens when the request names none (what ``omni-backends run`` uses)
DEFAULT_MAX_TOKENS = 32
#: every field the endpoint reads; any other is refused (naming these)
FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed", "stream", "stream_format",
          "seed", "max_tokens")


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body (vLLM's ``ErrorResponse``: ``{"error": {"message", "type",
    "param", "code"}}``). ``status``: the HTTP status (int); ``param``: the request field at fault, or None."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON body, validated by vLLM's ``ErrorResponse`` model (``type`` is the status's name in vLLM's
        spelling, e.g. ``BadRequestError``, ``TooManyRequestsError``, ``ServiceUnavailableError``)."""
        phrase = HTTPStatus(self.status).phrase.replace(" ", "").replace("-", "")
        err_type = phrase if phrase.endswith("Error") else phrase + "Error"
        model = OPENAI_ERROR_RESPONSE.resolve()
        return model.model_validate({"error": {"message": self.message, "type": err_type, "param": self.param,
                                               "code": self.status}}).model_dump()


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 naming ``param``."""
    return ApiError(HTTPStatus.BAD_REQUEST, message, param)


@dataclasses.dataclass(frozen=True)
class SpeechOptions:
    """A checked speech request: what the stage graph synthesises (``text``, ``voice`` id, ``seed``,
    ``max_tokens``) and how the audio leaves (``response_format`` wav|pcm, ``stream``, ``stream_format``
    audio|sse, None when not streamed)."""

    text: str
    voice: int
    seed: int
    max_tokens: int
    response_format: str
    stream: bool
    stream_format: str | None


def _int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"'{name}' must be an integer in {lo}..{hi}, got {value!r}", name)
    if not lo <= value <= hi:
        raise bad_request(f"'{name}' must be in {lo}..{hi}, got {value}", name)
    return value


def _voice(value: Any, num_voices: int) -> int:
    names = voice_names(num_voices)
    if isinstance(value, dict) and set(value) == {"id"}:  # OpenAI's custom-voice form {"id": ...}
        value = value["id"]
    if not isinstance(value, str) or value not in names:
        raise bad_request(f"unknown voice {value!r}; this model's voices are {', '.join(names)} "
                          f"(GET /v1/audio/voices)", "voice")
    return int(value[len(VOICE_PREFIX):])


def _known_fields(body: Any, fields: tuple[str, ...], what: str) -> None:
    """``body`` a JSON object holding only ``fields``; else a 400 naming the first unknown one."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object with {what}")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise bad_request(f"unknown field(s) {', '.join(map(repr, unknown))}; this endpoint reads "
                          f"{', '.join(fields)}", unknown[0])


def _served_model(model: Any, model_name: str) -> None:
    """404 (as vLLM answers an unknown model) unless ``model`` is the served name."""
    if model != model_name:
        raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist; this server serves "
                       f"{model_name!r} (GET /v1/models)", "model")


def _input_text(body: dict[str, Any]) -> str:
    """``input``: non-empty text of at most :data:`MAX_INPUT_CHARS` characters; a 400 naming it otherwise."""
    text = body.get("input")
    if not isinstance(text, str):
        raise bad_request(f"'input' must be text, got {type(text).__name__}", "input")
    if not text.strip():
        raise bad_request("'input' is empty; send the text to speak", "input")
    if len(text) > MAX_INPUT_CHARS:
        raise bad_request(f"'input' is {len(text)} characters; the limit is {MAX_INPUT_CHARS}", "input")
    return text


def _unit_speed(body: dict[str, Any]) -> None:
    """``speed`` absent or 1.0 (no time stretching here); a 400 naming it otherwise."""
    speed = body.get("speed")
    if speed is not None and (not isinstance(speed, (int, float)) or isinstance(speed, bool)
                              or not math.isfinite(speed) or speed != 1.0):
        raise bad_request(f"'speed' must be 1.0 (this server does not change the speed), got {speed!r}", "speed")


def _stream_fields(body: dict[str, Any]) -> tuple[bool, str | None]:
    """``(stream, stream_format)`` as sent: a boolean (``null``: false) and ``None`` or one of
    :data:`STREAM_FORMATS`; a 400 naming the field otherwise."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"'stream' must be true or false, got {stream!r}", "stream")
    stream_format = body.get("stream_format")
    if stream_format is not None and stream_format not in STREAM_FORMATS:
        raise bad_request(f"'stream_format' must be one of {', '.join(STREAM_FORMATS)}, got {stream_format!r}",
                          "stream_format")
    return stream, stream_format


def parse_speech(body: Any, *, model_name: str, num_voices: int) -> SpeechOptions:
    """Check an OpenAI speech request body (the decoded JSON) field by field; no engine work.

    ``model`` must be ``model_name`` (404 otherwise, as vLLM answers an unknown model); ``input`` non-empty text
    of at most :data:`MAX_INPUT_CHARS` characters; ``voice`` one of :func:`voice_names` (or ``{"id": name}``);
    ``response_format`` one of :data:`RESPONSE_FORMATS` (default ``wav``, ``pcm`` when streamed); ``speed``
    absent or 1.0; ``instructions`` absent or empty; ``stream`` a boolean; ``stream_format`` one of
    :data:`STREAM_FORMATS` (``sse`` streams even without ``stream``); ``seed`` 0..2**32-1 (default 0);
    ``max_tokens`` 1..THINKER_MAX_MODEL_LEN-1 (default 32). Raises :class:`ApiError` (400, or 404 for the model)
    naming the field and what to send instead.
    """
    _known_fields(body, FIELDS, "'model', 'input' and 'voice'")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"'model' is required: {model_name!r} (GET /v1/models)", "model")
    _served_model(model, model_name)
    text = _input_text(body)
    if "voice" not in body:
        raise bad_request(f"'voice' is required: one of {', '.join(voice_names(num_voices))}", "voice")
    voice = _voice(body["voice"], num_voices)
    instructions = body.get("instructions")
    if instructions not in (None, ""):
        raise bad_request("'instructions' are not supported by this model; leave them out", "instructions")
    _unit_speed(body)
    stream, stream_format = _stream_fields(body)
    stream = stream or stream_format == "sse"
    fmt = body.get("response_format")
    if fmt is not None and fmt not in RESPONSE_FORMATS:
        raise bad_request(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}, got {fmt!r}",
                          "response_format")
    if stream and fmt == "wav":
        raise bad_request("a streamed response carries raw 16-bit PCM; send response_format 'pcm', or "
                          "stream false for a complete WAV", "response_format")
    seed = _int(body, "seed", 0, 0, MAX_SEED)
    max_tokens = _int(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, THINKER_MAX_MODEL_LEN - 1)
    return SpeechOptions(text=text, voice=voice, seed=seed, max_tokens=max_tokens,
                         response_format=fmt or ("pcm" if stream else "wav"), stream=stream,
                         stream_format=(stream_format or "audio") if stream else None)


#: the SpeechRequest field a graph's check message names -> the request field it came from
_GRAPH_FIELDS = (("text", "input"), ("prompt", "input"), ("voice", "voice"), ("seed", "seed"),
                 ("max_tokens", "max_tokens"))


def graph_refusal(exc: Exception) -> ApiError:
    """The 400 for a request the stage graph's ``check`` refused: its ``param`` (the request field it names, as
    the Qwen3-TTS check gives it), else the field its message names."""
    message = str(exc)
    param = getattr(exc, "param", None) or next((field for key, field in _GRAPH_FIELDS if key in message), None)
    return bad_request(message, param)


# ------------------------------------------------------------------ vLLM-Omni's Qwen3-TTS request
#: every field the Qwen3-TTS speech endpoint reads (vLLM-Omni 0.30's ``OpenAICreateSpeechRequest`` names; ``speaker``
#: is its alias of ``voice``); any other is refused (naming these)
TTS_FIELDS = ("model", "input", "voice", "speaker", "instructions", "language", "task_type", "response_format",
              "speed", "sample_rate", "stream", "stream_format", "seed", "max_new_tokens", "ref_audio", "ref_text",
              "x_vector_only_mode", "non_streaming_mode")
#: vLLM-Omni's ``task_type`` values
TTS_TASK_TYPES = ("CustomVoice", "VoiceDesign", "Base")
#: response formats vLLM-Omni offers that this server does not encode (a 400 saying so)
UNSUPPORTED_FORMATS = ("flac", "mp3", "opus")


@dataclasses.dataclass(frozen=True)
class TTSSpeechOptions:
    """A checked Qwen3-TTS speech request: ``request`` (a :class:`core.models.qwen3_tts.TTSRequest`, checked against
    the checkpoint by the stage graph's ``check``) and how the audio leaves: ``response_format`` wav|pcm,
    ``stream``, ``stream_format`` (``audio``: raw bytes, a WAV streamed with a header of placeholder sizes first;
    ``sse``: vLLM-Omni's ``speech.audio.*`` events; None: not streamed)."""

    request: Any
    response_format: str
    stream: bool
    stream_format: str | None


def _optional(body: dict[str, Any], name: str, types: tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
        raise bad_request(f"'{name}' must be {what}, got {value!r}"[:300], name)
    return value


def parse_tts_speech(body: Any, *, model_name: str, sample_rate: int) -> TTSSpeechOptions:
    """Check a vLLM-Omni Qwen3-TTS speech request body (the decoded JSON) field by field; no engine work.

    As vLLM-Omni 0.30's ``OpenAICreateSpeechRequest`` reads it: ``model`` optional, else the served name (404
    otherwise); ``input`` non-empty text (at most :data:`MAX_INPUT_CHARS` characters); ``voice`` (alias ``speaker``,
    or ``{"id": name}``), ``instructions``, ``language`` text; ``task_type`` one of :data:`TTS_TASK_TYPES` (whether
    the checkpoint serves it is the stage graph's check); ``response_format`` wav | pcm (flac / mp3 / opus: a 400
    saying this server encodes wav and pcm); ``speed`` 1.0; ``sample_rate`` absent or ``sample_rate`` (no
    resampling); ``stream`` a boolean and ``stream_format`` audio | sse, with vLLM-Omni's meaning: ``audio``
    streams raw bytes, ``sse`` or ``stream: true`` alone streams ``speech.audio.*`` events; ``seed``,
    ``max_new_tokens`` integers; ``ref_audio`` text or list of text, ``ref_text`` text, ``x_vector_only_mode`` and
    ``non_streaming_mode`` booleans (Base voice cloning). Fields this endpoint does not read: a 400 naming them
    (vLLM-Omni drops them silently). Raises :class:`ApiError` (400, or 404 for the model) naming the field."""
    from core.models.qwen3_tts import TTSRequest

    _known_fields(body, TTS_FIELDS, "'input' and 'voice'")
    if body.get("model") is not None:
        _served_model(body["model"], model_name)
    text = _input_text(body)
    voices = [v["id"] if isinstance(v, dict) and set(v) == {"id"} else v
              for v in (body.get("voice"), body.get("speaker")) if v is not None]
    for v in voices:
        if not isinstance(v, str) or not v:
            raise bad_request(f"'voice' must be a speaker name (or {{\"id\": name}}), got {v!r}", "voice")
    if len(set(voices)) > 1:
        raise bad_request(f"'voice' and 'speaker' name different speakers ({voices[0]!r}, {voices[1]!r}); send one",
                          "voice")
    fields = {name: _optional(body, name, (str,), "text") for name in ("instructions", "language", "ref_text")}
    task_type = body.get("task_type")
    if task_type is not None and task_type not in TTS_TASK_TYPES:
        raise bad_request(f"'task_type' must be one of {', '.join(TTS_TASK_TYPES)}, got {task_type!r}", "task_type")
    fmt = body.get("response_format", "wav")
    if fmt in UNSUPPORTED_FORMATS:
        raise bad_request(f"response_format {fmt!r} is not encoded by this server; use one of "
                          f"{', '.join(RESPONSE_FORMATS)}", "response_format")
    if fmt not in RESPONSE_FORMATS:
        raise bad_request(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}, got {fmt!r}",
                          "response_format")
    _unit_speed(body)
    rate = body.get("sample_rate")
    if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool) or rate != sample_rate):
        raise bad_request(f"'sample_rate' must be {sample_rate} (the model's; this server does not resample), "
                          f"got {rate!r}", "sample_rate")
    stream, stream_format = _stream_fields(body)
    mode = "audio" if stream_format == "audio" else "sse" if (stream or stream_format == "sse") else None
    ref_audio = body.get("ref_audio")
    if ref_audio is not None and not (isinstance(ref_audio, str) or (
            isinstance(ref_audio, list) and ref_audio and all(isinstance(x, str) for x in ref_audio))):
        raise bad_request("'ref_audio' must be text (a URL, base64 or file URI) or a list of them", "ref_audio")
    ints = {name: _optional(body, name, (int,), "an integer") for name in ("seed", "max_new_tokens")}
    flags = {name: _optional(body, name, (bool,), "true or false") for name in ("x_vector_only_mode",
                                                                               "non_streaming_mode")}
    request = TTSRequest(text=text, task_type=task_type, speaker=voices[0] if voices else None,
                         language=fields["language"], instructions=fields["instructions"], seed=ints["seed"],
                         max_new_tokens=ints["max_new_tokens"], ref_audio=ref_audio, ref_text=fields["ref_text"],
                         x_vector_only_mode=flags["x_vector_only_mode"],
                         non_streaming_mode=flags["non_streaming_mode"])
    return TTSSpeechOptions(request=request, response_format=fmt, stream=mode is not None, stream_format=mode)
