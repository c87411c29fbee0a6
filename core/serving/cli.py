"""``omni-backends serve``: registered through the ``omni_backends.commands`` entry-point group
(``serve = "core.serving.cli:add_serve_command"``); ``python -m core.serving`` runs the same command."""

from __future__ import annotations

import argparse
from typing import Any

SERVE_HELP = """\
Serve an omni pipeline over HTTP, OpenAI-compatible: its stages start once as
resident vLLM AsyncLLM engines over the core runner and the selected driver,
and every request is pipelined through them (batched by vLLM's schedulers; the
talker's frames reach code2wav in chunks, so audio streams out while the talker
still runs). Which pipeline:

  --model DIR   a Qwen3-TTS checkpoint in the released layout (talker -> code2wav,
                24 kHz), served as vLLM-Omni serves it: POST /v1/audio/speech takes
                vLLM-Omni's request (model, input, voice or speaker = a speaker of
                the checkpoint, language, instructions, task_type, response_format
                wav|pcm, stream, stream_format audio|sse, seed, max_new_tokens,
                speed 1.0); the served name is the folder's (--served-model-name)
  (default)     the demo: thinker -> talker -> code2wav over tiny random models;
                OpenAI's request (model, input, voice-N, response_format wav|pcm,
                speed 1.0, stream, stream_format audio|sse, plus seed, max_tokens)

  POST /v1/audio/speech   a WAV, or PCM / SSE streamed
  GET  /v1/audio/voices   the checkpoint's speakers (the demo: voice-0, voice-1, ...)
  GET  /v1/models         the served model
  GET  /health            200, or 503 once a stage died or while draining
  GET  /metrics           Prometheus: vLLM's per stage, time to first audio, RTF

Example:
  omni-backends serve --port 8000 &
  curl -s localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
       -d '{"model": "omni-demo", "input": "Hello!", "voice": "voice-0"}' -o hello.wav

SIGTERM drains (new requests get 503 while in-flight ones finish) and exits 0; a stage engine that
dies fails its requests with 503 and the server exits with status 3.
"""


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from core.pipeline.config import parse_stage_overrides
    from core.serving.server import ServeConfig, serve

    cfg = ServeConfig(device=args.device, host=args.host, port=args.port, model=args.model, model_dir=args.model_dir,
                      chunk_frames=args.chunk_frames, max_concurrency=args.max_concurrency,
                      model_name=args.served_model_name, drain_timeout=args.drain_timeout,
                      max_body_bytes=args.max_body_bytes,
                      enforce_eager=True if args.enforce_eager else None, graph_mode=args.graph_mode,
                      runner=args.runner, seed=args.seed,
                      stage_overrides=parse_stage_overrides(args.stage_overrides))
    return asyncio.run(serve(cfg))


def add_serve_command(sub: Any) -> None:
    """Add ``serve`` to ``omni-backends``' sub-parsers."""
    from core.serving.request_limits import DEFAULT_MAX_BODY_BYTES
    from omni_backends.cli import add_device_argument

    p = sub.add_parser("serve", help="serve a Qwen3-TTS checkpoint (--model) or the demo: an OpenAI-compatible "
                                     "speech endpoint",
                       description=SERVE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_argument(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0: any free port (default: %(default)s)")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a local checkpoint folder to serve (Qwen3-TTS, released layout: its config.json's "
                        "model_type picks the pipeline); default: the demo")
    p.add_argument("--model-dir", default=None, help="demo models folder (default: created in ~/.cache/omni-backends)")
    p.add_argument("--chunk-frames", type=int, default=None,
                   help="frames per code2wav chunk: smaller = earlier first audio (default: the pipeline's: the "
                        "demo's, a checkpoint's deploy default)")
    p.add_argument("--max-concurrency", type=int, default=32,
                   help="speech requests in flight; more are answered 429 (default: %(default)s)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send and /v1/models lists (default: the --model folder's name; "
                        "omni-demo for the demo)")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="seconds SIGTERM waits for in-flight requests before stopping (default: %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
                   help="request bodies over N bytes are answered 413 and read no further (default: %(default)s)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no compilation, no graphs (vLLM's enforce_eager); default: the device's (as run)")
    p.add_argument("--graph-mode", default=None, metavar="MODE",
                   help="vLLM's CUDAGraphMode for every stage (as run; default: vLLM's)")
    p.add_argument("--runner", choices=("auto", "v1", "v2"), default="auto",
                   help="vLLM model runner (as run; default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the engines' seed (a request's own is 'seed'; default: 0)")
    p.add_argument("--stage-overrides", default=None, metavar="JSON",
                   help="per-stage overrides of the deploy defaults (vLLM-Omni's --stage-overrides): stage id or "
                        "name -> engine arguments and default_sampling_params, e.g. '{\"0\": {\"max_num_seqs\": 8, "
                        "\"default_sampling_params\": {\"temperature\": 0}}}'")
    p.set_defaults(func=_cmd_serve)
