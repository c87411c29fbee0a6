"""The stage graph's per-request flow: :class:`StageGraph` holds a declared pipeline's resident engines (started
by :func:`~core.pipeline.graph.engines.start_engines`) and runs each request through its stages
(:meth:`StageGraph.synthesize`: full hand-overs, then the frames streamed into the audio stage in chunks, as the
declaration's :class:`~core.pipeline.spec.PipelineSpec` says), aborts it in every stage when its caller stops,
and watches the engines (a dead one fails every in-flight request and marks the graph dead). See
:mod:`core.pipeline.graph`. Importing this module imports neither vLLM nor torch."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import types
import uuid
from typing import Any, AsyncIterator, Callable

from core.pipeline.config import GraphConfig
from core.pipeline.faults import failure_cause
from core.pipeline.fields import check_request_id
from core.pipeline.graph.engines import release_all, start_engines
from core.pipeline.graph.requests import AudioChunk, SpeechResult
from core.pipeline.spec import PipelineModel, PipelineSpec, StageSpec
from core.seams import ENGINE_DEAD_ERROR
from omni_backends.backend import Backend
from omni_backends.errors import BadInputError, StageFailedError

#: seconds between the watchdog's looks at each engine (``AsyncLLM.errored``)
WATCH_INTERVAL = 0.2


class StageGraph:
    """A declared pipeline's resident ``AsyncLLM`` engines, one per stage, over the core runner on the selected
    driver. Make it with :meth:`start`; see the module doc. ``spec``: the declaration; ``model``: what it read
    from disk (:class:`~core.pipeline.spec.PipelineModel`: sample rate, voices, chunk window, ...)."""

    stage_info: dict[str, dict[str, Any]]
    dead_stage: str | None

    def __init__(self, cfg: GraphConfig, spec: PipelineSpec, model: PipelineModel, engines: dict[str, Any],
                 stage_info: dict[str, dict[str, Any]]) -> None:
        self.cfg = cfg
        self.spec = spec
        self.model = model
        self.engines = engines
        self.stage_info = stage_info
        self.dead_stage = None
        self._dead = asyncio.Event()
        self._dead_waiter: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._in_flight: set[str] = set()
        self._owner: dict[str, str] = {}  # a stage request id -> the graph request id
        self._ids = itertools.count()
        self._closed = False

    @property
    def sample_rate(self) -> int:
        """The audio's sample rate (Hz)."""
        return self.model.sample_rate

    @property
    def voices(self) -> list[str]:
        """The voice names a request may name (the demo's ``voice-N``, a checkpoint's speakers)."""
        return list(self.model.voices)

    @property
    def num_voices(self) -> int:
        return len(self.model.voices)

    @property
    def hop_length(self) -> int:
        """Audio samples per codec frame."""
        return self.model.samples_per_frame

    # ------------------------------------------------------------------ start, stop
    @classmethod
    async def start(cls, cfg: GraphConfig, backend: Backend | None = None, say: Callable[[str], None] | None = None
                    ) -> "StageGraph":
        """Start the engines of the pipeline declared for ``cfg.model`` (:func:`core.pipeline.declarations.resolve`)
        concurrently (each ``core.stage.make_async_engine`` in a thread of its own: the constructors block until
        their engine core is up) and return the graph.

        ``backend``: the selected driver (``None``: ``registry.select(cfg.device)``). Before any engine starts:
        :class:`BadInputError` for a bad ``cfg``, engine choices the driver cannot run, missing / corrupt
        models, the stages not fitting the device together; the registry's errors for the device. An engine
        that fails to start: :class:`StageFailedError` naming its stage, after every engine that did start was
        released. ``stage_info[stage]``: ``engine_start_seconds``, the memory given, ``engine``
        (:func:`~core.pipeline.graph.engines.engine_config`); ``stage_info["graph"]["start_seconds"]``: the
        whole start's wall time. Delegates to :func:`~core.pipeline.graph.engines.start_engines`."""
        cfg, spec, model, engines, info = await start_engines(cfg, backend, say)
        graph = cls(cfg, spec, model, engines, info)
        graph._watchdog = asyncio.create_task(graph._watch(), name="omni-stage-graph-watchdog")
        graph._dead_waiter = asyncio.create_task(graph._dead.wait(), name="omni-stage-graph-dead")
        return graph

    async def shutdown(self) -> None:
        """Release every engine and its processes (``release_engine``: ``AsyncLLM.shutdown()``, then the
        engine-core processes waited for); in-flight requests then fail. Never raises; idempotent."""
        if self._closed:
            return
        self._closed = True
        own = [task for task in (self._watchdog, self._dead_waiter) if task is not None]
        for task in own:
            task.cancel()
        for engine in self.engines.values():  # on this loop, before the engine cores go: else each output
            handler = getattr(engine, "output_handler", None)  # handler logs EngineDeadError as they close
            if handler is not None:
                handler.cancel()
        await asyncio.sleep(0)  # let the cancelled output tasks finish on this loop
        await asyncio.to_thread(release_all, self.engines)
        # the graph's own tasks end here, not in asyncio.run's teardown: a task still pending then is cancelled
        # there and its CancelledError (traceback -> the task's frame -> this graph -> its engines) outlives the
        # loop, so each AsyncLLM is freed only at interpreter exit, where its __del__ -> shutdown() finds vLLM's
        # module globals gone ("Exception ignored in AsyncLLM.__del__ ... TypeError")
        await asyncio.gather(*own, return_exceptions=True)
        self._watchdog = self._dead_waiter = None
        await asyncio.sleep(0)

    async def _watch(self) -> None:
        """Mark the graph dead when a stage's engine died (``AsyncLLM.errored``: vLLM's engine-core monitor
        saw its process exit, or its output handler failed)."""
        while self.dead_stage is None and not self._closed:
            for stage, engine in self.engines.items():
                if engine.errored:
                    self._mark_dead(stage)
                    return
            await asyncio.sleep(WATCH_INTERVAL)

    def _mark_dead(self, stage: str) -> None:
        if self.dead_stage is None and not self._closed:
            self.dead_stage = stage
            self._dead.set()

    def _dead_error(self, exc: BaseException | None = None) -> StageFailedError:
        stage = self.dead_stage or "?"
        cause = failure_cause(exc if exc is not None else RuntimeError("EngineCore died"), self.engines.get(stage))
        return StageFailedError(f"stage {stage} failed while running: {cause} (the stage graph is dead; start a "
                                "new one)", stage=stage)

    # ------------------------------------------------------------------ requests
    def check(self, req: Any, request_id: str | None = None) -> None:
        """Check ``req`` without engine work: the declaration's check (``PipelineSpec.check``: its fields against
        the models, e.g. voices, the prompt's length) with the requests in flight, and ``request_id`` (when
        given) neither empty nor in flight; raises :class:`BadInputError` (a ``ValueError``) naming the field."""
        check_request_id(request_id, self._in_flight)
        self.spec.check(self.model, req, self._in_flight)

    def running(self) -> dict[str, set[str]]:
        """Stage -> the graph request ids whose requests that stage's engine still holds (its output
        processor's ``external_req_ids``: what vLLM's front end has not finished or aborted)."""
        return {stage: {self._owner.get(r, r) for r in list(engine.output_processor.external_req_ids)}
                for stage, engine in self.engines.items()}

    async def synthesize(self, req: Any, request_id: str | None = None) -> AsyncIterator[AudioChunk | SpeechResult]:
        """Run ``req`` (the declaration's request: what its ``check`` takes) through the declared stages: :class:`AudioChunk` s as
        the audio stage makes them, then one :class:`SpeechResult`. ``request_id``: the graph's id for it
        (default: the request's own ``request_id`` if it has one, else a fresh one). Raises
        :class:`BadInputError` (:meth:`check`) before any engine work, :class:`StageFailedError` naming the stage
        that failed (the graph dead, if its engine died). Closing the iterator early aborts the request in
        every stage."""
        import torch

        self.check(req, request_id)
        if self.dead_stage is not None:
            raise self._dead_error()
        if self._closed:
            raise StageFailedError("the stage graph is shut down", stage=None)
        rid = request_id or getattr(req, "request_id", None) or f"speech-{uuid.uuid4().hex[:12]}"
        self._in_flight.add(rid)
        ids: dict[str, list[str]] = {stage: [] for stage in self.spec.stage_names}
        counts: dict[str, dict[str, Any]] = {}
        timings: dict[str, float] = {}
        producer, audio = self.spec.producer, self.spec.audio
        window = self.spec.window(self.model)
        producer_task: asyncio.Task | None = None
        t_submit = time.perf_counter()
        try:
            upstream = None
            for stage in self.spec.stages[:-2]:  # full hand-overs
                upstream, timings[stage.name] = await self._until_dead(
                    self._full(rid, stage, req, upstream, ids, counts), stage.name)
            queue: asyncio.Queue = asyncio.Queue()
            producer_task = asyncio.create_task(self._stream(rid, producer, req, upstream, queue, ids, counts))
            got: list[Any] = []
            have, sent, index, producer_done = 0, 0, 0, False
            t_audio, first_chunk, samples = 0.0, None, 0
            while True:
                end = window.next_end(sent, index)
                while have < end and not producer_done:
                    item = await self._until_dead(queue.get(), producer.name)
                    if isinstance(item, BaseException):
                        raise self._stage_error(item, producer.name)
                    if item is None:
                        producer_done = True
                    else:
                        got.append(item)
                        have += item.shape[0]
                end = min(end, have)
                if end <= sent:
                    break
                codes = torch.cat(got) if len(got) > 1 else got[0]
                got = [codes]
                start = window.context_start(sent)
                t0 = time.perf_counter()
                wav = await self._until_dead(self._audio(rid, index, audio, req, codes[start:end], ids), audio.name)
                t_audio += time.perf_counter() - t0
                chunk = wav.reshape(end - start, -1)[sent - start:].reshape(-1).contiguous()
                ready = time.perf_counter()
                first_chunk = ready - t_submit if first_chunk is None else first_chunk
                samples += int(chunk.numel())
                yield AudioChunk(index=index, samples=chunk, codes=codes[sent:end].clone(), ready_at=ready)
                sent, index = end, index + 1
            timings[producer.name], producer_end = await self._until_dead(producer_task, producer.name)
            timings[audio.name] = t_audio
            codes = got[0] if got else torch.zeros((0, 0), dtype=torch.int64)
            first = counts.get(self.spec.stages[0].name, {})
            timings.update(first_chunk=first_chunk or 0.0, total=time.perf_counter() - t_submit,
                           **{f"{producer.name}_finished": producer_end - t_submit})
            yield SpeechResult(
                request_id=rid, text=first.get("text", ""), prompt_tokens=first.get("prompt", 0),
                generated_tokens=first.get("generated", 0), codes=codes, samples=samples,
                timings={k: round(v, 4) for k, v in timings.items()})
        finally:
            if producer_task is not None:
                if not producer_task.done():
                    producer_task.cancel()
                with contextlib.suppress(BaseException):
                    await producer_task  # its failure was reported through the queue: retrieved here
            await self._abort(ids)
            if self.model.audio_request_state and ids[audio.name]:
                await self._release_state(audio.name, rid)
            self._in_flight.discard(rid)

    async def _until_dead(self, aw: Any, stage: str) -> Any:
        """Await ``aw`` unless the graph dies first; a failure becomes :class:`StageFailedError` naming
        ``stage`` (vLLM's ``EngineDeadError`` also marks the graph dead)."""
        task = aw if isinstance(aw, asyncio.Future) else asyncio.ensure_future(aw)
        try:
            waiter = self._dead_waiter
            done, _ = await asyncio.wait({task} if waiter is None else {task, waiter},
                                         return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        if task not in done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise self._dead_error()
        try:
            return task.result()
        except (StageFailedError, BadInputError):
            raise
        except Exception as exc:
            raise self._stage_error(exc, stage) from exc

    def _stage_error(self, exc: BaseException, failed: str) -> StageFailedError:
        """``exc`` from stage ``failed`` (every await of a stage's work names its stage) as
        :class:`StageFailedError`; vLLM's ``EngineDeadError`` (or the stage's engine errored) also marks the graph
        dead."""
        if isinstance(exc, StageFailedError):
            return exc
        engine = self.engines.get(failed)
        if type(exc).__name__ == ENGINE_DEAD_ERROR.attr or (engine is not None and engine.errored):
            self._mark_dead(failed)
            if self.dead_stage is not None:
                return self._dead_error(exc if self.dead_stage == failed else None)
        return StageFailedError(f"stage {failed} failed while running: {failure_cause(exc, engine)}", stage=failed)

    def _stage_id(self, rid: str, stage: str, ids: dict[str, list[str]], suffix: str = "") -> str:
        sid = f"{rid}:{stage}{suffix}"
        ids[stage].append(sid)
        self._owner[sid] = rid
        return sid

    async def _abort(self, ids: dict[str, list[str]]) -> None:
        """Abort the request's stage requests vLLM still holds (``AsyncLLM.abort``), forget their ids."""
        for stage, sids in ids.items():
            engine = self.engines.get(stage)
            held = [s for s in sids if engine is not None and s in engine.output_processor.external_req_ids]
            if held and not engine.errored:
                with contextlib.suppress(Exception):
                    await engine.abort(held)
            for s in sids:
                self._owner.pop(s, None)

    async def _release_state(self, stage: str, rid: str) -> None:
        """Tell ``stage``'s model that the state it kept for ``rid`` across its chunk requests can go (the
        worker's ``omni_release_request_state``, after the request's chunk requests finished or were aborted).
        Never raises (a dead engine holds nothing)."""
        engine = self.engines.get(stage)
        if engine is None or engine.errored or self._closed:
            return
        with contextlib.suppress(Exception):
            await engine.collective_rpc("omni_release_request_state", args=([rid],))

    def _params(self, stage: StageSpec, req: Any, upstream: Any, output_kind: str) -> tuple[Any, Any]:
        """The stage's prompt and ``SamplingParams`` (the declaration's ``inputs``), its output kind set."""
        from vllm.sampling_params import RequestOutputKind

        prompt, params = stage.inputs(self.model, req, upstream)
        params.output_kind = getattr(RequestOutputKind, output_kind)
        return prompt, params

    @staticmethod
    def _count(counts: dict[str, dict[str, Any]], stage: str, out: Any, delta: bool) -> None:
        """Record a stage's prompt tokens, generated tokens and text from ``out`` (a delta or the final one)."""
        c = counts.setdefault(stage, {"prompt": 0, "generated": 0, "text": ""})
        if out.prompt_token_ids is not None:
            c["prompt"] = len(out.prompt_token_ids)
        if out.outputs:
            o = out.outputs[0]
            c["generated"] = c["generated"] + len(o.token_ids) if delta else len(o.token_ids)
            c["text"] = c["text"] + (o.text or "") if delta else (o.text or "")

    async def _full(self, rid: str, stage: StageSpec, req: Any, upstream: Any, ids: dict[str, list[str]],
                    counts: dict[str, dict[str, Any]]) -> tuple[Any, float]:
        """Run one stage to its end (``FINAL_ONLY``): its ``output`` of the final ``RequestOutput``, and its
        seconds."""
        prompt, params = self._params(stage, req, upstream, "FINAL_ONLY")
        t0 = time.perf_counter()
        out = None
        async with contextlib.aclosing(self.engines[stage.name].generate(
                prompt, params, request_id=self._stage_id(rid, stage.name, ids))) as gen:
            async for out in gen:
                pass
        self._count(counts, stage.name, out, delta=False)
        return stage.output(self.model, types.SimpleNamespace(), out), time.perf_counter() - t0

    async def _stream(self, rid: str, stage: StageSpec, req: Any, upstream: Any, queue: asyncio.Queue,
                      ids: dict[str, list[str]], counts: dict[str, dict[str, Any]]) -> tuple[float, float]:
        """Stream the stage's frames into ``queue`` (``RequestOutputKind.DELTA``; int64 ``[k, Q]`` tensors, then
        ``None``; an exception instead if it fails); returns its seconds and when it finished
        (``time.perf_counter()``)."""
        state = types.SimpleNamespace()
        t0 = time.perf_counter()
        try:
            prompt, params = self._params(stage, req, upstream, "DELTA")
            async with contextlib.aclosing(self.engines[stage.name].generate(
                    prompt, params, request_id=self._stage_id(rid, stage.name, ids))) as gen:
                async for out in gen:
                    self._count(counts, stage.name, out, delta=True)
                    frames = stage.output(self.model, state, out)
                    if frames is not None and frames.shape[0]:
                        queue.put_nowait(frames)
        except Exception as exc:  # the consumer reads it from the queue as this stage's failure
            queue.put_nowait(exc)
            raise
        queue.put_nowait(None)
        end = time.perf_counter()
        return end - t0, end

    async def _audio(self, rid: str, index: int, stage: StageSpec, req: Any, codes: Any,
                     ids: dict[str, list[str]]) -> Any:
        """The waveform of frames ``codes`` (int64 ``[k, Q]``, left context included): float32
        ``[k * samples per frame]``, one request of the audio stage."""
        prompt, params = self._params(stage, req, codes, "FINAL_ONLY")
        if self.model.audio_request_state:  # the model keeps the request's state under the graph's id
            from core.payloads import with_state_key

            with_state_key(params, rid)
        out = None
        async with contextlib.aclosing(self.engines[stage.name].generate(
                prompt, params, request_id=self._stage_id(rid, stage.name, ids, f"-{index}"))) as gen:
            async for out in gen:
                pass
        return stage.output(self.model, types.SimpleNamespace(), out)

    async def worker_stats(self) -> dict[str, dict[str, Any]]:
        """Per stage, rank 0's ``omni_state`` (``AsyncLLM.collective_rpc``): peak device memory of the stage's
        worker, talker MTP mode and graph use."""
        out = {}
        for stage, engine in self.engines.items():
            state = (await engine.collective_rpc("omni_state"))[0]
            out[stage] = {"peak_device_memory_bytes": state.get("peak_memory_bytes"),
                          "talker_mtp": state.get("mtp_mode"), "mtp_graph": state.get("mtp_graph")}
        return out

