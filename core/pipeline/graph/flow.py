"""The stage graph's per-request flow: :class:`StageGraph` holds the three resident engines (started by
:func:`~core.pipeline.graph.engines.start_engines`) and runs each request thinker -> talker -> code2wav
(:meth:`StageGraph.synthesize`), aborts it in every stage when its caller stops, and watches the engines
(a dead one fails every in-flight request and marks the graph dead). See :mod:`core.pipeline.graph`.
Importing this module imports neither vLLM nor torch."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from typing import Any, AsyncIterator, Callable

from core.pipeline.config import STAGES, GraphConfig
from core.pipeline.faults import failure_cause
from core.pipeline.graph.engines import _release_all, start_engines
from core.pipeline.graph.requests import (
    AudioChunk,
    SpeechRequest,
    SpeechResult,
    check_request,
    chunk_bounds,
    talker_frames,
)
from omni_backends.errors import BadInputError, StageFailedError

#: the thinker's sampling (as ``omni-backends run`` always had it); the seed is the request's
THINKER_TEMPERATURE, THINKER_TOP_P = 0.8, 0.95
#: seconds between the watchdog's looks at each engine (``AsyncLLM.errored``)
WATCH_INTERVAL = 0.2


class StageGraph:
    """Three resident ``AsyncLLM`` engines (thinker AR, talker AR, code2wav GENERATION) over the core runner
    on the selected driver. Make it with :meth:`start`; see the module doc."""

    sample_rate: int
    num_voices: int
    hop_length: int
    stage_info: dict[str, dict[str, Any]]
    dead_stage: str | None

    def __init__(self, cfg: GraphConfig, engines: dict[str, Any], configs: dict[str, dict[str, Any]],
                 tokenizer: Any, stage_info: dict[str, dict[str, Any]]) -> None:
        self.cfg = cfg
        self.engines = engines
        self.configs = configs
        self.tokenizer = tokenizer
        self.stage_info = stage_info
        self.sample_rate = int(configs["code2wav"].get("sample_rate", 16000))
        self.num_voices = int(configs["talker"].get("num_voices", 1))
        self.hop_length = int(configs["code2wav"].get("hop_length", 160))
        self.dead_stage = None
        self._dead = asyncio.Event()
        self._dead_waiter: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._in_flight: set[str] = set()
        self._owner: dict[str, str] = {}  # a stage request id -> the graph request id
        self._ids = itertools.count()
        self._closed = False

    # ------------------------------------------------------------------ start, stop
    @classmethod
    async def start(cls, cfg: GraphConfig, backend: Any = None, say: Callable[[str], None] | None = None
                    ) -> "StageGraph":
        """Start the three engines concurrently (each ``core.stage.make_async_engine`` in a thread of its own:
        the constructors block until their engine core is up) and return the graph.

        ``backend``: the selected driver (``None``: ``registry.select(cfg.device)``). Before any engine starts:
        :class:`BadInputError` for a bad ``cfg``, engine choices the driver cannot run, missing / corrupt
        models, the stages not fitting the device together; the registry's errors for the device. An engine
        that fails to start: :class:`StageFailedError` naming its stage, after every engine that did start was
        released. ``stage_info[stage]``: ``engine_start_seconds``, the memory given, ``engine``
        (:func:`~core.pipeline.graph.engines.engine_config`); ``stage_info["graph"]["start_seconds"]``: the
        whole start's wall time. Delegates to :func:`~core.pipeline.graph.engines.start_engines`."""
        cfg, engines, configs, tokenizer, info = await start_engines(cfg, backend, say)
        graph = cls(cfg, engines, configs, tokenizer, info)
        graph._watchdog = asyncio.create_task(graph._watch(), name="omni-stage-graph-watchdog")
        graph._dead_waiter = asyncio.create_task(graph._dead.wait(), name="omni-stage-graph-dead")
        return graph

    async def shutdown(self) -> None:
        """Release every engine and its processes (``release_engine``: ``AsyncLLM.shutdown()``, then the
        engine-core processes waited for); in-flight requests then fail. Never raises; idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in (self._watchdog, self._dead_waiter):
            if task is not None:
                task.cancel()
        for engine in self.engines.values():  # on this loop, before the engine cores go: else each output
            handler = getattr(engine, "output_handler", None)  # handler logs EngineDeadError as they close
            if handler is not None:
                handler.cancel()
        await asyncio.sleep(0)  # let the cancelled output tasks finish on this loop
        await asyncio.to_thread(_release_all, self.engines)
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
    def check(self, req: SpeechRequest) -> None:
        """Check ``req`` without engine work (:func:`~core.pipeline.graph.requests.check_request` with this
        graph's voices, thinker tokenizer and requests in flight); raises :class:`BadInputError` (a
        ``ValueError``) naming the field."""
        check_request(req, num_voices=self.num_voices, in_flight=self._in_flight,
                      count_tokens=lambda text: len(self.tokenizer(text)["input_ids"]))

    def running(self) -> dict[str, set[str]]:
        """Stage -> the graph request ids whose requests that stage's engine still holds (its output
        processor's ``external_req_ids``: what vLLM's front end has not finished or aborted)."""
        return {stage: {self._owner.get(r, r) for r in list(engine.output_processor.external_req_ids)}
                for stage, engine in self.engines.items()}

    async def synthesize(self, req: SpeechRequest) -> AsyncIterator[AudioChunk | SpeechResult]:
        """Run ``req`` through the three stages: :class:`AudioChunk` s as code2wav makes them, then one
        :class:`SpeechResult`. Raises :class:`BadInputError` (:meth:`check`) before any engine work,
        :class:`StageFailedError` naming the stage that failed (the graph dead, if its engine died).
        Closing the iterator early aborts the request in every stage."""
        import torch

        self.check(req)
        if self.dead_stage is not None:
            raise self._dead_error()
        if self._closed:
            raise StageFailedError("the stage graph is shut down", stage=None)
        rid = req.request_id or f"speech-{uuid.uuid4().hex[:12]}"
        self._in_flight.add(rid)
        ids = {stage: [] for stage in STAGES}
        talker_task: asyncio.Task | None = None
        t_submit = time.perf_counter()
        try:
            text, hidden, n_prompt, n_tokens, t_thinker = await self._until_dead(
                self._thinker(rid, req, ids), "thinker")
            frames = talker_frames(hidden.shape[0], req.max_tokens)
            queue: asyncio.Queue = asyncio.Queue()
            talker_task = asyncio.create_task(self._talker(rid, req, hidden, frames, queue, ids))
            got: list[Any] = []
            have, talker_done = 0, False
            t_c2w, first_chunk, samples = 0.0, None, 0
            for index, (start, end) in enumerate(chunk_bounds(frames, self.cfg.chunk_frames)):
                while have < end and not talker_done:
                    item = await self._until_dead(queue.get(), "talker")
                    if isinstance(item, BaseException):
                        raise self._stage_error(item, "talker")
                    if item is None:
                        talker_done = True
                    else:
                        got.append(item)
                        have += item.shape[0]
                end = min(end, have)
                if end <= start:
                    break
                codes = torch.cat(got) if len(got) > 1 else got[0]
                got = [codes]
                t0 = time.perf_counter()
                wav = await self._until_dead(self._code2wav(rid, index, codes[:end], ids), "code2wav")
                t_c2w += time.perf_counter() - t0
                chunk = wav.reshape(end, -1)[start:end].reshape(-1).contiguous()
                ready = time.perf_counter()
                first_chunk = ready - t_submit if first_chunk is None else first_chunk
                samples += int(chunk.numel())
                yield AudioChunk(index=index, samples=chunk, codes=codes[start:end].clone(), ready_at=ready)
            t_talker, talker_end = await self._until_dead(talker_task, "talker")
            codes = got[0] if got else torch.zeros((0, 0), dtype=torch.int64)
            yield SpeechResult(
                request_id=rid, thinker_text=text, prompt_tokens=n_prompt, thinker_tokens=n_tokens, codes=codes,
                samples=samples, timings={"thinker": round(t_thinker, 4), "talker": round(t_talker, 4),
                                          "code2wav": round(t_c2w, 4), "first_chunk": round(first_chunk or 0.0, 4),
                                          "talker_finished": round(talker_end - t_submit, 4),
                                          "total": round(time.perf_counter() - t_submit, 4)})
        finally:
            if talker_task is not None:
                if not talker_task.done():
                    talker_task.cancel()
                with contextlib.suppress(BaseException):
                    await talker_task  # its failure was reported through the queue: retrieved here
            await self._abort(ids)
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

    def _stage_error(self, exc: BaseException, stage: str) -> StageFailedError:
        """``exc`` from ``stage`` (or the stage it names, ``exc.omni_stage``) as :class:`StageFailedError`;
        vLLM's ``EngineDeadError`` (or the stage's engine errored) also marks the graph dead."""
        if isinstance(exc, StageFailedError):
            return exc
        failed = getattr(exc, "omni_stage", stage)
        engine = self.engines.get(failed)
        if type(exc).__name__ == "EngineDeadError" or (engine is not None and engine.errored):
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

    async def _thinker(self, rid: str, req: SpeechRequest, ids: dict[str, list[str]]) -> tuple:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        params = SamplingParams(max_tokens=req.max_tokens, temperature=THINKER_TEMPERATURE, top_p=THINKER_TOP_P,
                                seed=req.seed, output_kind=RequestOutputKind.FINAL_ONLY)
        t0 = time.perf_counter()
        out = None
        async with contextlib.aclosing(self.engines["thinker"].generate(
                req.text, params, request_id=self._stage_id(rid, "thinker", ids))) as gen:
            async for out in gen:
                pass
        return (out.outputs[0].text, out.multimodal_outputs["hidden"], len(out.prompt_token_ids),
                len(out.outputs[0].token_ids), time.perf_counter() - t0)

    async def _talker(self, rid: str, req: SpeechRequest, hidden: Any, frames: int, queue: asyncio.Queue,
                      ids: dict[str, list[str]]) -> tuple[float, float]:
        """Stream the talker's frames into ``queue`` (int64 ``[k, K]`` tensors, then ``None``; an exception
        instead if it fails); returns its seconds and when it finished (``time.perf_counter()``)."""
        import torch
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        from core.payloads import EXTRA_ARGS_KEY, pack

        # one token more than frames: a frame is a token plus its MTP residuals, made at the next decode step
        params = SamplingParams(max_tokens=frames + 1, temperature=0.0, ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.DELTA,
                                extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": hidden, "voice": req.voice})})
        t0 = time.perf_counter()
        try:
            async with contextlib.aclosing(self.engines["talker"].generate(
                    {"prompt_token_ids": [0] * hidden.shape[0]}, params,
                    request_id=self._stage_id(rid, "talker", ids))) as gen:
                async for out in gen:
                    codes = out.multimodal_outputs.get("codes.audio")
                    if codes is not None and codes.numel():
                        codes = codes.to(torch.int64)
                        codes = codes[codes[:, 0] >= 0]  # prompt rows carry -1
                        if codes.shape[0]:
                            queue.put_nowait(codes)
        except Exception as exc:
            exc.omni_stage = "talker"  # type: ignore[attr-defined]
            queue.put_nowait(exc)
            raise
        queue.put_nowait(None)
        end = time.perf_counter()
        return end - t0, end

    async def _code2wav(self, rid: str, index: int, codes: Any, ids: dict[str, list[str]]) -> Any:
        """The waveform of frames ``codes`` (int64 ``[T, K]``): float32 ``[T * hop_length]``, one forward."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        from core.payloads import EXTRA_ARGS_KEY, pack

        params = SamplingParams(max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
                                extra_args={EXTRA_ARGS_KEY: pack({"codes": codes})})
        out = None
        async with contextlib.aclosing(self.engines["code2wav"].generate(
                {"prompt_token_ids": [0] * codes.shape[0]}, params,
                request_id=self._stage_id(rid, "code2wav", ids, f"-{index}"))) as gen:
            async for out in gen:
                pass
        return out.multimodal_outputs["waveform"].reshape(-1)

    async def worker_stats(self) -> dict[str, dict[str, Any]]:
        """Per stage, rank 0's ``omni_state`` (``AsyncLLM.collective_rpc``): peak device memory of the stage's
        worker, talker MTP mode and graph use."""
        out = {}
        for stage, engine in self.engines.items():
            state = (await engine.collective_rpc("omni_state"))[0]
            out[stage] = {"peak_device_memory_bytes": state.get("peak_memory_bytes"),
                          "talker_mtp": state.get("mtp_mode"), "mtp_graph": state.get("mtp_graph")}
        return out

