"""What a run of the main job is: :class:`RunConfig` and :class:`GraphConfig`, their checks, the engine
settings every stage shares and the device-dependent defaults. Pipeline-free: a declaration's own request options
live in ``RunConfig.options``, declared and checked by the declaration (``PipelineSpec.options``).

Light: importing it imports neither vLLM nor torch (a bad value fails before either).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core.pipeline.fields import MAX_SEED, check_int
from core.stage import GRAPH_MODES, RUNNERS
from omni_backends.backend import Backend
from omni_backends.errors import BadInputError

#: the most frames one audio-stage chunk may hold (``--chunk-frames``)
MAX_CHUNK_FRAMES = 1024


@dataclasses.dataclass
class RunConfig:
    """What :func:`run_pipeline` runs. Every value is checked when the config is
    made (and again by :func:`run_pipeline`), before vLLM is imported:
    :class:`BadInputError` (a ``ValueError``) naming the argument and its flag.

    ``prompt``: non-empty text; ``device``: driver name / alias, ``"auto"``,
    ``""`` (= auto) or ``None`` (``OMNI_BACKENDS_DEVICE``, then auto);
    ``voice``: an id >= 0 or a name (``None``: the pipeline's default), read by
    the declaration (the demo talker's voice id, a checkpoint's speaker);
    ``seed``: 0..2**32-1; ``out``: output directory; ``model``: a checkpoint
    folder (``--model``; ``None``: the demo); ``model_dir``: demo models
    (``None``: the cache); ``options``: the declaration's own request options
    (``PipelineSpec.options``: name -> value, e.g. the demo's ``max_tokens``, a
    checkpoint's ``language``), each checked by an option of that name some
    declaration declares; ``multiprocess``: one process per engine core.
    """

    prompt: str = "Hello! Tell me about omni models."
    device: str | None = None
    voice: int | str | None = None
    seed: int = 0
    out: str = "out"
    model_dir: str | None = None
    model: str | None = None
    #: the declaration's request options (``--max-tokens``, ``--language``, ...): name -> value
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: per-stage overrides of the pipeline's deploy defaults (``--stage-overrides``; :func:`parse_stage_overrides`)
    stage_overrides: dict[str, dict[str, Any]] | None = None
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
    #: frames per audio-stage request (the stage graph's chunk schedule); ``None``: the declaration's (the demo's
    #: 16, where the audio depends on it only by float rounding; a checkpoint's deploy default)
    chunk_frames: int | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Check every value's type and range (no file system, no vLLM); raises :class:`BadInputError`."""
        if not isinstance(self.prompt, str):
            raise BadInputError(f"prompt (--prompt) must be text, got {type(self.prompt).__name__}")
        if not self.prompt.strip():
            raise BadInputError("the prompt is empty; pass some text with --prompt")
        if self.voice is not None and (not isinstance(self.voice, str) or not self.voice.strip()):
            check_int(self.voice, "voice", "--voice", 0)
        _check_options(self.options)
        check_int(self.seed, "seed", "--seed", 0, MAX_SEED)
        if not isinstance(self.out, str) or not self.out.strip():
            raise BadInputError(f"out (--out) must be a directory path, got {self.out!r}")
        _check_models(self)
        _check_engine_options(self)
        if self.chunk_frames is not None:
            check_int(self.chunk_frames, "chunk_frames", "--chunk-frames", 1, MAX_CHUNK_FRAMES)
        _check_stage_overrides(self.stage_overrides)


def _check_options(options: Any) -> None:
    """``options`` (``RunConfig.options``): a dict of option names some declaration declares
    (:func:`core.pipeline.declarations.request_options`), each value ``None`` or one an option of that name
    accepts (its ``check``; the chosen declaration checks it again for itself). :class:`BadInputError` otherwise."""
    from core.pipeline.declarations import request_options

    if not isinstance(options, dict):
        raise BadInputError(f"options must map request option names to values, got {options!r}"[:300])
    declared = request_options()
    for name, value in options.items():
        if name not in declared:
            raise BadInputError(f"no declared pipeline takes the request option {name!r}; declared: "
                                f"{', '.join(declared)}")
        checks = [opt.check for _, opt in declared[name] if opt.check is not None]
        if value is None or not checks:
            continue
        errors = []
        for check in checks:
            try:
                check(value)
                break
            except BadInputError as exc:
                errors.append(exc)
        else:
            raise errors[0]


def _check_stage_overrides(value: Any) -> None:
    """``None`` or stage (id or name) -> {key -> value}; :class:`BadInputError` otherwise."""
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise BadInputError(f"stage_overrides (--stage-overrides) must map stage ids or names to objects, "
                            f"got {value!r}"[:300])


def parse_stage_overrides(text: str | None) -> dict[str, dict[str, Any]] | None:
    """``--stage-overrides`` as vLLM-Omni's ``serve`` takes it: a JSON object mapping a stage id (``"0"``, ``"1"``,
    in the pipeline's order) or a stage name to that stage's overrides of the deploy defaults -- engine arguments
    (``max_num_seqs``, ``max_model_len``, ``dtype``, ...) and ``default_sampling_params`` (``SamplingParams``
    fields over the stage's default sampling), e.g. ``{"0": {"default_sampling_params": {"temperature": 0}}}``.
    :class:`BadInputError` for text that is not such an object."""
    import json

    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadInputError(f"--stage-overrides is not valid JSON ({exc}); e.g. "
                            "'{\"0\": {\"max_num_seqs\": 8}}'") from exc
    _check_stage_overrides(value)
    return value


def _check_models(cfg: Any) -> None:
    """``model`` (``--model``) and ``model_dir`` (``--model-dir``): each a path or None, not both."""
    for name, flag in (("model", "--model"), ("model_dir", "--model-dir")):
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise BadInputError(f"{name} ({flag}) must be a directory path or None, got {value!r}")
    if cfg.model is not None and cfg.model_dir is not None:
        raise BadInputError("--model (a checkpoint) and --model-dir (the demo models) exclude each other; pass one")


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
    """What :meth:`core.pipeline.graph.StageGraph.start` starts: the engines of the pipeline declared for
    ``model`` (:func:`core.pipeline.declarations.resolve`).

    ``model``: a checkpoint folder (``--model``, e.g. Qwen3-TTS in its released layout; ``None``: the demo);
    ``model_dir``: the demo models (``--model-dir``; ``None``: the cache, created on first use); ``device``: as
    :class:`RunConfig`'s; ``chunk_frames``: frames per audio-stage chunk, 1..MAX_CHUNK_FRAMES (``None``:
    the declaration's; the demo's 16, Qwen3-TTS's deploy default); ``seed``: the engines' seed, 0..2**32-1 (a
    request's sampling seed is its own); ``multiprocess``, ``enforce_eager``, ``graph_mode``,
    ``runner``: as :class:`RunConfig`'s. Checked when made: :class:`BadInputError` naming the field.
    """

    model_dir: str | None = None
    device: str | None = None
    chunk_frames: int | None = None
    model: str | None = None
    seed: int = 0
    multiprocess: bool | None = None
    enforce_eager: bool | None = None
    graph_mode: str | None = None
    runner: str = "auto"
    #: stage -> vLLM ``StatLoggerFactory`` list for that stage's ``AsyncLLM`` (the serve command's per-stage
    #: Prometheus loggers, ``core.serving.metrics``); ``None``: vLLM's stats off, as ``vllm.LLM``'s
    stat_loggers: dict[str, list[Any]] | None = None
    #: stage id (``"0"``...) or name -> overrides of the pipeline's deploy defaults, as vLLM-Omni's
    #: ``--stage-overrides``: engine arguments (merged over the declaration's) and ``default_sampling_params``
    #: (``SamplingParams`` fields over the stage's default sampling; the declaration says which stages take them)
    stage_overrides: dict[str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Check every value's type and range (no file system, no vLLM); raises :class:`BadInputError`."""
        _check_models(self)
        if self.stat_loggers is not None and (not isinstance(self.stat_loggers, dict)
                                              or not all(isinstance(k, str) for k in self.stat_loggers)):
            raise BadInputError(f"stat_loggers must map stage names to vLLM stat logger factories, "
                                f"got {self.stat_loggers!r}")
        if self.chunk_frames is not None:
            check_int(self.chunk_frames, "chunk_frames", "--chunk-frames", 1, MAX_CHUNK_FRAMES)
        check_int(self.seed, "seed", "--seed", 0, MAX_SEED)
        _check_engine_options(self)
        _check_stage_overrides(self.stage_overrides)

    @classmethod
    def of_run(cls, cfg: RunConfig) -> "GraphConfig":
        """The graph a :class:`RunConfig` runs on (its engine options; its seed also seeds the engines)."""
        return cls(model=cfg.model, model_dir=cfg.model_dir, device=cfg.device, chunk_frames=cfg.chunk_frames, seed=cfg.seed,
                   multiprocess=cfg.multiprocess, enforce_eager=cfg.enforce_eager, graph_mode=cfg.graph_mode,
                   runner=cfg.runner, stage_overrides=cfg.stage_overrides)


def device_defaults(cfg: Any, backend: Backend) -> Any:
    """``cfg`` with the device-dependent ``None`` fields filled, from what the engines
    can run: a driver whose graphs vLLM's platform runs
    (:func:`omni_backends.vllm_upstream.engine_static_graph_modes`: the declared
    ``static_graph_modes``, where ``current_platform.support_static_graph_mode()``)
    gets vLLM's defaults for its device (multiprocess engine, compilation + graphs,
    async scheduling where vLLM turns it on); one without (the cpu driver, or a
    driver declaring graphs over vLLM's cpu platform, which forces no graphs)
    runs in-process and eager, as CI always has -- compilation there buys no
    graphs and costs minutes of torch.compile on a small box. Imports vLLM
    only for a driver that declares graphs."""
    from omni_backends.vllm_upstream import engine_static_graph_modes

    graphs = bool(engine_static_graph_modes(backend))
    return dataclasses.replace(
        cfg,
        multiprocess=graphs if cfg.multiprocess is None else cfg.multiprocess,
        enforce_eager=(not graphs) if cfg.enforce_eager is None else cfg.enforce_eager,
    )


def engine_kw(cfg: Any) -> dict[str, Any]:
    """Engine arguments every stage shares for ``cfg`` (a :class:`RunConfig` or :class:`GraphConfig`, after
    :func:`device_defaults`): the seed and the graph options; a stage's own (dtype, lengths) are its
    declaration's (``StageSpec.engine_args``)."""
    kw: dict[str, Any] = {"seed": cfg.seed}
    if cfg.enforce_eager:
        kw["enforce_eager"] = True
    if cfg.graph_mode is not None:
        kw["compilation_config"] = {"cudagraph_mode": cfg.graph_mode.strip().upper()}
    return kw
