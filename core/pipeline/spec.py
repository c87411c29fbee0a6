"""A pipeline as a declaration: :class:`PipelineSpec` (its stages, how each stage gets its input from the one
before, how its models are read and a request checked) and :class:`StageSpec` (one stage: the runner kind, its
engine arguments, the functions that turn a request / the previous stage's output into the stage's prompt and
``SamplingParams``, and read the stage's ``RequestOutput``).

The stage graph (:mod:`core.pipeline.graph`) runs any declared pipeline and holds no model-specific branch; the
declarations live in :mod:`core.pipeline.declarations` (the demo's thinker -> talker -> code2wav, Qwen3-TTS's
talker -> code2wav). The shape the graph runs, in vLLM-Omni's terms (``StagePipelineConfig``'s
``custom_process_next_stage_input_func`` / ``async_chunk``):

- every stage but the last gets its input by a **full hand-over** (:data:`FULL`): it starts once the stage
  before finished, with that stage's whole output (``StageSpec.output`` of the final ``RequestOutput``);
- the last stage makes the audio. With :data:`CHUNKED` the stage before it streams codec frames
  (``RequestOutputKind.DELTA``; ``StageSpec.output`` returns each delta's new frames, int64 ``[k, Q]``) and every
  chunk of them (:class:`ChunkWindow`: the first chunk after ``first_chunk_frames``, then every
  ``chunk_frames``, the last one shorter) is one request of the last stage, carrying up to
  ``left_context_frames`` earlier frames; of its waveform the chunk's own frames' samples are kept. With
  :data:`FULL` the last stage runs once on every frame.

A declaration also owns what comes in: its speech request (:class:`SpeechApi`: parsing and checking the body of
``POST /v1/audio/speech``, the SSE framing, as vLLM-Omni's ``TTSModelAdapter`` per model) and the options of its
request that ``omni-backends run`` takes (:class:`RequestOption`); serving, the stage graph and the CLI read them
from the declaration and know no pipeline.

Light: importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection

from core.kinds import KINDS
from core.pipeline.fields import SpeechOptions
from omni_backends.errors import BadInputError

#: a stage that starts when the stage before finished, with its whole output
FULL = "full"
#: the last stage, fed the stage before's frames in chunks (:class:`ChunkWindow`) as they are made
CHUNKED = "chunked"
HAND_OVERS = (FULL, CHUNKED)


@dataclasses.dataclass(frozen=True)
class ChunkWindow:
    """How frames stream into the audio stage: the first chunk after ``first_chunk_frames`` frames, then one
    every ``chunk_frames`` (the last one shorter); each chunk request carries up to ``left_context_frames``
    earlier frames (``None``: every earlier frame, for a causal decoder whose output depends on all of them).
    vLLM-Omni's names: ``initial_codec_chunk_frames``, ``codec_chunk_frames``, ``codec_left_context_frames``.
    Checked when made (:class:`BadInputError`: each a positive integer, the context >= 0)."""

    first_chunk_frames: int
    chunk_frames: int
    left_context_frames: int | None = None

    def __post_init__(self) -> None:
        for name in ("first_chunk_frames", "chunk_frames", "left_context_frames"):
            value = getattr(self, name)
            if value is None and name == "left_context_frames":
                continue
            lo = 0 if name == "left_context_frames" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise BadInputError(f"{name} must be an integer >= {lo}, got {value!r}")

    def next_end(self, sent: int, chunks: int) -> int:
        """The frame the next chunk ends at, after ``chunks`` chunks covering frames ``[0, sent)``."""
        return sent + (self.first_chunk_frames if chunks == 0 else self.chunk_frames)

    def context_start(self, start: int) -> int:
        """The first frame a chunk starting at frame ``start`` carries (its left context included)."""
        return 0 if self.left_context_frames is None else max(0, start - self.left_context_frames)


#: a single chunk holding every frame: the audio stage of a :data:`FULL` hand-over
WHOLE = ChunkWindow(first_chunk_frames=2**31 - 1, chunk_frames=2**31 - 1, left_context_frames=None)


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage of a declared pipeline.

    - ``name``: the stage's name (``thinker``, ``talker``, ``code2wav``): its engine, its timings, its request ids;
    - ``kind``: the core runner kind (``core.kinds``: ``ar`` / ``generation``);
    - ``hand_over``: how it gets its input from the stage before (:data:`FULL` / :data:`CHUNKED`; the first
      stage's is :data:`FULL`, from the request);
    - ``engine_args(model, cfg) -> dict``: ``core.stage.make_async_engine``'s arguments for this stage (``model``
      the model folder, ``dtype``, ``max_model_len``, ``max_num_seqs``, ``hf_overrides``, ...), given the
      :class:`PipelineModel` and the graph's config; the graph adds the memory and the shared options;
    - ``inputs(model, req, upstream) -> (prompt, SamplingParams)``: the stage's request for ``req``; ``upstream``
      is ``None`` for the first stage, the stage before's output for :data:`FULL`, the chunk's codes int64
      ``[k, Q]`` (left context included) for :data:`CHUNKED`. The graph sets the output kind;
    - ``output(model, state, out)``: reads a ``RequestOutput``: for a stage handing over in full, its final
      output -> what the next stage's ``inputs`` gets; for a stage streaming frames, each delta -> the new
      frames, int64 ``[k, Q]`` (``k`` may be 0); for the last stage, its final output -> the waveform, float32
      ``[n]``. ``state``: a namespace kept per stage request (e.g. rows seen so far);
    - ``kv_cache``: False for a model without attention layers, hence without a KV cache (vLLM-Omni's
      ``Qwen3TTSCode2Wav``): vLLM's V2 runner runs one from vLLM 0.32 on, so on an older vLLM the pipeline's
      engines run on V1 (``core.pipeline.graph.engines.prepare_environment``).
    """

    name: str
    kind: str
    engine_args: Callable[[Any, Any], dict[str, Any]]
    inputs: Callable[[Any, Any, Any], tuple[Any, Any]]
    output: Callable[[Any, Any, Any], Any]
    hand_over: str = FULL
    kv_cache: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"stage {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.hand_over not in HAND_OVERS:
            raise ValueError(f"stage {self.name}: hand_over must be one of {', '.join(HAND_OVERS)}, "
                             f"got {self.hand_over!r}")


@dataclasses.dataclass
class PipelineModel:
    """What a declaration read from disk before any engine starts (``PipelineSpec.load``): the model folder,
    the audio's sample rate (Hz) and samples per codec frame, the voice names a request may name, the chunk
    window of the audio stage, and ``info``: the declaration's own facts (configs, tokenizer, checkpoint, deploy
    defaults), read by its stage functions.

    ``audio_request_state``: the audio stage's model keeps each request's state across its chunk requests
    (vLLM-Omni's ``async_chunk``: e.g. Qwen3-TTS code2wav's incremental decoder state): every chunk request then
    names the graph's request as its state key (its payload's ``meta.request_id``, vLLM-Omni's field), the
    window carries no left context (the model holds it), and the graph releases the state when the request ends
    (the worker's ``omni_release_request_state``), finished or not."""

    model_dir: str
    sample_rate: int
    samples_per_frame: int
    voices: list[str]
    window: ChunkWindow
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    audio_request_state: bool = False


@dataclasses.dataclass(frozen=True)
class SpeechApi:
    """How a declared pipeline answers ``POST /v1/audio/speech`` (vLLM-Omni's ``TTSModelAdapter``: one per model).

    - ``parse(body, *, model_name, model, request_id) -> SpeechOptions``: the decoded JSON body checked field by
      field (no engine work) into the declaration's request (named ``request_id``, what its ``check`` and the
      graph take) and how the audio leaves (:class:`~core.pipeline.fields.SpeechOptions`); ``model_name``: the
      served name; ``model``: the :class:`PipelineModel` read at start (voices, sample rate). Raises
      :class:`~core.pipeline.fields.FieldError` naming the field (serving's 400;
      :class:`~core.pipeline.fields.UnknownModelError`: 404);
    - ``named_events``: SSE events carry an ``event:`` line naming their type (vLLM-Omni's framing);
    - ``error_event``: the type of the SSE event that ends a failed stream (``error``, vLLM-Omni's
      ``speech.audio.error``).
    """

    parse: Callable[..., SpeechOptions]
    named_events: bool = False
    error_event: str = "error"


@dataclasses.dataclass(frozen=True)
class RequestOption:
    """An option of a declaration's request that ``omni-backends run`` takes: ``--<name>`` (``_`` as ``-``), its
    value in ``RunConfig.options[name]``.

    ``type``: argparse's (``int`` / ``str``); ``help``: the flag's help (say its range); ``check(value)``: raises
    :class:`BadInputError` naming ``name`` (``--flag``) for a bad value (``None``: any value of ``type``);
    ``default``: the value when not given (the declaration's ``request_of_run`` reads it through
    :meth:`value`); ``instead``: the flag another pipeline takes for the same thing (e.g. the demo's
    ``--max-tokens`` for a checkpoint's ``--max-new-tokens``), named when this one is refused."""

    name: str
    help: str
    type: Callable[[str], Any] = str
    check: Callable[[Any], None] | None = None
    default: Any = None
    instead: str | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def value(self, options: dict[str, Any]) -> Any:
        """This option's value in ``options`` (``RunConfig.options``), checked (``check``: :class:`BadInputError`
        naming the flag), else its :attr:`default`."""
        value = options.get(self.name)
        if value is None:
            return self.default
        if self.check is not None:
            self.check(value)
        return value


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """A declared pipeline (see the module doc).

    - ``name``: the declaration's name (``demo``, ``qwen3_tts``; a checkpoint's ``model_type``);
    - ``stages``: in order; only the last may be :data:`CHUNKED`, the first is :data:`FULL`;
    - ``load(cfg, backend, say) -> PipelineModel``: reads and validates the models named by the graph's config
      before any engine starts (:class:`BadInputError` naming the file or value and what to do);
    - ``check(model, req, in_flight)``: refuses a request before any engine work (:class:`BadInputError` naming
      the field); ``in_flight``: the request ids the graph runs now;
    - ``request_of_run(cfg)``: the request ``omni-backends run`` makes of its ``RunConfig`` (``prompt``,
      ``voice``, ``seed`` and its own ``options``: the same request the server makes of the same fields);
      :class:`BadInputError` for an option the pipeline does not take;
    - ``speech``: its ``POST /v1/audio/speech`` request (:class:`SpeechApi`);
    - ``options``: the options of its request ``run`` takes (:class:`RequestOption`, each ``--<name>``);
    - ``text_stage``: the stage whose text ``run`` writes to ``<stage>.txt`` (``None``: no stage makes text);
    - ``served_name``: the model name a server serves without ``--served-model-name`` (``None``: the checkpoint
      folder's name, as vLLM names a local model by its path).
    """

    name: str
    stages: tuple[StageSpec, ...]
    load: Callable[[Any, Any, Callable[[str], None]], PipelineModel]
    check: Callable[[PipelineModel, Any, Collection[str]], None]
    request_of_run: Callable[[Any], Any]
    speech: SpeechApi
    options: tuple[RequestOption, ...] = ()
    text_stage: str | None = None
    served_name: str | None = None

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        if len(self.stages) < 2 or len(set(names)) != len(names):
            raise ValueError(f"pipeline {self.name}: at least two stages with distinct names, got {names}")
        if self.stages[0].hand_over != FULL or any(s.hand_over != FULL for s in self.stages[1:-1]):
            raise ValueError(f"pipeline {self.name}: only the last stage may be fed in chunks")

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    @property
    def producer(self) -> StageSpec:
        """The stage whose frames the audio stage decodes (the one before the last)."""
        return self.stages[-2]

    @property
    def audio(self) -> StageSpec:
        """The last stage: frames -> waveform."""
        return self.stages[-1]

    def window(self, model: PipelineModel) -> ChunkWindow:
        """The audio stage's chunk window: the model's for :data:`CHUNKED`, one whole chunk for :data:`FULL`."""
        return model.window if self.audio.hand_over == CHUNKED else WHOLE
