"""The HTTP app (FastAPI) over a started stage graph: OpenAI's speech endpoint, voices, models, health, metrics.

- ``POST /v1/audio/speech``: checked (the pipeline's own speech adapter, ``graph.spec.speech.parse``, then the
  graph's ``check``) before any engine work -> 400/404 with an OpenAI-style body; past ``max_concurrency``
  requests in flight -> 429; then ``graph.synthesize``: a complete WAV (or raw PCM), or streamed: raw PCM chunks
  (``audio/pcm``) or server-sent events (``speech.audio.delta`` with base64 PCM, then ``speech.audio.done``;
  framed as the adapter declares) as the audio stage makes them. A stage failure before the first byte is a
  503; after it, an SSE error event (the adapter's ``error_event``; raw PCM: the connection is cut, so the body
  is incomplete). A client that goes away aborts its request in every stage: the synthesize iterator is
  cancelled / closed (the stage graph's contract).
- every request passes :mod:`core.serving.request_limits` first (body limit -> 413, a route's escaped failure ->
  an OpenAI-style 500, both counted); bodies decode through its ``decode_json`` (400 for what cannot be used);
- ``GET /v1/audio/voices``, ``GET /v1/models``, ``GET /health`` (503 once a stage died, or while draining),
  ``GET /metrics`` (:mod:`core.serving.metrics`).

Every response of the speech endpoint carries ``X-Request-Id`` and ``X-Sample-Rate``; ``X-Submitted-At`` is the
server's ``time.perf_counter()`` when the request reached the graph (CLOCK_MONOTONIC on Linux: comparable with a
client's on the same host).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
import uuid
from http import HTTPStatus
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from core.serving.metrics import CONTENT_TYPE, ServingMetrics
from core.serving.protocol import ApiError, bad_request, refusal
from core.serving.request_limits import DEFAULT_MAX_BODY_BYTES, SPEECH_PATH, decode_json, install
from omni_backends.errors import BadInputError, StageFailedError

#: media types of the two audio encodings
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}


@dataclasses.dataclass
class ServerState:
    """What the routes share: the served model name, the concurrency limit, requests in flight, whether the
    server drains (SIGTERM: no new requests, in-flight ones finish), the metrics, and ``on_stage_dead`` (called
    once with the stage's name when a request finds the graph's ``dead_stage`` set)."""

    model_name: str
    max_concurrency: int = 32
    in_flight: int = 0
    draining: bool = False
    metrics: ServingMetrics = dataclasses.field(default_factory=ServingMetrics)
    on_stage_dead: Callable[[str], None] | None = None
    #: request bodies over this many bytes are 413, read no further (``--max-body-bytes``)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


#: the end of a synthesis, in a request's queue
_END = object()


class ClientGone(Exception):
    """The client disconnected before its response started."""


def error_response(exc: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _is_chunk(item: Any) -> bool:
    """An ``AudioChunk`` (it has ``ready_at``), not the final ``SpeechResult``."""
    return hasattr(item, "ready_at")


async def _until_disconnected(receive: Callable[[], Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, awaitable: Any) -> Any:
    """The result of ``awaitable``; if the client disconnects first, cancel it (so the graph aborts the request
    in every stage) and raise :class:`ClientGone`."""
    task = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_until_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientGone()
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - the cancelled synthesis' own ending
                pass


class _ClosingStream(StreamingResponse):
    """A StreamingResponse that closes its body iterator however the response ends (Starlette cancels the
    sending task when the client disconnects but leaves a generator suspended at a ``yield`` unclosed)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


def _sse(event: dict[str, Any], named: bool = False) -> bytes:
    """One server-sent event; ``named``: with an ``event:`` line naming its type (vLLM-Omni's framing)."""
    data = f"data: {json.dumps(event)}\n\n"
    return (f"event: {event['type']}\n{data}" if named else data).encode()


def _sse_error(err: ApiError, speech: Any) -> bytes:
    """The error event ending a stream, as the pipeline's speech adapter declares it (``error_event``, e.g.
    vLLM-Omni's ``speech.audio.error``; ``named_events``): ``{"type", "error": {...}}``."""
    return _sse({"type": speech.error_event, **err.body()}, speech.named_events)


def _usage(result: Any) -> dict[str, int]:
    return {"input_tokens": int(result.prompt_tokens), "output_tokens": int(result.codes.shape[0]),
            "total_tokens": int(result.prompt_tokens) + int(result.codes.shape[0])}


def _done_event(result: Any, submitted_at: float, sample_rate: int) -> dict[str, Any]:
    return {"type": "speech.audio.done", "usage": _usage(result), "request_id": result.request_id,
            "samples": int(result.samples), "sample_rate": sample_rate, "submitted_at": submitted_at,
            "timings": {k: float(v) for k, v in result.timings.items()}, "text": result.text,
            "codes": result.codes.tolist()}


class SpeechHandler:
    """One speech request from check to last byte (see the module docstring)."""

    def __init__(self, graph: Any, state: ServerState):
        self.graph = graph
        self.state = state
        #: the pipeline's speech request (its declaration's ``SpeechApi``: parse, SSE framing)
        self.speech = graph.spec.speech

    def _checked(self, body: Any, rid: str) -> Any:
        """``body`` parsed by the pipeline's speech adapter into its request named ``rid``, and checked by the
        graph: the :class:`~core.pipeline.fields.SpeechOptions`; :class:`ApiError` (400 / 404) naming the field
        otherwise."""
        try:
            opts = self.speech.parse(body, model_name=self.state.model_name, model=self.graph.model, request_id=rid)
        except BadInputError as exc:
            raise refusal(exc) from exc
        try:
            self.graph.check(opts.request, request_id=rid)
        except BadInputError as exc:
            raise refusal(exc) from exc
        except (TypeError, ValueError, UnicodeError) as exc:  # e.g. the tokenizer refused the text
            raise bad_request(f"'input' cannot be tokenized: {type(exc).__name__}: {exc}", "input") from exc
        return opts

    def _dead(self) -> ApiError | None:
        stage = getattr(self.graph, "dead_stage", None)
        if stage is None:
            return None
        if self.state.on_stage_dead is not None:
            self.state.on_stage_dead(stage)
        return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, f"the {stage} stage's engine died; this server is "
                        "shutting down (restart it)")

    def _failed(self, exc: StageFailedError) -> ApiError:
        return self._dead() or ApiError(HTTPStatus.SERVICE_UNAVAILABLE, f"synthesis failed: {exc}")

    def _crashed(self, exc: BaseException) -> ApiError:
        """A 500 for an error of the graph that is not a stage failure (a bug: its traceback is logged)."""
        import logging

        logging.getLogger("core.serving").error("synthesis raised", exc_info=exc)
        return ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"synthesis failed: {type(exc).__name__}: {exc}")

    async def __call__(self, request: Request) -> Response:
        m = self.state.metrics
        dead = self._dead()
        if dead is not None:
            return error_response(dead)
        if self.state.draining:
            return error_response(ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "this server is shutting down; "
                                           "send the request to another instance"))
        try:
            body = decode_json(await request.body())
            rid = f"speech-{uuid.uuid4().hex}"
            opts = self._checked(body, rid)
            req = opts.request
        except ApiError as exc:
            m.finished("bad_request")
            return error_response(exc)
        if self.state.in_flight >= self.state.max_concurrency:
            m.finished("rejected")
            return error_response(ApiError(HTTPStatus.TOO_MANY_REQUESTS, f"{self.state.in_flight} requests in "
                                           f"flight, the limit (--max-concurrency) is {self.state.max_concurrency};"
                                           " retry later"))
        self.state.in_flight += 1
        m.in_flight.set(self.state.in_flight)
        release = self._releaser()
        if opts.stream:
            return await self._stream(request, req, rid, opts, release)
        return await self._whole(request, req, rid, opts, release)

    def _releaser(self) -> Callable[..., None]:
        done = False

        def release(outcome: str, **timings: float | None) -> None:
            nonlocal done
            if done:
                return
            done = True
            self.state.in_flight -= 1
            self.state.metrics.in_flight.set(self.state.in_flight)
            self.state.metrics.finished(outcome, **timings)

        return release

    def _headers(self, rid: str, submitted_at: float) -> dict[str, str]:
        return {"X-Request-Id": rid, "X-Sample-Rate": str(int(self.graph.sample_rate)),
                "X-Submitted-At": repr(submitted_at)}

    def _timings(self, result: Any, submitted_at: float, first: float | None) -> dict[str, float | None]:
        return {"first_chunk_s": None if first is None else first - submitted_at,
                "wall_s": time.perf_counter() - submitted_at,
                "audio_s": int(result.samples) / int(self.graph.sample_rate)}

    def _produce(self, req: Any, rid: str, submitted_at: float,
                 release: Callable[..., None]) -> tuple[asyncio.Task, asyncio.Queue]:
        """Start synthesising ``req`` in a task of its own, outside Starlette's cancel scopes (so that cancelling
        it -- the client went away -- runs the graph's abort once, undisturbed). Its items (chunks, then the
        result) go to the returned queue, then either ``_END`` or the exception that ended it; the concurrency
        slot is released when the task ends."""
        queue: asyncio.Queue = asyncio.Queue()
        first: list[float] = []

        end: dict[str, Any] = {"outcome": "aborted", "timings": {}}

        async def produce() -> None:
            try:
                async for item in self.graph.synthesize(req, request_id=rid):
                    if _is_chunk(item) and not first:
                        first.append(float(item.ready_at))
                    elif not _is_chunk(item):
                        end.update(outcome="ok", timings=self._timings(item, submitted_at, first[0] if first else None))
                    queue.put_nowait(item)
                queue.put_nowait(_END)
            except StageFailedError as exc:
                end["outcome"] = "failed"
                queue.put_nowait(exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in the graph: the request gets a 500, the server keeps serving
                end["outcome"] = "failed"
                queue.put_nowait(exc)

        task = asyncio.ensure_future(produce())
        task.add_done_callback(lambda _: release(end["outcome"], **end["timings"]))
        return task, queue

    async def _whole(self, request: Request, req: Any, rid: str, opts: Any, release: Callable[..., None]) -> Response:
        from core.pipeline.audio import pcm16, wav_bytes

        submitted_at = time.perf_counter()
        task, queue = self._produce(req, rid, submitted_at, release)
        headers = self._headers(rid, submitted_at)
        try:
            await _unless_disconnected(request, asyncio.shield(task))
        except ClientGone:
            task.cancel()
            return Response(status_code=499)  # nobody reads it
        except StageFailedError:
            pass
        items = [queue.get_nowait() for _ in range(queue.qsize())]
        failed = next((x for x in items if isinstance(x, BaseException)), None)
        if isinstance(failed, StageFailedError):
            return error_response(self._failed(failed), headers)
        if failed is not None:
            return error_response(self._crashed(failed), headers)
        pcm = b"".join(pcm16(x.samples) for x in items if _is_chunk(x))
        body = wav_bytes(pcm, int(self.graph.sample_rate)) if opts.response_format == "wav" else pcm
        return Response(body, media_type=MEDIA_TYPES[opts.response_format], headers=headers)

    async def _stream(self, request: Request, req: Any, rid: str, opts: Any, release: Callable[..., None]) -> Response:
        from core.pipeline.audio import pcm16, streaming_wav_header

        submitted_at = time.perf_counter()
        task, queue = self._produce(req, rid, submitted_at, release)
        headers = self._headers(rid, submitted_at)
        sse = opts.stream_format == "sse"
        named = self.speech.named_events  # the adapter's SSE framing (vLLM-Omni's: ``event:`` lines)
        sr = int(self.graph.sample_rate)
        header = [streaming_wav_header(sr)] if opts.response_format == "wav" else []
        try:
            first = await _unless_disconnected(request, queue.get())
        except ClientGone:
            task.cancel()
            return Response(status_code=499)
        if isinstance(first, StageFailedError):
            return error_response(self._failed(first), headers)
        if isinstance(first, BaseException):
            return error_response(self._crashed(first), headers)
        if first is _END:
            return error_response(ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "the stage graph made no audio"),
                                  headers)

        def encode(chunk: Any) -> bytes:
            pcm = (header.pop() if header else b"") + pcm16(chunk.samples)  # a streamed WAV: its header first
            if not sse:
                return pcm
            return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode(),
                         "response_format": opts.response_format, "index": int(chunk.index),
                         "ready_at": float(chunk.ready_at)}, named)

        async def body() -> AsyncIterator[bytes]:
            item = first
            try:
                while item is not _END:
                    if isinstance(item, StageFailedError):
                        if not sse:
                            raise item  # the connection is cut: the client sees an incomplete body
                        yield _sse_error(self._failed(item), self.speech)
                        return
                    if isinstance(item, BaseException):
                        if not sse:
                            raise item
                        yield _sse_error(self._crashed(item), self.speech)
                        return
                    if _is_chunk(item):
                        yield encode(item)
                    elif sse:
                        yield _sse(_done_event(item, submitted_at, sr), named)
                    item = await queue.get()
            finally:
                task.cancel()  # a no-op once synthesis ended; else the client is gone: abort in every stage

        # the content type says what the bytes are: a streamed WAV (its header first) or raw PCM
        raw_type = MEDIA_TYPES["wav"] if header else MEDIA_TYPES["pcm"]
        return _ClosingStream(body(), media_type="text/event-stream" if sse else raw_type,
                              headers={**headers, "Cache-Control": "no-cache"})


def build_app(graph: Any, state: ServerState) -> FastAPI:
    """The FastAPI app serving ``graph`` (a started ``core.pipeline.graph.StageGraph``: ``spec`` (its
    declaration: ``spec.speech`` parses a request), ``model``, ``check``, ``synthesize``, ``running``,
    ``dead_stage``, ``sample_rate``, ``voices``) with ``state``. Every route is registered here."""
    app = FastAPI(title="omni-backends", description="OpenAI-compatible speech over the omni stage graph",
                  docs_url=None, redoc_url=None)
    app.state.serving = state
    speech = SpeechHandler(graph, state)
    install(app, state.max_body_bytes, lambda path, outcome: state.metrics.finished(outcome)
            if path == SPEECH_PATH else None)

    @app.post(SPEECH_PATH)
    async def create_speech(request: Request) -> Response:
        return await speech(request)

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        return {"voices": list(graph.voices)}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        from core.seams import OPENAI_MODEL_CARD, OPENAI_MODEL_LIST

        card = OPENAI_MODEL_CARD.resolve()(id=state.model_name, owned_by="omni-backends", root=state.model_name)
        return OPENAI_MODEL_LIST.resolve()(data=[card]).model_dump()

    @app.get("/health")
    async def health() -> JSONResponse:
        dead = graph.dead_stage
        running = {stage: sorted(ids) for stage, ids in graph.running().items()}
        body = {"status": "ok", "model": state.model_name, "in_flight": state.in_flight, "running": running}
        if dead is not None:
            if state.on_stage_dead is not None:
                state.on_stage_dead(dead)
            return JSONResponse({**body, "status": "unhealthy", "dead_stage": dead}, status_code=503)
        if state.draining:
            return JSONResponse({**body, "status": "draining"}, status_code=503)
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    return app
