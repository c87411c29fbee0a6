"""Checks of request fields that the declarations, the stage graph and serving share: the declared error of a
refused field (:class:`FieldError`, its ``param`` the field; :class:`UnknownModelError` for a model this server
does not serve), a speech request's common fields (``input``, ``speed``, ``stream`` / ``stream_format``,
``response_format``, integers in a range), what a parsed speech request is (:class:`SpeechOptions`), the seed's
range and a request id's check.

Each declaration's speech adapter (``PipelineSpec.speech``, :class:`core.pipeline.spec.SpeechApi`) parses its own
request with these; serving maps :class:`FieldError` to a 400 (:class:`UnknownModelError` to a 404) naming
``param``. Below both: this module imports only :mod:`omni_backends.errors`. Light: neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Collection

from omni_backends.errors import BadInputError

#: seeds reach ``numpy.random.seed`` (vLLM's ``set_random_seed``), which takes 0..2**32-1
MAX_SEED = 2**32 - 1
#: what a non-streamed response can be: a complete mono 16-bit WAV, or the same samples as raw PCM
RESPONSE_FORMATS = ("wav", "pcm")
#: how a streamed response is framed: raw PCM chunks (``audio/pcm``) or server-sent events (base64 PCM)
STREAM_FORMATS = ("audio", "sse")
#: OpenAI's limit on ``input`` (characters); a pipeline's own token limit is its declaration's check
MAX_INPUT_CHARS = 4096


class FieldError(BadInputError):
    """A request field refused before any engine work; ``param``: the request field at fault (OpenAI's error
    ``param``), or None. Serving answers it 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnknownModelError(FieldError):
    """A request naming a model this server does not serve (``param`` ``model``). Serving answers it 404, as
    vLLM answers an unknown model."""


@dataclasses.dataclass(frozen=True)
class SpeechOptions:
    """A parsed speech request: ``request`` (the declaration's request object, what its ``check`` and the stage
    graph take) and how the audio leaves: ``response_format`` (one of :data:`RESPONSE_FORMATS`), ``stream``,
    ``stream_format`` (``audio``: raw bytes; ``sse``: server-sent events; None when not streamed)."""

    request: Any
    response_format: str
    stream: bool
    stream_format: str | None


def check_int(value: Any, name: str, flag: str, lo: int, hi: int | None = None) -> None:
    """:class:`BadInputError` naming ``name`` (``flag``) unless ``value`` is an integer (not a bool) with
    ``lo <= value <= hi`` (``hi`` None: no upper bound)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadInputError(f"{name} ({flag}) must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise BadInputError(f"{name} ({flag}) must be {rng}, got {value}")


def check_request_id(request_id: Any, in_flight: Collection[str]) -> None:
    """``request_id`` non-empty text or ``None``, and not in ``in_flight``; :class:`BadInputError` otherwise."""
    if request_id is not None:
        if not isinstance(request_id, str) or not request_id.strip():
            raise BadInputError(f"request_id must be non-empty text or None, got {request_id!r}")
        if request_id in in_flight:
            raise BadInputError(f"request_id {request_id!r} is already in flight; use another id")


def known_fields(body: Any, fields: tuple[str, ...], what: str) -> None:
    """``body`` a JSON object holding only ``fields``; else a :class:`FieldError` naming the first unknown one
    (``what``: the fields a body needs, for the message about a body that is no object)."""
    if not isinstance(body, dict):
        raise FieldError(f"the request body must be a JSON object with {what}")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise FieldError(f"unknown field(s) {', '.join(map(repr, unknown))}; this endpoint reads "
                         f"{', '.join(fields)}", unknown[0])


def served_model(model: Any, model_name: str) -> None:
    """:class:`UnknownModelError` unless ``model`` is the served name ``model_name``."""
    if model != model_name:
        raise UnknownModelError(f"The model `{model}` does not exist; this server serves {model_name!r} "
                                "(GET /v1/models)", "model")


def input_text(body: dict[str, Any]) -> str:
    """``input``: non-empty text of at most :data:`MAX_INPUT_CHARS` characters; a :class:`FieldError` naming it
    otherwise."""
    text = body.get("input")
    if not isinstance(text, str):
        raise FieldError(f"'input' must be text, got {type(text).__name__}", "input")
    if not text.strip():
        raise FieldError("'input' is empty; send the text to speak", "input")
    if len(text) > MAX_INPUT_CHARS:
        raise FieldError(f"'input' is {len(text)} characters; the limit is {MAX_INPUT_CHARS}", "input")
    return text


def unit_speed(body: dict[str, Any]) -> None:
    """``speed`` absent or 1.0 (no time stretching here); a :class:`FieldError` naming it otherwise."""
    speed = body.get("speed")
    if speed is not None and (not isinstance(speed, (int, float)) or isinstance(speed, bool)
                              or not math.isfinite(speed) or speed != 1.0):
        raise FieldError(f"'speed' must be 1.0 (this server does not change the speed), got {speed!r}", "speed")


def stream_fields(body: dict[str, Any]) -> tuple[bool, str | None]:
    """``(stream, stream_format)`` as sent: a boolean (``null``: false) and ``None`` or one of
    :data:`STREAM_FORMATS`; a :class:`FieldError` naming the field otherwise."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise FieldError(f"'stream' must be true or false, got {stream!r}", "stream")
    stream_format = body.get("stream_format")
    if stream_format is not None and stream_format not in STREAM_FORMATS:
        raise FieldError(f"'stream_format' must be one of {', '.join(STREAM_FORMATS)}, got {stream_format!r}",
                         "stream_format")
    return stream, stream_format


def response_format(value: Any) -> None:
    """``value`` one of :data:`RESPONSE_FORMATS`; a :class:`FieldError` naming ``response_format`` otherwise."""
    if value not in RESPONSE_FORMATS:
        raise FieldError(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}, got {value!r}",
                         "response_format")


def int_field(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    """``body[name]``: an integer (not a bool) in ``lo..hi``, ``default`` when absent or null; a
    :class:`FieldError` naming it otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(f"'{name}' must be an integer in {lo}..{hi}, got {value!r}", name)
    if not lo <= value <= hi:
        raise FieldError(f"'{name}' must be in {lo}..{hi}, got {value}", name)
    return value


def optional_field(body: dict[str, Any], name: str, types: tuple[type, ...], what: str) -> Any:
    """``body[name]``: None or of ``types`` (a bool only where ``types`` names it); a :class:`FieldError` saying
    ``what`` it must be otherwise."""
    value = body.get(name)
    if value is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
        raise FieldError(f"'{name}' must be {what}, got {value!r}"[:300], name)
    return value
