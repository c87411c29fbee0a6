"""Qwen3-TTS through the core: real-time factor, time to first audio, audio seconds per second.

    python bench/bench_qwen3_tts.py [--size tiny|0.6b|1.7b] [--frames 48] [--chunk-frames 25]
                                    [--concurrency 1,8,64] [--reps 3] [--request-seeds none,per-request]
                                    [--device cpu] [--dtype float32]
                                    [--runner auto|v1|v2] [--enforce-eager] [--model-inner-compile]
                                    [--model-dir DIR] [--out DIR]

vLLM-Omni 0.30.0's own, unchanged Qwen3-TTS classes (talker ``Qwen3TTSTalkerForConditionalGeneration``,
its code predictor as the talker MTP; ``Qwen3TTSCode2Wav``) on two engines built by the core's factory
(``core.stage.make_engine``: omni worker + runner + scheduler + output processor on the ``--device``
driver), over a random-weight checkpoint in the released layout at the released shapes
(``core.models.qwen3_tts.checkpoint_writer``; written under ``--work-dir`` unless ``--model-dir`` names one, e.g. a
downloaded checkpoint; its write time is reported). The checkpoint is checked (``core.models.qwen3_tts.read_checkpoint``),
each stage's engine gets what vLLM-Omni's pipeline gives it (``stage_engine_args``: the released architecture mapped
per stage through ``hf_overrides``) and each request is built through vLLM-Omni's own functions (``talker_inputs``).

Every request is a CustomVoice synthesis of the same text with a fixed output length: ``--frames`` codec
frames (``max_new_tokens = frames + 1``, ``ignore_eos``; the talker's sampling otherwise vLLM-Omni's deploy defaults,
``core.models.qwen3_tts.deploy_defaults``: temperature 0.9, top-k 50, repetition penalty 1.05, min tokens 2). ``--request-seeds``: ``none`` (the default: requests as a serving client sends
them, no seed) and/or ``per-request`` (vLLM's ``SamplingParams.seed`` plus vLLM-Omni's ``tts_local_seed``
for the talker MTP, which gives each request its own ``torch.Generator``); each mode measures every
concurrency on the same engines. A call with generators runs the talker MTP's unwrapped head (a captured
graph would freeze one generator's state; ``core.hooks.talker_mtp``), so ``per-request`` shows the eager
MTP's cost; every row reports the talker MTP's mode and the graph replays it made. ``--model-inner-compile``
lets vLLM-Omni's code predictor ``torch.compile`` itself (``OMNI_BACKENDS_MODEL_INNER_COMPILE=1``,
``core.models.vllm_omni``), as on vLLM-Omni's own CUDA platform; the default host answers that it may not.
The talker's frames stream to code2wav in chunks of ``--chunk-frames`` (the first one ``--first-chunk-frames``; each chunk request
carries ``--left-context`` earlier frames and keeps the samples of its own frames; all three default to vLLM-Omni's deploy
config: 25, 1 and 72 = the decoder's window), so the first audio comes while the talker runs. ``--engines``:

- ``async`` (the default on a driver that captures graphs, where ``core.stage.make_async_engine`` exists):
  two ``AsyncLLM`` engines, each engine core in its own process, the talker streaming ``DELTA`` outputs
  and every chunk its own code2wav request decoded while the talker goes on -- the stages overlap on the
  device, as in a pipelined deployment (vLLM-Omni's separate stage processes);
- ``sync`` (the default on cpu): two in-process ``vllm.LLM`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) stepped
  in turn by one loop (code2wav first, so a chunk submitted is decoded before the next talker step); the
  stages do not overlap, so these figures are an upper bound on a pipelined deployment's.

Reported per concurrency ``c`` (``--concurrency``): ``c`` requests submitted at once; ``c = 1`` runs
``--reps`` times one after another (medians). Time to first audio (TTFA) = from a request's submit to
its first code2wav chunk's waveform; RTF = (submit -> last chunk) / audio seconds of that request; audio
seconds per second = all requests' audio seconds / (first submit -> last chunk). Audio seconds are the
waveform samples code2wav returned / its sample rate (the 12 Hz tokenizer: 1920 samples = 80 ms per
frame at the released sizes). Engine start (``make_engine``) per stage and one warm-up request precede
the measurements. V1 / V2: ``--runner`` (``VLLM_USE_V2_MODEL_RUNNER``), refused before any engine starts
where the driver cannot run it. The code2wav engine (no attention, no KV cache) runs on the talker's runner,
except V1 where this vLLM's V2 runner cannot run a model without a KV cache (vLLM 0.26); the report says
which runner each engine had.

Anchors, printed beside and never asserted: vLLM-Omni's published Qwen3-TTS 1.7B figures on an H200 (RTF
0.16, time to first audio packet 64 ms at concurrency 1) and its H100 PR figure (~112 audio-s/s at
concurrency 64). They are its serving path (separate stage processes, shared-memory chunk streaming,
CUDA graphs for code2wav) on the real weights; ours is random weights with a fixed output length.

vLLM-Omni's own runner (``--upstream``, not offered): vllm-omni 0.26.0 exists on PyPI
(``pip download --no-deps vllm-omni==0.26.0``: ``vllm_omni-0.26.0-py3-none-any.whl``, 5.9 MB, with
``deploy/qwen3_tts.yaml`` and the same ``model_executor/models/qwen3_tts`` package), and it is the
release that pairs with the H200's vLLM 0.26. It is not run here because (1) its package ``__init__``
imports ``patch.py``, which replaces vLLM's ``Request`` / ``EngineCoreOutput(s)`` / ``TokensPrompt`` /
``MRotaryEmbedding`` classes process-wide, so it cannot share a process with the core's engines -- the
"same command" comparison needs a second process and a second model stack; (2) its wheel declares 24
runtime requirements (``Requires-Dist``), of which ``diffusers==0.38.0``, ``accelerate==1.12.0``,
``cache-dit``, ``omegaconf``, ``openai-whisper``, ``onnxruntime``, ``fa3-fwd``, ``x-transformers``,
``torchsde``, ``aenum``, ``janus``, ``av`` and ``imageio[ffmpeg]`` are not in the H200 stack
(``tools/gpu-stack/requirements-py312.txt``; ``patch.py`` itself imports ``aenum`` first thing), besides the
``soundfile`` / ``einops`` / ``prettytable`` the qwen3 part already carries (``ci/gpu/README.md``), and the
machine has no network and takes 64 MiB of files per command; (3) vllm-omni 0.26.0 was never run against
this checkpoint layout (sharded, random) nor checked on vLLM 0.26 here. Carrying those wheels in ``.whl/``
and a second process running its ``Omni`` entry point with ``deploy/qwen3_tts.yaml`` is the next step;
until then the ratio to vLLM-Omni's own runner is against the published anchors above.

Prints Markdown; ``--out DIR`` writes ``bench_qwen3_tts.json`` / ``.md``. Bad input (an option out of
range, ``--device`` without its stack, a runner the driver lacks) is one error, exit status 2, before any
checkpoint is written or engine started.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

SIZES = ("tiny", "0.6b", "1.7b")
REQUEST_SEEDS = ("none", "per-request")
DTYPES = ("float32", "bfloat16", "float16")
RUNNERS = ("auto", "v1", "v2")
MAX_CONCURRENCY = 1024
MAX_FRAMES = 4096
TEXT = "Hello world! The quick brown fox jumps over the lazy dog. How are you today?"
#: vLLM-Omni's published figures (never asserted)
ANCHORS = {"rtf_c1": 0.16, "ttfa_ms_c1": 64.0, "audio_s_per_s_c64": 112.0,
           "source": "vLLM-Omni Qwen3-TTS 1.7B: RTF 0.16 and first audio packet 64 ms at concurrency 1 on an H200 "
                     "(published); ~112 audio-s/s at concurrency 64 on an H100 (its PR figure)"}


def _int_list(text: str, option: str, lo: int, hi: int, ap: argparse.ArgumentParser) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"{option} must be comma-separated integers, got {text!r}")
    if not vals or any(v < lo or v > hi for v in vals):
        ap.error(f"{option} values must be in {lo}..{hi}, got {text!r}")
    return vals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Options, range-checked; exits 2 naming the option (argparse's ``error``) before anything starts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=SIZES, help="checkpoint shapes (default %(default)s)")
    ap.add_argument("--frames", type=int, default=48, help=f"codec frames per request, 1..{MAX_FRAMES}")
    ap.add_argument("--chunk-frames", type=int, default=None,
                    help="frames per code2wav chunk, 1..--frames (default: vLLM-Omni's deploy config, at most --frames)")
    ap.add_argument("--first-chunk-frames", type=int, default=None,
                    help="frames of each request's first chunk, 1..--chunk-frames (default: vLLM-Omni's deploy config)")
    ap.add_argument("--left-context", type=int, default=None,
                    help="earlier frames each chunk carries, 0..1024 (default: vLLM-Omni's deploy config, the decoder's "
                         "window)")
    ap.add_argument("--concurrency", default="1,8,64", help=f"comma list, each 1..{MAX_CONCURRENCY}")
    ap.add_argument("--reps", type=int, default=3, help="concurrency-1 requests measured one after another, 1..100")
    ap.add_argument("--request-seeds", default="none",
                    help="comma list of none / per-request: unseeded requests, or each with its own seed for vLLM's "
                         "sampler and the talker MTP (tts_local_seed); each mode measures every concurrency")
    ap.add_argument("--device", default=None, help="driver (default: OMNI_BACKENDS_DEVICE, else auto)")
    ap.add_argument("--dtype", default=None, choices=DTYPES,
                    help="model dtype (default: float32 for tiny, bfloat16 for the real sizes)")
    ap.add_argument("--runner", default="auto", choices=RUNNERS, help="vLLM model runner (VLLM_USE_V2_MODEL_RUNNER)")
    ap.add_argument("--engines", default="auto", choices=("auto", "sync", "async"),
                    help="sync: two in-process vllm.LLM stepped by one loop; async: two AsyncLLM (engine cores in "
                         "their processes, stages overlap); auto: async where core.stage.make_async_engine exists "
                         "and the driver captures graphs (a GPU), else sync")
    ap.add_argument("--enforce-eager", action="store_true", help="no compilation / graphs (cpu: always)")
    ap.add_argument("--model-inner-compile", action="store_true",
                    help="let vLLM-Omni's model code torch.compile its inner modules, e.g. the code predictor "
                         "(sets OMNI_BACKENDS_MODEL_INNER_COMPILE=1 for the engines; default: the environment's)")
    ap.add_argument("--seed", type=int, default=1234, help="checkpoint seed, 0..2**32-1")
    ap.add_argument("--model-dir", default=None, help="an existing checkpoint (default: write one)")
    ap.add_argument("--work-dir", default=None, help="where the checkpoint is written (default: a temp dir)")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", default=None, help="write bench_qwen3_tts.json / .md here")
    args = ap.parse_args(argv)
    args.concurrency = _int_list(args.concurrency, "--concurrency", 1, MAX_CONCURRENCY, ap)
    args.request_seeds = [m.strip() for m in args.request_seeds.split(",") if m.strip()]
    if not args.request_seeds or any(m not in REQUEST_SEEDS for m in args.request_seeds):
        ap.error(f"--request-seeds must be a comma list of {' / '.join(REQUEST_SEEDS)}, got {args.request_seeds!r}")
    if not 1 <= args.frames <= MAX_FRAMES:
        ap.error(f"--frames must be in 1..{MAX_FRAMES}, got {args.frames}")
    from core.models.qwen3_tts import deploy_defaults
    from omni_backends.errors import BadInputError

    try:
        deploy = deploy_defaults()
    except BadInputError as exc:
        ap.error(str(exc))
    if args.chunk_frames is None:
        args.chunk_frames = min(deploy.chunk_frames, args.frames)
    if args.left_context is None:
        args.left_context = deploy.left_context_frames
    if not 1 <= args.chunk_frames <= args.frames:
        ap.error(f"--chunk-frames must be in 1..--frames ({args.frames}), got {args.chunk_frames}")
    if args.first_chunk_frames is None:
        args.first_chunk_frames = min(deploy.initial_chunk_frames, args.chunk_frames)
    if not 1 <= args.first_chunk_frames <= args.chunk_frames:
        ap.error(f"--first-chunk-frames must be in 1..--chunk-frames ({args.chunk_frames}), got {args.first_chunk_frames}")
    if not 0 <= args.left_context <= 1024:
        ap.error(f"--left-context must be in 0..1024, got {args.left_context}")
    if not 1 <= args.reps <= 100:
        ap.error(f"--reps must be in 1..100, got {args.reps}")
    if not 0 <= args.seed <= 2**32 - 1:
        ap.error(f"--seed must be in 0..{2**32 - 1}, got {args.seed}")
    if not args.text.strip():
        ap.error("--text must not be empty")
    if args.model_dir is not None:
        from core.models.qwen3_tts import read_checkpoint

        try:  # a checkpoint in the released layout, checked before anything starts
            read_checkpoint(args.model_dir)
        except BadInputError as exc:
            ap.error(f"--model-dir {args.model_dir}: {exc} (omit --model-dir to write a checkpoint)")
    args.dtype = args.dtype or ("float32" if args.size == "tiny" else "bfloat16")
    args.ap = ap
    return args


def prepare(args: argparse.Namespace):
    """Select the driver and check the runner / graph choices; exit 2 naming the option on failure."""
    from core.models.vllm_omni import INNER_COMPILE_ENV, inner_compile_allowed
    from core.stage import EngineChoices, check_engine_choices, prepare_device
    from omni_backends.errors import OmniBackendError

    if args.model_inner_compile:
        os.environ[INNER_COMPILE_ENV] = "1"
    try:
        args.model_inner_compile = inner_compile_allowed()
    except ValueError as exc:
        args.ap.error(str(exc))
    try:
        sel = prepare_device(args.device)
    except (OmniBackendError, ValueError) as exc:
        args.ap.error(f"--device {args.device or '(auto)'}: {exc}")
    backend = sel.backend
    if not backend.capabilities().static_graphs:
        args.enforce_eager = True  # a driver without graphs runs eager (the cpu driver: vLLM skips warm-up then)
    try:
        check_engine_choices(EngineChoices(runner=args.runner, enforce_eager=args.enforce_eager), backend)
    except ValueError as exc:
        args.ap.error(f"--runner {args.runner}: {exc}")
    if args.runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.runner == "v2" else "0"
    import core.stage

    has_async = hasattr(core.stage, "make_async_engine")
    if args.engines == "async" and not has_async:
        args.ap.error("--engines async: this tree's core.stage has no make_async_engine; use --engines sync")
    if args.engines == "auto":
        args.engines = "async" if has_async and backend.capabilities().static_graphs else "sync"
    return backend


# ------------------------------------------------------------------ engines
def engine_lengths(args: argparse.Namespace, model_dir: str, prompt_len: int) -> tuple[int, int, int]:
    """(talker max_model_len, code2wav max_model_len, codebooks); exits 2 naming the option when a request
    would not fit the checkpoint's ``max_position_embeddings``."""
    with open(os.path.join(model_dir, "config.json")) as f:
        t = json.load(f)["talker_config"]
    q, limit = int(t["num_code_groups"]), int(t["max_position_embeddings"])
    talker_len = -(-(prompt_len + args.frames + 8) // 16) * 16
    c2w_len = q * (args.left_context + args.chunk_frames) + 1  # the chunk's codes + the one output token
    if talker_len > limit:
        args.ap.error(f"--frames {args.frames}: a request needs {prompt_len} prompt + {args.frames + 1} tokens, more "
                      f"than the checkpoint's max_position_embeddings ({limit}); use --frames <= {limit - prompt_len - 8}")
    if c2w_len > limit:
        args.ap.error(f"--chunk-frames {args.chunk_frames} + --left-context {args.left_context}: a code2wav chunk is "
                      f"{c2w_len} tokens ({q} codebooks per frame), more than max_position_embeddings ({limit})")
    return talker_len, c2w_len, q


def start_engines(args: argparse.Namespace, backend, model_dir: str, prompt_len: int) -> tuple[dict, dict, dict]:
    """(talker engine, code2wav engine, info): both through the core's factory -- ``core.stage.make_engine``
    (``vllm.LLM``, ``--engines sync``) or ``core.stage.make_async_engine`` (``AsyncLLM``, ``--engines async``)
    -- each engine start timed."""
    import core.stage
    from omni_backends.engine_memory import engine_memory_kw

    make_engine = core.stage.make_async_engine if args.engines == "async" else core.stage.make_engine

    talker_len, c2w_len, q = engine_lengths(args, model_dir, prompt_len)
    seqs = max(args.concurrency)
    common = dict(dtype=args.dtype, seed=0, enable_prefix_caching=False, skip_tokenizer_init=True)
    if args.enforce_eager:
        common["enforce_eager"] = True
    info = {}
    t0 = time.perf_counter()
    mem = engine_memory_kw(backend, model_dir, max_model_len=talker_len, max_num_seqs=seqs, dtype=args.dtype)
    from core.models.qwen3_tts import deploy_defaults, read_checkpoint, stage_engine_args

    ckpt, deploy = read_checkpoint(model_dir), deploy_defaults()
    stage = stage_engine_args(ckpt, deploy, "talker", dtype=args.dtype, max_num_seqs=seqs, max_model_len=talker_len)
    talker = make_engine(model_dir, device=args.device, hf_overrides=stage["hf_overrides"], max_model_len=talker_len,
                         max_num_seqs=seqs, **common, **mem)
    info["talker_start_s"] = time.perf_counter() - t0
    info["talker_runner"] = "v2" if getattr(talker, "llm_engine", talker).vllm_config.use_v2_model_runner else "v1"
    info["code2wav_runner"] = code2wav_runner(info["talker_runner"])
    t0 = time.perf_counter()
    mem = engine_memory_kw(backend, model_dir, max_model_len=c2w_len, max_num_seqs=seqs, dtype=args.dtype)
    # every scheduled chunk request fits one step whole (a code2wav request is one forward, never chunked)
    stage = stage_engine_args(ckpt, deploy, "code2wav", dtype=args.dtype, max_num_seqs=seqs, max_model_len=c2w_len)
    c2w = make_engine(model_dir, kind=stage["kind"], device=args.device, hf_overrides=stage["hf_overrides"],
                      max_model_len=c2w_len, max_num_seqs=seqs, max_num_batched_tokens=stage["max_num_batched_tokens"],
                      **common, **mem)
    info["code2wav_start_s"] = time.perf_counter() - t0
    info.update(talker_max_model_len=talker_len, code2wav_max_model_len=c2w_len, max_num_seqs=seqs, num_code_groups=q)
    return talker, c2w, info


def code2wav_runner(talker_runner: str) -> str:
    """The runner the code2wav engine gets: the talker's, except V1 where this vLLM's V2 runner cannot run a
    model without a KV cache (vLLM 0.26's block tables assert; ``core.runner.v2.v2_runs_models_without_kv_cache``;
    the omni V2 runner refuses it at engine start). vLLM caches its environment after an engine starts
    (``vllm.envs.enable_envs_cache``) and each engine reads ``VLLM_USE_V2_MODEL_RUNNER`` once, when it is built,
    so the variable is set for the code2wav engine with the cache dropped (``vllm.envs.disable_envs_cache``)."""
    if talker_runner != "v2":
        return talker_runner
    from core.runner.v2 import v2_runs_models_without_kv_cache

    if v2_runs_models_without_kv_cache():
        return "v2"
    import vllm.envs as envs

    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    disable = getattr(envs, "disable_envs_cache", None)
    if disable is not None:
        disable()
    return "v1"


def talker_request(model_dir: str, text: str) -> tuple[dict, int]:
    """The CustomVoice request for ``text`` (the checkpoint's first speaker, English) and its talker prompt length:
    ``({"ckpt", "deploy", "request"}, prompt_len)``, the checkpoint checked (``read_checkpoint``) and the length
    from vLLM-Omni's own estimate (``core.models.qwen3_tts.talker_inputs``)."""
    from core.models.qwen3_tts import TTSRequest, deploy_defaults, read_checkpoint, talker_inputs

    ckpt, deploy = read_checkpoint(model_dir), deploy_defaults()
    req = TTSRequest(text=text, task_type="CustomVoice", speaker=ckpt.speakers[0], language="English",
                     non_streaming_mode=True)
    prompt, _ = talker_inputs(ckpt, deploy, req)
    return {"ckpt": ckpt, "deploy": deploy, "request": req}, len(prompt["prompt_token_ids"])


def talker_params(args: argparse.Namespace, payload: dict, seed: int | None, output_kind):
    """A talker request's ``(prompt, SamplingParams)`` through ``core.models.qwen3_tts.talker_inputs``:
    ``max_new_tokens = frames + 1``, ``ignore_eos``, the deploy's sampling; with ``seed``: vLLM's ``seed`` and
    vLLM-Omni's ``tts_local_seed``."""
    import dataclasses

    from core.models.qwen3_tts import talker_inputs

    req = dataclasses.replace(payload["request"], seed=seed, max_new_tokens=args.frames + 1)
    return talker_inputs(payload["ckpt"], payload["deploy"], req, output_kind=output_kind, ignore_eos=True)


async def talker_mtp_state(talker, engines: str) -> dict:
    """The talker worker's MTP mode and graph counts (``OmniWorkerMixin.omni_state``: ``mtp_mode``,
    ``mtp_graph`` = ``{"sizes", "captured", "replays"}`` or ``None`` when the head runs eager)."""
    states = await talker.collective_rpc("omni_state") if engines == "async" else talker.collective_rpc("omni_state")
    state = states[0]
    return {"mode": state.get("mtp_mode"), "graph": state.get("mtp_graph")}


class Streamer:
    """Runs requests through talker -> code2wav in chunks, both engines stepped by one loop.

    ``run(n)`` submits ``n`` requests at once and returns one record per request: submit / first audio /
    last audio times (``time.perf_counter``), audio samples, sample rate, frames and chunks."""

    def __init__(self, talker, c2w, args: argparse.Namespace, payload: dict, prompt_len: int) -> None:
        self.talker, self.c2w, self.args = talker.llm_engine, c2w.llm_engine, args
        self.payload, self.prompt_len = payload, prompt_len
        self.count = 0

    def _submit_talker(self, rid: str, seed: int | None) -> None:
        from vllm.sampling_params import RequestOutputKind

        prompt, p = talker_params(self.args, self.payload, seed, RequestOutputKind.CUMULATIVE)
        self.talker.add_request(rid, prompt, p)

    def _submit_chunk(self, rec: dict, frames, start: int, end: int) -> None:
        from vllm import SamplingParams

        s0 = max(0, start - self.args.left_context)
        codes = frames[s0:end]  # [k, Q] int
        cid = f"{rec['id']}:c{rec['chunks']}"
        rec["pending"][cid] = (s0, start, end, time.perf_counter())
        rec["chunks"] += 1
        self.c2w.add_request(cid, {"prompt_token_ids": codes.t().reshape(-1).tolist()},
                             SamplingParams(max_tokens=1, detokenize=False))

    def run(self, n: int, seeded: bool = False) -> list[dict]:
        import torch

        recs = {}
        for _ in range(n):
            rid = f"r{self.count}"
            self.count += 1
            recs[rid] = {"id": rid, "submit": time.perf_counter(), "first": None, "last": None, "samples": 0,
                         "sr": None, "frames": 0, "sent": 0, "chunks": 0, "pending": {}, "talker_end": None,
                         "chunk_ms": []}
            self._submit_talker(rid, 1000 + self.count if seeded else None)
        chunk, first = self.args.chunk_frames, self.args.first_chunk_frames
        while self.talker.has_unfinished_requests() or self.c2w.has_unfinished_requests():
            if self.c2w.has_unfinished_requests():
                for out in self.c2w.step():
                    if not out.finished:
                        continue
                    rid = out.request_id.split(":", 1)[0]
                    rec = recs[rid]
                    s0, start, end, t_sub = rec["pending"].pop(out.request_id)
                    wav = out.multimodal_outputs["model_outputs"].reshape(-1)
                    per_frame = wav.shape[0] // max(1, end - s0)
                    rec["samples"] += per_frame * (end - start)
                    rec["sr"] = int(out.multimodal_outputs["sr"].reshape(-1)[0])
                    now = time.perf_counter()
                    rec["chunk_ms"].append((now - t_sub) * 1e3)
                    rec["first"] = rec["first"] or now
                    rec["last"] = now
                    if not bool(torch.isfinite(wav).all()):
                        raise RuntimeError(f"code2wav returned a non-finite waveform for {out.request_id}")
            if self.talker.has_unfinished_requests():
                for out in self.talker.step():
                    rec = recs[out.request_id]
                    rows = out.multimodal_outputs.get("codes.audio")
                    frames = rows[self.prompt_len:] if rows is not None else None
                    have = 0 if frames is None else int(frames.shape[0])
                    rec["frames"] = have
                    while (have - rec["sent"] >= (first if rec["chunks"] == 0 else chunk)
                           or (out.finished and have > rec["sent"])):
                        end = min(have, rec["sent"] + (first if rec["chunks"] == 0 else chunk))
                        self._submit_chunk(rec, frames, rec["sent"], end)
                        rec["sent"] = end
                    if out.finished:
                        rec["talker_end"] = time.perf_counter()
        for rec in recs.values():
            if rec["first"] is None or rec["frames"] != self.args.frames:
                raise RuntimeError(f"request {rec['id']}: {rec['frames']} frames of {self.args.frames}, "
                                   f"first audio {rec['first']}")
            rec.pop("pending")
        return list(recs.values())


class AsyncStreamer:
    """:class:`Streamer` over two ``AsyncLLM`` engines (``core.stage.make_async_engine``): each engine core
    runs in its own process, so talker steps and code2wav chunks overlap on the device, as in a pipelined
    deployment. The talker streams ``RequestOutputKind.DELTA`` outputs (the rows since the previous one;
    vLLM merges what a slow consumer has not taken); each chunk is its own code2wav request, decoded while
    the talker goes on. Records as :meth:`Streamer.run`; ``first`` is the first chunk's, ``last`` the latest."""

    def __init__(self, talker, c2w, args: argparse.Namespace, payload: dict, prompt_len: int) -> None:
        self.talker, self.c2w, self.args = talker, c2w, args
        self.payload, self.prompt_len = payload, prompt_len
        self.count = 0

    async def _chunk(self, rec: dict, codes, index: int, s0: int, start: int, end: int) -> None:
        import torch
        from vllm import SamplingParams

        last, t_sub = None, time.perf_counter()
        async for out in self.c2w.generate({"prompt_token_ids": codes[s0:end].t().reshape(-1).tolist()},
                                           SamplingParams(max_tokens=1, detokenize=False), f"{rec['id']}:c{index}"):
            last = out
        now = time.perf_counter()
        rec["chunk_ms"].append((now - t_sub) * 1e3)
        wav = last.multimodal_outputs["model_outputs"].reshape(-1)
        if not bool(torch.isfinite(wav).all()):
            raise RuntimeError(f"code2wav returned a non-finite waveform for {rec['id']} chunk {index}")
        rec["samples"] += wav.shape[0] // max(1, end - s0) * (end - start)
        rec["sr"] = int(last.multimodal_outputs["sr"].reshape(-1)[0])
        if index == 0:
            rec["first"] = now
        rec["last"] = max(rec["last"] or now, now)

    async def _one(self, seed: int | None) -> dict:
        import asyncio

        import torch
        from vllm.sampling_params import RequestOutputKind

        rid = f"r{self.count}"
        self.count += 1
        rec = {"id": rid, "submit": time.perf_counter(), "first": None, "last": None, "samples": 0, "sr": None,
               "frames": 0, "chunks": 0, "talker_end": None, "chunk_ms": []}
        prompt, p = talker_params(self.args, self.payload, seed, RequestOutputKind.DELTA)
        rows, n_rows, sent, tasks = [], 0, 0, []
        chunk, first = self.args.chunk_frames, self.args.first_chunk_frames
        async for out in self.talker.generate(prompt, p, rid):
            new = (out.multimodal_outputs or {}).get("codes.audio")
            if new is not None and new.numel():
                rows.append(new)
                n_rows += int(new.shape[0])
            have = max(0, n_rows - self.prompt_len)
            while have - sent >= (first if rec["chunks"] == 0 else chunk) or (out.finished and have > sent):
                rows = [torch.cat(rows)]
                frames = rows[0][self.prompt_len:]
                end = min(have, sent + (first if rec["chunks"] == 0 else chunk))
                tasks.append(asyncio.ensure_future(self._chunk(rec, frames, rec["chunks"],
                                                               max(0, sent - self.args.left_context), sent, end)))
                rec["chunks"] += 1
                sent = end
        rec["talker_end"] = time.perf_counter()
        rec["frames"] = n_rows - self.prompt_len
        await asyncio.gather(*tasks)
        if rec["first"] is None or rec["frames"] != self.args.frames:
            raise RuntimeError(f"request {rid}: {rec['frames']} frames of {self.args.frames}, first audio {rec['first']}")
        return rec

    async def run(self, n: int, seeded: bool = False) -> list[dict]:
        import asyncio

        return list(await asyncio.gather(*(self._one(1000 + self.count + i if seeded else None) for i in range(n))))


# ------------------------------------------------------------------ measure
def summarize(c: int, recs: list[dict]) -> dict:
    audio = [r["samples"] / r["sr"] for r in recs]
    first_submit = min(r["submit"] for r in recs)
    last = max(r["last"] for r in recs)
    row = {"concurrency": c, "requests": len(recs), "frames": recs[0]["frames"], "chunks": recs[0]["chunks"],
           "audio_s_per_request": statistics.median(audio), "wall_s": last - first_submit,
           "audio_s_per_s": sum(audio) / (last - first_submit),
           "ttfa_ms": statistics.median((r["first"] - r["submit"]) * 1e3 for r in recs),
           "rtf": statistics.median((r["last"] - r["submit"]) / a for r, a in zip(recs, audio)),
           # where the time goes: the talker's frames, each code2wav chunk (submit to waveform), after the talker
           "talker_ms_per_frame": statistics.median((r["talker_end"] - r["submit"]) * 1e3 / max(1, r["frames"])
                                                    for r in recs),
           "code2wav_ms_per_chunk": statistics.median(ms for r in recs for ms in r["chunk_ms"]),
           "after_talker_ms": statistics.median(max(0.0, r["last"] - r["talker_end"]) * 1e3 for r in recs)}
    return row


async def measure(args: argparse.Namespace, res: dict, talker, c2w, payload: dict, prompt_len: int) -> None:
    """One warm-up request, then each concurrency (``res["rows"]``), in one event loop (an ``AsyncLLM`` stays
    bound to the loop of its first request)."""
    if args.engines == "async":
        run_n = AsyncStreamer(talker, c2w, args, payload, prompt_len).run
    else:
        streamer = Streamer(talker, c2w, args, payload, prompt_len)

        async def run_n(n: int, seeded: bool = False) -> list[dict]:
            return streamer.run(n, seeded)

    t0 = time.perf_counter()
    await run_n(1)  # warm-up
    res["info"]["warmup_s"] = time.perf_counter() - t0
    for mode in args.request_seeds:
        seeded = mode == "per-request"
        for c in args.concurrency:
            print(f"[bench] request seeds {mode}, concurrency {c} ...", file=sys.stderr, flush=True)
            before = await talker_mtp_state(talker, args.engines)
            if c == 1:
                recs = [r for _ in range(args.reps) for r in await run_n(1, seeded)]
                row = summarize(1, recs)
                row["audio_s_per_s"] = statistics.median(r["samples"] / r["sr"] / (r["last"] - r["submit"])
                                                         for r in recs)
            else:
                row = summarize(c, await run_n(c, seeded))
            after = await talker_mtp_state(talker, args.engines)
            row["request_seeds"] = mode
            row["talker_mtp"] = after["mode"]
            row["mtp_graph_replays"] = (after["graph"]["replays"] - before["graph"]["replays"]
                                        if after["graph"] and before["graph"] else None)
            res["rows"].append(row)
            print(f"[bench] {json.dumps(row)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict:
    import torch

    from core.models.qwen3_tts.checkpoint_writer import checkpoint_info, size_spec, write_qwen3_tts

    if args.model_dir is None and args.frames + 64 > size_spec(args.size).max_position_embeddings:
        args.ap.error(f"--frames {args.frames}: {args.size} checkpoints hold {size_spec(args.size).max_position_embeddings}"
                      " positions (prompt included)")
    backend = prepare(args)
    res: dict = {"info": {}, "rows": [], "anchors": ANCHORS}
    model_dir = args.model_dir
    if model_dir is None:
        work = args.work_dir or tempfile.mkdtemp(prefix="bench-qwen3-tts-")
        model_dir = os.path.join(work, f"qwen3-tts-{args.size}")
        t0 = time.perf_counter()
        write_qwen3_tts(model_dir, args.size, seed=args.seed, backend=backend,
                        progress=lambda line: print(f"[checkpoint] {line}", file=sys.stderr, flush=True))
        res["info"]["checkpoint_write_s"] = time.perf_counter() - t0
    payload, prompt_len = talker_request(model_dir, args.text)
    talker, c2w, einfo = start_engines(args, backend, model_dir, prompt_len)
    res["info"].update(einfo)
    import asyncio

    try:
        asyncio.run(measure(args, res, talker, c2w, payload, prompt_len))
    finally:
        for engine in (talker, c2w):
            if args.engines == "async":
                engine.shutdown()
    res["info"].update(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), size=args.size,
        checkpoint=checkpoint_info(model_dir), model_dir=model_dir, device=backend.name, dtype=args.dtype,
        runner=args.runner, engines=args.engines, enforce_eager=args.enforce_eager,
        model_inner_compile=args.model_inner_compile,
        frames=args.frames, chunk_frames=args.chunk_frames, first_chunk_frames=args.first_chunk_frames,
        left_context=args.left_context, reps=args.reps, request_seeds=args.request_seeds,
        prompt_len=prompt_len, torch=torch.__version__, host=platform.node(),
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    import vllm

    res["info"]["vllm"] = vllm.__version__
    return res


def render(res: dict) -> str:
    i = res["info"]
    a = res["anchors"]
    lines = [f"Qwen3-TTS {i['size']} (random weights, {i['frames']} frames/request, first chunk "
             f"{i['first_chunk_frames']} frames, then chunks of {i['chunk_frames']} + "
             f"{i['left_context']} context) through the core on {i['device']} {i['dtype']}, talker on "
             f"{i['talker_runner']}, code2wav on {i['code2wav_runner']} (--runner {i['runner']}), {i['engines']} engines, enforce_eager={i['enforce_eager']}, "
             f"model inner compile={i.get('model_inner_compile', False)}, vLLM {i['vllm']}, "
             f"torch {i['torch']}, {i['date']}",
             "",
             f"engine start: talker {i['talker_start_s']:.1f} s, code2wav {i['code2wav_start_s']:.1f} s"
             + (f"; checkpoint written in {i['checkpoint_write_s']:.1f} s" if "checkpoint_write_s" in i else ""),
             "",
             "| request seeds | concurrency | requests | audio s / request | TTFA ms (median) | RTF (median) | audio-s/s "
             "| wall s | talker MTP (graph replays) | anchor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        anchor = (f"RTF {a['rtf_c1']}, TTFA {a['ttfa_ms_c1']:.0f} ms (H200)" if r["concurrency"] == 1 else
                  f"~{a['audio_s_per_s_c64']:.0f} audio-s/s (H100)" if r["concurrency"] == 64 else "")
        mtp = r.get("talker_mtp") or "-"
        if r.get("mtp_graph_replays") is not None:
            mtp += f" ({r['mtp_graph_replays']})"
        lines.append(f"| {r.get('request_seeds', 'per-request')} | {r['concurrency']} | {r['requests']} | "
                     f"{r['audio_s_per_request']:.3f} | {r['ttfa_ms']:.1f} | {r['rtf']:.3f} | {r['audio_s_per_s']:.2f} | "
                     f"{r['wall_s']:.2f} | {mtp} | {anchor} |")
    lines += ["", "where the time goes (medians): the talker per frame (submit to its last frame / frames), one "
              "code2wav chunk (submit to waveform), the last audio after the talker finished", "",
              "| request seeds | concurrency | talker ms / frame | code2wav ms / chunk | after the talker ms |",
              "|---|---|---|---|---|"]
    lines += [f"| {r.get('request_seeds', 'per-request')} | {r['concurrency']} | {r['talker_ms_per_frame']:.2f} | "
              f"{r['code2wav_ms_per_chunk']:.1f} | {r['after_talker_ms']:.1f} |" for r in res["rows"]
              if "talker_ms_per_frame" in r]
    lines += ["", f"anchors (never asserted): {a['source']}"]
    return "\n".join(lines)


def _finite(obj) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    text = render(res)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_qwen3_tts.json"), "w") as f:
            json.dump({**res, "argv": sys.argv[1:] if argv is None else argv}, f, indent=2)
        with open(os.path.join(args.out, "bench_qwen3_tts.md"), "w") as f:
            f.write(text + "\n")
    from record import write_record

    write_record(__file__, res, device=args.device, argv=argv)
    return 0 if _finite(res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
