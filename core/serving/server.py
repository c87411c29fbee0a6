"""``omni-backends serve``: the stage graph started once, resident, behind the HTTP app, for the process's life.

Lifecycle (:func:`serve`):

1. every option is checked (:meth:`ServeConfig.check`) and the port is bound before an engine starts (a bad
   value or a busy port fails at once, nothing started);
2. the stage graph starts (``StageGraph.start``: three ``AsyncLLM`` engines, concurrently);
3. uvicorn serves the app (:func:`core.serving.app.build_app`) on the bound socket;
4. SIGTERM (or SIGINT) drains (:class:`core.serving.draining.DrainingServer`): the server keeps listening, new
   speech requests and ``/health`` answer 503, the in-flight ones finish (up to ``drain_timeout`` seconds), then
   uvicorn stops, the graph shuts down, exit status 0 (130 for SIGINT); a second signal stops at once;
5. a stage whose engine died (the graph's ``dead_stage``, polled every 0.2 s and seen by every request): its
   in-flight requests fail with 503 (the graph raises ``StageFailedError`` for them), ``/health`` answers 503,
   the server stops and exits with status 3 (``EXIT_RUN_FAILED``) -- within :data:`DEAD_EXIT_S` seconds even
   if an engine's shutdown hangs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

from core.pipeline.config import GraphConfig, RunConfig
from core.serving.request_limits import DEFAULT_MAX_BODY_BYTES
from omni_backends.errors import BadInputError

#: the longest a server with a dead stage takes to exit after noticing it (seconds), whatever hangs
DEAD_EXIT_S = 6.0
#: how long the graph's shutdown may take before the process exits anyway (seconds; after a dead stage: 3)
SHUTDOWN_TIMEOUT_S = 30.0
DEAD_SHUTDOWN_TIMEOUT_S = 3.0


@dataclasses.dataclass
class ServeConfig:
    """What :func:`serve` serves. ``device``: driver name / alias, ``"auto"``, ``""`` or ``None`` (as ``run``);
    ``host`` / ``port``: where to listen (``port`` 0: any free port, printed); ``model``: a checkpoint folder
    (``--model``, e.g. Qwen3-TTS; ``None``: the demo); ``model_dir``: the demo models (``None``: the cache,
    created on first use); ``chunk_frames``: frames per audio-stage chunk (>= 1; ``None``: the pipeline's);
    ``max_concurrency``: speech requests in flight before 429 (>= 1); ``model_name``: the served model name
    (``/v1/models``, a request's ``model``; ``None``: ``omni-demo`` for the demo, the checkpoint folder's
    name); ``drain_timeout``: seconds SIGTERM waits for in-flight requests; ``max_body_bytes``: request bodies
    over it are 413, read no further (>= 1);
    ``enforce_eager`` / ``graph_mode`` / ``runner`` / ``seed``: the engines' options, as ``RunConfig``'s.
    Every value is checked when made (:class:`BadInputError` naming the flag)."""

    device: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    model_dir: str | None = None
    chunk_frames: int | None = None
    max_concurrency: int = 32
    model_name: str | None = None
    model: str | None = None
    drain_timeout: float = 60.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    enforce_eager: bool | None = None
    graph_mode: str | None = None
    runner: str = "auto"
    seed: int = 0
    #: per-stage overrides of the pipeline's deploy defaults (``--stage-overrides``, vLLM-Omni's)
    stage_overrides: dict[str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Types and ranges, no file system, no vLLM; raises :class:`BadInputError` naming the flag."""
        for name, flag, lo, hi in (("port", "--port", 0, 65535), ("chunk_frames", "--chunk-frames", 1, 4096),
                                   ("max_concurrency", "--max-concurrency", 1, 100000),
                                   ("max_body_bytes", "--max-body-bytes", 1, 1 << 40)):
            value = getattr(self, name)
            if value is None and name == "chunk_frames":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise BadInputError(f"{name} ({flag}) must be an integer in {lo}..{hi}, got {value!r}")
        if not isinstance(self.host, str) or not self.host.strip():
            raise BadInputError(f"host (--host) must be an address to listen on, got {self.host!r}")
        if self.model_name is not None and (not isinstance(self.model_name, str) or not self.model_name.strip()):
            raise BadInputError(f"model_name (--served-model-name) must be a name, got {self.model_name!r}")
        if not isinstance(self.drain_timeout, (int, float)) or isinstance(self.drain_timeout, bool) \
                or not self.drain_timeout >= 0:
            raise BadInputError(f"drain_timeout (--drain-timeout) must be seconds >= 0, got {self.drain_timeout!r}")
        # the engine options share RunConfig's checks (and messages)
        RunConfig(device=self.device, model=self.model, model_dir=self.model_dir, enforce_eager=self.enforce_eager,
                  stage_overrides=self.stage_overrides,
                  graph_mode=self.graph_mode, runner=self.runner, seed=self.seed)

    def graph_config(self, device: str) -> GraphConfig:
        """The stage graph this server starts (:class:`core.pipeline.config.GraphConfig`) on ``device`` (the
        selected driver's name), vLLM's stats off (:func:`serve` adds its per-stage loggers); the one place
        the serve options become the graph's, also for a caller that drives the same graph in its own process
        (``bench/bench_serve.py --inproc-only``). Raises :class:`BadInputError` as ``GraphConfig``'s check."""
        return GraphConfig(model=self.model, model_dir=self.model_dir, device=device, chunk_frames=self.chunk_frames,
                           seed=self.seed, enforce_eager=self.enforce_eager, graph_mode=self.graph_mode,
                           runner=self.runner, stage_overrides=self.stage_overrides)


def served_model_name(spec: Any, model: str | None) -> str:
    """The name a server serves when ``--served-model-name`` is not given: the declaration's (``spec``, a
    ``PipelineSpec``: ``served_name``, e.g. ``omni-demo`` for the demo), else the checkpoint folder's name
    (``--model``; vLLM names a local model by its path; vLLM-Omni's clients send what ``GET /v1/models`` lists)."""
    if spec.served_name is not None or model is None:
        return spec.served_name or spec.name
    return os.path.basename(os.path.normpath(os.path.abspath(model)))


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6); :class:`BadInputError` if it cannot be bound."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        raise BadInputError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port "
                            f"(0: any free one) or --host") from exc
    sock.set_inheritable(True)
    return sock


class _Lifecycle:
    """The server's fate: draining (a signal), or a dead stage (exit status 3, forced after DEAD_EXIT_S)."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.server: Any = None
        self.dead_stage: str | None = None
        self.signal: int | None = None
        self.drain_timeout: float | None = None

    def stage_dead(self, stage: str) -> None:
        if self.dead_stage is not None:
            return
        self.dead_stage = stage
        self.say(f"the {stage} stage's engine died: failing its requests (503), shutting down")
        timer = threading.Timer(DEAD_EXIT_S, self._force_exit)
        timer.daemon = True
        timer.start()
        if self.server is not None:
            self.server.config.timeout_graceful_shutdown = 2.0
            self.server.should_exit = True

    def _force_exit(self) -> None:
        self.say(f"still running {DEAD_EXIT_S} s after the {self.dead_stage} stage died: exiting now")
        os._exit(3)

    def on_signal(self, sig: int, frame: Any) -> None:  # what uvicorn re-raises after its graceful exit
        self.signal = sig

    def exit_status(self) -> int:
        from omni_backends.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_RUN_FAILED

        if self.dead_stage is not None:
            return EXIT_RUN_FAILED
        return EXIT_INTERRUPTED if self.signal == signal.SIGINT else EXIT_OK


async def _watch(graph: Any, life: _Lifecycle, state: Any) -> None:
    """Until the server stops: say when it starts draining (a signal, or asked to stop); report a dead stage."""
    announced = False
    while True:
        server = life.server
        if server is not None and server.should_exit:
            state.draining = True
        if state.draining and not announced:
            announced = True
            life.say(f"draining: finishing the {state.in_flight} request(s) in flight, answering new ones 503")
        stage = graph.dead_stage
        if stage is not None:
            life.stage_dead(stage)
            return
        await asyncio.sleep(0.2)


async def serve(cfg: ServeConfig, say: Callable[[str], None] | None = None) -> int:
    """Serve until SIGTERM / SIGINT (drain, exit 0 / 130) or a dead stage (exit 3); returns the exit status.

    Raises the device and input errors of ``omni-backends run`` (:class:`BadInputError`, the registry's),
    and :class:`BadInputError` for a port it cannot bind, before any engine starts."""
    import uvicorn

    from core.pipeline.graph import StageGraph
    from core.serving.app import ServerState, build_app
    from core.serving.draining import DrainingServer
    from core.serving.metrics import ServingMetrics, stage_stat_logger
    from omni_backends.registry import select

    from core.pipeline.declarations import resolve

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    cfg.check()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    spec = resolve(cfg.model)  # a checkpoint no declaration serves fails here, before the device
    model_name = cfg.model_name or served_model_name(spec, cfg.model)
    sel = select(cfg.device)  # cheap: no vendor stack imported yet
    say(f"device: {sel.name} ({sel.rule}): {sel.reason}")
    graph_cfg = cfg.graph_config(sel.name)
    from prometheus_client import CollectorRegistry

    registries: dict[str, Any] = {stage: CollectorRegistry() for stage in spec.stage_names}
    graph_cfg = dataclasses.replace(graph_cfg, stat_loggers={  # vLLM's metrics per stage, each in its registry
        stage: [stage_stat_logger(stage, reg)] for stage, reg in registries.items()})
    sock = bind(cfg.host, cfg.port)  # a busy port fails before any engine starts
    life = _Lifecycle(say)
    t0 = time.perf_counter()
    try:
        # the architectures registered here first: vLLM's load_general_plugins marks its plugins loaded before
        # it runs them, so of three engines built at once in threads, one can look its model up too early
        from core.models import register

        register()
        graph = await StageGraph.start(graph_cfg, sel.backend, say=say)
    except BaseException:
        sock.close()
        raise
    state = ServerState(model_name=model_name, max_concurrency=cfg.max_concurrency,
                        metrics=ServingMetrics(registries), on_stage_dead=life.stage_dead,
                        max_body_bytes=cfg.max_body_bytes)
    try:
        app = build_app(graph, state)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=cfg.drain_timeout,
                                timeout_keep_alive=5)
        server = DrainingServer(config, state, cfg.drain_timeout, say)
        life.server = server
        old = {sig: signal.signal(sig, life.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        watcher = asyncio.ensure_future(_watch(graph, life, state))
        host, port = sock.getsockname()[:2]
        say(f"serving {model_name!r} on http://{host}:{port} (stages started in "
            f"{time.perf_counter() - t0:.1f} s; POST /v1/audio/speech)")
        try:
            await server.serve(sockets=[sock])
        finally:
            watcher.cancel()
            for sig, handler in old.items():
                signal.signal(sig, handler)
    finally:
        try:
            await asyncio.wait_for(graph.shutdown(), DEAD_SHUTDOWN_TIMEOUT_S if life.dead_stage else SHUTDOWN_TIMEOUT_S)
        except (asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - exiting anyway; say why
            say(f"the stage graph did not shut down cleanly: {type(exc).__name__}: {exc}")
        sock.close()
    status = life.exit_status()
    say(f"stopped (exit status {status})")
    if life.dead_stage is not None:  # no interpreter teardown (vLLM's exit hooks and threads) after a dead engine
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
