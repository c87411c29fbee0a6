"""``omni-backends run`` and ``omni-backends demo-model``: commands registered
through the ``omni_backends.commands`` entry-point group."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

RUN_HELP = """\
Run an omni pipeline on real vLLM engines through the core runner: a local
checkpoint (--model DIR: Qwen3-TTS in its released layout, talker ->
code2wav, the same request as `omni-backends serve --model DIR` answers:
--prompt, --voice SPEAKER, --language, --instructions, --task-type, --seed;
writes out.wav at 24 kHz), or by default the demo pipeline:
thinker (text -> text + hidden states) -> talker (prompt embeds from the
thinker's hidden states + a voice id -> codec tokens; residual codebooks from
its MTP head) -> code2wav (codes -> waveform).

The three stages are vLLM AsyncLLM engines of one stage graph (the one
`omni-backends serve` serves), started at once; the talker's frames stream to
code2wav in chunks of --chunk-frames (the audio depends on the chunk size only
by float rounding). Each stage's engine core runs in a process of its own.

Writes into --out: out.wav (mono 16-bit PCM, 16 kHz), thinker.txt,
codes.json ([T][K] codec tokens) and summary.json (driver and why,
per-stage token counts, engine start and generation times, the run's wall
time against 1.25 x (slowest engine start + generation), peak device memory,
the vLLM settings each engine resolved, talker-MTP mode and graph replays).

On a GPU the engines run with vLLM's defaults for the device (compilation +
graphs, async scheduling), each with a KV cache sized for its model; on cpu
eager, each stage's worker inside its engine-core process. --enforce-eager
runs eager on a GPU too, for comparison.

Demo models (tiny, random weights, fixed seed; the audio is loud noise, not
speech) are created on the first run in a demo-v* folder of
$OMNI_BACKENDS_CACHE (default ~/.cache/omni-backends) unless --model-dir is
given.
Ranges: --seed 0..2**32-1, --chunk-frames 1..{chunk_frames}; a pipeline's own
request options (each declared by its pipeline) say theirs below.
"""


def refuse_other_pipelines_options(args: argparse.Namespace) -> None:
    """Refuse a request option the chosen pipeline would not read (so it is never silently ignored), before any
    model file is read: each option is declared by the pipelines that read it
    (:func:`core.pipeline.declarations.request_options`); with ``--model`` (a checkpoint) one only the default
    pipeline (the demo) reads, without it one the default pipeline does not read. Raises
    :class:`~omni_backends.errors.BadInputError` (exit 2) naming the option and the one to use (its declared
    ``instead``). The chosen declaration's ``request_of_run`` refuses the rest (e.g. a speaker name as the
    demo's ``--voice``)."""
    from core.pipeline.declarations import DEFAULT, request_options
    from omni_backends.errors import BadInputError

    checkpoint = args.model is not None
    for name, readers in request_options().items():
        if getattr(args, name, None) is None:
            continue
        pipelines = {pipeline for pipeline, _ in readers}
        flag = readers[0][1].flag
        instead = next((option.instead for _, option in readers if option.instead), None)
        if checkpoint and pipelines == {DEFAULT}:
            raise BadInputError(f"{flag} is the {DEFAULT} pipeline's option; a checkpoint (--model) takes "
                                + (instead or "no such option"))
        if not checkpoint and DEFAULT not in pipelines:
            raise BadInputError(f"{flag} is a checkpoint's request option: it needs --model DIR"
                                + (f" (the {DEFAULT}'s is {instead})" if instead else ""))


def _voice(text: str | None) -> int | str | None:
    """``--voice``: an id (a number) as an int, a name as given (the declaration reads either)."""
    try:
        return None if text is None else int(text)
    except ValueError:
        return text


def _cmd_run(args: argparse.Namespace) -> int:
    from core.pipeline import RunConfig, run_pipeline
    from core.pipeline.config import parse_stage_overrides
    from core.pipeline.declarations import request_options

    refuse_other_pipelines_options(args)
    options = {name: getattr(args, name) for name in request_options() if getattr(args, name, None) is not None}
    cfg = RunConfig(prompt=args.prompt, device=args.device, voice=_voice(args.voice), options=options,
                    seed=args.seed, out=args.out, model=args.model, model_dir=args.model_dir,
                    stage_overrides=parse_stage_overrides(args.stage_overrides),
                    multiprocess=args.multiprocess,
                    enforce_eager=True if args.enforce_eager else None, graph_mode=args.graph_mode, runner=args.runner,
                    chunk_frames=args.chunk_frames)
    summary = run_pipeline(cfg)
    from omni_backends.cli import print_result

    print_result(json.dumps(summary, indent=2) if args.json else "\n".join(run_result_lines(summary)))
    return 0


def run_result_lines(summary: dict[str, Any]) -> list[str]:
    """The lines ``omni-backends run`` prints from its ``summary`` (``core.pipeline.run_pipeline``'s): per
    stage the generation time (engine start apart), the concurrent start against its goal, what was written."""
    stages = list(summary["stages"].items())
    cs = summary["concurrent_start"]
    lines = [f"device:   {summary['device']['selected']} ({summary['device']['rule']})"]
    for i, (name, st) in enumerate(stages):
        start = f"engine start {st['engine_start_seconds']:.1f} s"
        if i == len(stages) - 1:
            what = f"{st['audio_seconds']} s of audio in {st['chunks']} chunks, {st['generation_seconds']:.3f} s ({start})"
        elif i == len(stages) - 2:
            what = (f"{st['generated_tokens']} frames x {st['codebooks']} codebooks in {st['generation_seconds']:.3f} s "
                    f"({start}; talker MTP: {st['talker_mtp']})")
        else:
            what = (f"{st.get('generated_tokens', '?')} tokens in {st['generation_seconds']:.3f} s ({start})"
                    + (f" -> {summary['text']!r}" if i == 0 else ""))
        lines.append(f"{name + ':':<9} {what}")
    written = ", ".join(["out.wav", *sorted(n for n in summary.get("written", []) if n != "out.wav")])
    lines += [
        f"engines:  started at once in {cs['graph_start_seconds']:.1f} s (the {len(stages)} starts add up to "
        f"{cs['serial_start_seconds']:.1f} s); wall {summary['wall_seconds']:.1f} s, "
        f"{'within' if cs['within_bound'] else 'over'} the goal of {cs['factor']} x (slowest start + generation) = "
        f"{cs['bound_seconds']:.1f} s",
        f"wrote {summary['out_dir']}/{written} ({summary['total_seconds']} s total)",
    ]
    return lines


def add_run_command(sub: Any) -> None:
    from omni_backends.cli import add_device_argument

    from core.pipeline.config import MAX_CHUNK_FRAMES
    from core.pipeline.declarations import request_options

    description = RUN_HELP.format(chunk_frames=MAX_CHUNK_FRAMES)
    p = sub.add_parser("run", help="run an omni pipeline: a checkpoint (--model) or the demo", description=description,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_argument(p)
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a local checkpoint folder (Qwen3-TTS, released layout); default: the demo pipeline")
    p.add_argument("--prompt", default="Hello! Tell me about omni models.",
                   help="the text (the demo: for the thinker; default: %(default)r)")
    p.add_argument("--voice", default=None,
                   help="with --model: a speaker of the checkpoint (CustomVoice default: its first); the demo: a "
                        "talker voice id, 0..num_voices-1 (default: 0)")
    for readers in request_options().values():  # each pipeline's own request options, as it declares them
        option = readers[0][1]
        p.add_argument(option.flag, type=option.type, default=None, metavar=option.metavar, help=option.help)
    p.add_argument("--stage-overrides", default=None, metavar="JSON",
                   help="per-stage overrides of the deploy defaults, as serve's (vLLM-Omni's --stage-overrides), "
                        "e.g. '{\"0\": {\"default_sampling_params\": {\"temperature\": 0}}}'")
    p.add_argument("--seed", type=int, default=0, help="sampling seed; same seed -> identical out.wav (default: %(default)s)")
    p.add_argument("--out", default="out", help="output directory (default: %(default)s)")
    p.add_argument("--model-dir", default=None, help="demo models folder (default: created in ~/.cache/omni-backends)")
    p.add_argument("--multiprocess", action=argparse.BooleanOptionalAction, default=None,
                   help="run each stage's worker in a process of its own, under its engine core (vLLM's mp "
                        "executor; VLLM_ENABLE_V1_MULTIPROCESSING); the engine cores themselves always run in "
                        "their own processes (vLLM's AsyncLLM). Default: vLLM's default on a GPU; off on cpu "
                        "(the worker inside the engine-core process, faster to start)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no compilation, no graphs (vLLM's enforce_eager; the talker MTP runs eager too), for "
                        "comparison; default: eager on cpu, vLLM's defaults (compilation + graphs) on a GPU")
    p.add_argument("--graph-mode", default=None, metavar="MODE",
                   help="vLLM's CUDAGraphMode for every stage: NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, "
                        "FULL_AND_PIECEWISE (must be one the driver supports; default: vLLM's)")
    p.add_argument("--runner", choices=("auto", "v1", "v2"), default="auto",
                   help="vLLM model runner: v1, v2 (sets VLLM_USE_V2_MODEL_RUNNER) or auto, vLLM's choice "
                        "(default: %(default)s)")
    p.add_argument("--chunk-frames", type=int, default=None, metavar="N",
                   help=f"frames per code2wav request, 1..{MAX_CHUNK_FRAMES}: audio streams out every N frames; the "
                        "demo's audio depends on N only by float rounding (default: the pipeline's: the demo's, a "
                        "checkpoint's deploy default)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_run)


def _cmd_demo_create(args: argparse.Namespace) -> int:
    from core.models.create import create_demo_models

    try:
        paths = create_demo_models(args.dir, seed=args.seed)
    except OSError as exc:
        from omni_backends.errors import BadInputError

        raise BadInputError(f"cannot write demo models to {args.dir}: {exc.strerror or exc}") from exc
    for stage, path in paths.items():
        print(f"{stage:<9} {path}")
    return 0


def add_demo_model_command(sub: Any) -> None:
    p = sub.add_parser("demo-model", help="create the tiny demo omni models",
                       description="Create the demo thinker, talker and code2wav models (random weights, fixed seed, "
                       "real safetensors + config + a locally trained tokenizer).")
    dsub = p.add_subparsers(dest="demo_command", metavar="ACTION", required=True)
    c = dsub.add_parser("create", help="write thinker/, talker/, code2wav/ into DIR")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("--seed", type=int, default=1234, help="weight seed (default: %(default)s)")
    c.set_defaults(func=_cmd_demo_create)


if __name__ == "__main__":  # pragma: no cover
    from omni_backends.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
