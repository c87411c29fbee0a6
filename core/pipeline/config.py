"""What a run of the main job is: :class:`RunConfig`, its checks, the stages' shared engine settings and the
device-dependent defaults.

Light: importing it imports neither vLLM nor torch (a bad value fails before either).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from core.stage import GRAPH_MODES, RUNNERS
from omni_backends.errors import BadInputError

STAGES = ("thinker", "talker", "code2wav")
#: engine settings shared by the three stages on every device. fp32: the demo weights are fp32 and the talker's
#: codes must equal the plain-PyTorch reference (vLLM's ``dtype="auto"`` would run an fp32 checkpoint in bf16).
ENGINE_KW: dict[str, Any] = dict(dtype="float32", max_num_seqs=8)
THINKER_MAX_MODEL_LEN = 512
TALKER_MAX_MODEL_LEN = 1024
#: talker frames per code2wav request (``--chunk-frames``): audio streams out every this many frames
DEFAULT_CHUNK_FRAMES = 16


def default_model_dir() -> str:
    """``$OMNI_BACKENDS_CACHE`` or ``~/.cache/omni-backends``, then ``demo-v<format>``."""
    from core.models.create import FORMAT_VERSION

    root = os.environ.get("OMNI_BACKENDS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "omni-backends"
    )
    return os.path.join(root, f"demo-v{FORMAT_VERSION}")


#: seeds reach ``numpy.random.seed`` (vLLM's ``set_random_seed``), which takes 0..2**32-1
MAX_SEED = 2**32 - 1


def _check_int(value: Any, name: str, flag: str, lo: int, hi: int | None = None) -> None:
    """Raise :class:`BadInputError` naming ``name`` (``flag``) unless ``lo <= value <= hi``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadInputError(f"{name} ({flag}) must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise BadInputError(f"{name} ({flag}) must be {rng}, got {value}")


@dataclasses.dataclass
class RunConfig:
    """What :func:`run_pipeline` runs. Every value is checked when the config is
    made (and again by :func:`run_pipeline`), before vLLM is imported:
    :class:`BadInputError` (a ``ValueError``) naming the argument and its flag.

    ``prompt``: non-empty text; ``device``: driver name / alias, ``"auto"``,
    ``""`` (= auto) or ``None`` (``OMNI_BACKENDS_DEVICE``, then auto);
    ``voice``: talker voice id, >= 0 (the upper bound is the talker's
    ``num_voices``, checked against its config); ``max_tokens``: thinker tokens,
    1..THINKER_MAX_MODEL_LEN-1; ``seed``: 0..2**32-1; ``out``: output directory;
    ``model_dir``: demo models (``None``: the cache); ``multiprocess``: one
    process per engine core.
    """

    prompt: str = "Hello! Tell me about omni models."
    device: str | None = None
    voice: int = 0
    max_tokens: int = 32
    seed: int = 0
    out: str = "out"
    model_dir: str | None = None
    #: vLLM's multiprocess engine (an engine-core process per stage); ``None``: the device's default
    #: (:func:`device_defaults`: multiprocess where the driver captures graphs, else in-process)
    multiprocess: bool | None = None
    #: ``enforce_eager``; ``None``: the device's default (:func:`device_defaults`: vLLM's defaults, compilation +
    #: graphs, where the driver captures graphs; else eager). ``True`` is ``--enforce-eager`` (talker MTP eager too).
    enforce_eager: bool | None = None
    #: vLLM's ``compilation_config.cudagraph_mode`` (``GRAPH_MODES``); ``None``: vLLM's default
    graph_mode: str | None = None
    #: ``v1`` / ``v2`` sets ``VLLM_USE_V2_MODEL_RUNNER``; ``auto`` keeps vLLM's choice (or the variable if set)
    runner: str = "auto"
    #: talker frames per code2wav request (the stage graph's chunk schedule; the audio does not depend on it)
    chunk_frames: int = DEFAULT_CHUNK_FRAMES

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Check every value's type and range (no file system, no vLLM); raises :class:`BadInputError`."""
        if not isinstance(self.prompt, str):
            raise BadInputError(f"prompt (--prompt) must be text, got {type(self.prompt).__name__}")
        if not self.prompt.strip():
            raise BadInputError("the prompt is empty; pass some text with --prompt")
        _check_int(self.voice, "voice", "--voice", 0)
        _check_int(self.max_tokens, "max_tokens", "--max-tokens", 1, THINKER_MAX_MODEL_LEN - 1)
        _check_int(self.seed, "seed", "--seed", 0, MAX_SEED)
        if not isinstance(self.out, str) or not self.out.strip():
            raise BadInputError(f"out (--out) must be a directory path, got {self.out!r}")
        if self.model_dir is not None and (not isinstance(self.model_dir, str) or not self.model_dir.strip()):
            raise BadInputError(f"model_dir (--model-dir) must be a directory path or None, got {self.model_dir!r}")
        _check_engine_options(self)
        _check_int(self.chunk_frames, "chunk_frames", "--chunk-frames", 1, TALKER_MAX_MODEL_LEN)


def _check_engine_options(cfg: Any) -> None:
    """The engine options :class:`RunConfig` and :class:`GraphConfig` share; raises :class:`BadInputError`."""
    if cfg.device is not None and not isinstance(cfg.device, str):
        raise BadInputError(f"device (--device) must be a driver name or None, got {cfg.device!r}")
    for name, flag in (("multiprocess", "--multiprocess"), ("enforce_eager", "--enforce-eager")):
        value = getattr(cfg, name)
        if value is not None and not isinstance(value, bool):
            raise BadInputError(f"{name} ({flag}) must be True, False or None (the device's default), "
                                f"got {value!r}")
    if cfg.graph_mode is not None and (not isinstance(cfg.graph_mode, str)
                                       or cfg.graph_mode.strip().upper() not in GRAPH_MODES):
        raise BadInputError(f"graph_mode (--graph-mode) must be one of {', '.join(GRAPH_MODES)} or None, "
                            f"got {cfg.graph_mode!r}")
    if cfg.runner not in RUNNERS:
        raise BadInputError(f"runner (--runner) must be one of {', '.join(RUNNERS)}, got {cfg.runner!r}")


@dataclasses.dataclass
class GraphConfig:
    """What :meth:`core.pipeline.graph.StageGraph.start` starts: the three stages' engines.

    ``model_dir``: the demo models (``None``: the cache, created on first use); ``device``: as
    :class:`RunConfig`'s; ``chunk_frames``: talker frames per code2wav request, 1..TALKER_MAX_MODEL_LEN;
    ``seed``: the engines' seed, 0..2**32-1 (a request's sampling seed is its own,
    :class:`~core.pipeline.graph.SpeechRequest`); ``multiprocess``, ``enforce_eager``, ``graph_mode``,
    ``runner``: as :class:`RunConfig`'s. Checked when made: :class:`BadInputError` naming the field.
    """

    model_dir: str | None = None
    device: str | None = None
    chunk_frames: int = DEFAULT_CHUNK_FRAMES
    seed: int = 0
    multiprocess: bool | None = None
    enforce_eager: bool | None = None
    graph_mode: str | None = None
    runner: str = "auto"
    #: stage -> vLLM ``StatLoggerFactory`` list for that stage's ``AsyncLLM`` (the serve command's per-stage
    #: Prometheus loggers, ``core.serving.metrics``); ``None``: vLLM's stats off, as ``vllm.LLM``'s
    stat_loggers: dict[str, list[Any]] | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Check every value's type and range (no file system, no vLLM); raises :class:`BadInputError`."""
        if self.model_dir is not None and (not isinstance(self.model_dir, str) or not self.model_dir.strip()):
            raise BadInputError(f"model_dir (--model-dir) must be a directory path or None, got {self.model_dir!r}")
        if self.stat_loggers is not None and (not isinstance(self.stat_loggers, dict)
                                              or set(self.stat_loggers) - set(STAGES)):
            raise BadInputError(f"stat_loggers must map stage names ({', '.join(STAGES)}) to vLLM stat logger "
                                f"factories, got {self.stat_loggers!r}")
        _check_int(self.chunk_frames, "chunk_frames", "--chunk-frames", 1, TALKER_MAX_MODEL_LEN)
        _check_int(self.seed, "seed", "--seed", 0, MAX_SEED)
        _check_engine_options(self)

    @classmethod
    def of_run(cls, cfg: RunConfig) -> "GraphConfig":
        """The graph a :class:`RunConfig` runs on (its engine options; its seed also seeds the engines)."""
        return cls(model_dir=cfg.model_dir, device=cfg.device, chunk_frames=cfg.chunk_frames, seed=cfg.seed,
                   multiprocess=cfg.multiprocess, enforce_eager=cfg.enforce_eager, graph_mode=cfg.graph_mode,
                   runner=cfg.runner)


def device_defaults(cfg: Any, backend: Any) -> Any:
    """``cfg`` with the device-dependent ``None`` fields filled, from the driver's
    capabilities: a driver that captures graphs (``static_graph_modes``) gets
    vLLM's defaults for its device (multiprocess engine, compilation + graphs,
    async scheduling where vLLM turns it on); one without (the cpu driver)
    runs in-process and eager, as CI always has -- compilation there buys no
    graphs and costs minutes of torch.compile on a small box."""
    graphs = backend.capabilities().static_graphs
    return dataclasses.replace(
        cfg,
        multiprocess=graphs if cfg.multiprocess is None else cfg.multiprocess,
        enforce_eager=(not graphs) if cfg.enforce_eager is None else cfg.enforce_eager,
    )


def engine_kw(cfg: Any) -> dict[str, Any]:
    """Engine arguments every stage shares for ``cfg`` (a :class:`RunConfig` or :class:`GraphConfig`, after
    :func:`device_defaults`)."""
    kw = dict(ENGINE_KW, seed=cfg.seed)
    if cfg.enforce_eager:
        kw["enforce_eager"] = True
    if cfg.graph_mode is not None:
        kw["compilation_config"] = {"cudagraph_mode": cfg.graph_mode.strip().upper()}
    return kw
