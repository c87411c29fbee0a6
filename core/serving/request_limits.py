"""What the server refuses before its routes see a request, and how: every answer an OpenAI-style error body.

- :class:`RequestGuard` (pure ASGI middleware, outside the routes): a request body over ``max_body_bytes``
  is 413 (``Content-Length`` alone decides when the client sends one; a chunked body is read only up to the
  limit, never further); a failure that escapes a route before its response started is one 500 with the
  OpenAI-style body (not Starlette's plain text); both counted in the speech metrics when on the speech path
  (``on_refused(path, outcome)``: ``too_large``, ``bad_request``, ``failed``, or ``aborted`` for a client gone
  before its body arrived);
- :func:`decode_json`: a request body as JSON, or a 400 naming the fault: not UTF-8, not JSON, nested deeper than
  the decoder goes (``[`` x 100000: Python's ``RecursionError``), or text that is not valid Unicode (a lone
  surrogate such as ``"\\udcff"``, which JSON's ``\\u`` escapes allow and every tokenizer rejects);
- :func:`install`: the guard and OpenAI-style bodies for Starlette's own errors (404, 405) on an app.

Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any, Callable

from core.serving.protocol import ApiError, bad_request

#: the default request-body limit (bytes): a speech request is a few kB (``input`` <= 4096 characters)
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: the path whose requests the speech metrics count
SPEECH_PATH = "/v1/audio/speech"

log = logging.getLogger("core.serving")


async def send_error(send: Callable[..., Any], exc: ApiError) -> None:
    """Send ``exc`` as a complete JSON response on a raw ASGI ``send``."""
    body = json.dumps(exc.body()).encode()
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def too_large(limit: int, size: int | None = None) -> ApiError:
    seen = f"{size} bytes" if size is not None else "more"
    return ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request body is {seen}; this server takes at most "
                    f"{limit} bytes (--max-body-bytes)")


class RequestGuard:
    """ASGI middleware: the body limit and the last-resort 500 (see the module doc). ``on_refused(path,
    outcome)`` is called for each request it answers (or drops) itself."""

    def __init__(self, app: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 on_refused: Callable[[str, str], None] | None = None):
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.on_refused = on_refused or (lambda path, outcome: None)

    async def __call__(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                self.on_refused(path, "bad_request")
                await send_error(send, bad_request(f"Content-Length {declared[:40]!r} is not a number of bytes"))
                return
            if int(declared) > self.max_body_bytes:
                self.on_refused(path, "too_large")
                await send_error(send, too_large(self.max_body_bytes, int(declared)))
                return
        receive = await self._buffered(scope, receive, send, path)
        if receive is None:
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # a bug in a route: one OpenAI-style 500, logged with its traceback
            if started:
                raise
            log.error("request to %s raised", path, exc_info=exc)
            self.on_refused(path, "failed")
            await send_error(send, ApiError(HTTPStatus.INTERNAL_SERVER_ERROR,
                                            f"the server failed: {type(exc).__name__}: {exc}"))

    async def _buffered(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any],
                        path: str) -> Callable[..., Any] | None:
        """The request's body read up to the limit, then replayed to the app (later ``receive`` calls go to
        the client: its disconnect); None when this answered 413 (nothing more is read) or the client left."""
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return receive
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before its body arrived: nobody to answer
                self.on_refused(path, "aborted")
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                self.on_refused(path, "too_large")
                await send_error(send, too_large(self.max_body_bytes))
                return None
            if not message.get("more_body", False):
                first = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
                break

        async def replay() -> dict:
            return first.pop() if first else await receive()

        return replay


def _bad_text(value: Any) -> tuple[str, int] | None:
    """The first string in ``value`` (keys too; walked without recursion) that is not valid Unicode, with the
    position of its first bad character, or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return item, exc.start
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def decode_json(raw: bytes) -> Any:
    """``raw`` as JSON; :class:`ApiError` 400 if it is not UTF-8, not JSON, nested too deep to decode, or holds
    text that is not valid Unicode (a lone surrogate), naming the top-level field where there is one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          "send JSON text in UTF-8") from exc
    try:
        body = json.loads(text)
    except RecursionError as exc:
        raise bad_request("the request body is nested too deeply to decode; a speech request is one JSON "
                          "object of plain fields") from exc
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON ({exc})") from exc
    fields = body.items() if isinstance(body, dict) else [(None, body)]
    for name, value in fields:
        bad = _bad_text(value) or (_bad_text(name) if name is not None else None)
        if bad is not None:
            s, pos = bad
            where = f"'{name}'" if name is not None else "the request body"
            raise bad_request(f"{where} holds text that is not valid Unicode: a lone surrogate "
                              f"{s[pos].encode('unicode_escape').decode()} at position {pos} (a JSON \\u escape "
                              "of half a surrogate pair); send UTF-8 text", name)
    return body


def install(app: Any, max_body_bytes: int, on_refused: Callable[[str, str], None] | None = None) -> None:
    """Put :class:`RequestGuard` in front of ``app``'s routes (a FastAPI / Starlette app, before it starts)
    and answer Starlette's own HTTP errors (404 unknown path, 405 method) with the OpenAI-style body."""
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    async def http_error(request: Any, exc: HTTPException) -> JSONResponse:
        err = ApiError(exc.status_code, str(exc.detail))
        return JSONResponse(err.body(), status_code=err.status, headers=getattr(exc, "headers", None))

    app.add_exception_handler(HTTPException, http_error)
    app.add_middleware(RequestGuard, max_body_bytes=max_body_bytes, on_refused=on_refused)


__all__ = ["DEFAULT_MAX_BODY_BYTES", "RequestGuard", "decode_json", "install", "send_error", "too_large"]
