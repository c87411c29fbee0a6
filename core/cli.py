"""``omni-backends run`` and ``omni-backends demo-model``: commands registered
through the ``omni_backends.commands`` entry-point group."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

RUN_HELP = """\
Run the demo omni pipeline on real vLLM engines through the core runner:
thinker (text -> text + hidden states) -> talker (prompt embeds from the
thinker's hidden states + a voice id -> codec tokens; residual codebooks from
its MTP head) -> code2wav (codes -> waveform).

The three stages are vLLM AsyncLLM engines of one stage graph (the one
`omni-backends serve` serves), started at once; the talker's frames stream to
code2wav in chunks of --chunk-frames (the audio does not depend on the chunk
size). Each stage's engine core runs in a process of its own.

Writes into --out: out.wav (mono 16-bit PCM, 16 kHz), thinker.txt,
codes.json ([T][K] codec tokens) and summary.json (driver and why,
per-stage token counts, engine start and generation times, the run's wall
time against 1.25 x (slowest engine start + generation), peak device memory,
the vLLM settings each engine resolved, talker-MTP mode and graph replays).

On a GPU the engines run with vLLM's defaults for the device (compilation +
graphs, async scheduling), each with a KV cache sized for its model; on cpu
eager, each stage's worker inside its engine-core process. --enforce-eager compares eager. Demo models (tiny, random weights,
fixed seed) are created on first run in ~/.cache/omni-backends unless
--model-dir is given.
"""


def _cmd_run(args: argparse.Namespace) -> int:
    from core.pipeline import RunConfig, run_pipeline

    cfg = RunConfig(prompt=args.prompt, device=args.device, voice=args.voice, max_tokens=args.max_tokens,
                    seed=args.seed, out=args.out, model_dir=args.model_dir, multiprocess=args.multiprocess,
                    enforce_eager=True if args.enforce_eager else None, graph_mode=args.graph_mode, runner=args.runner,
                    chunk_frames=args.chunk_frames)
    summary = run_pipeline(cfg)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        st = summary["stages"]
        print(f"device:   {summary['device']['selected']} ({summary['device']['rule']})")
        print(f"thinker:  {st['thinker']['generated_tokens']} tokens in {st['thinker']['seconds']} s -> {summary['thinker_text']!r}")
        print(f"talker:   {st['talker']['generated_tokens']} frames x {st['talker']['codebooks']} codebooks in {st['talker']['seconds']} s"
              f" (talker MTP: {st['talker']['talker_mtp']})")
        print(f"code2wav: {st['code2wav']['audio_seconds']} s of audio in {st['code2wav']['chunks']} chunks, "
              f"{st['code2wav']['generation_seconds']} s")
        cs = summary["concurrent_start"]
        print(f"engines:  started at once in {cs['graph_start_seconds']} s (one after another: "
              f"{cs['serial_start_seconds']} s); wall {summary['wall_seconds']} s, bound {cs['bound_seconds']} s")
        print(f"wrote {summary['out_dir']}/out.wav, thinker.txt, codes.json, summary.json ({summary['total_seconds']} s total)")
    return 0


def add_run_command(sub: Any) -> None:
    from omni_backends.cli import add_device_argument

    p = sub.add_parser("run", help="run the demo omni pipeline (thinker -> talker -> code2wav)", description=RUN_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_argument(p)
    p.add_argument("--prompt", default="Hello! Tell me about omni models.", help="text for the thinker (default: %(default)r)")
    p.add_argument("--voice", type=int, default=0, help="talker voice id, 0..num_voices-1 (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=32, help="thinker tokens to generate (default: %(default)s)")
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
    p.add_argument("--chunk-frames", type=int, default=16, metavar="N",
                   help="talker frames per code2wav request, 1..1024: audio streams out every N frames; the audio "
                        "itself does not depend on N (default: %(default)s)")
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
