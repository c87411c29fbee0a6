"""``run_pipeline``: the main job end to end -- the device, the checks, the three stages, the outputs renamed
into place only when everything succeeded."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from core.pipeline.config import RunConfig, default_model_dir, device_defaults
from core.pipeline.inputs import validate
from core.pipeline.stages import run_stages
from core.stage import check_engine_choices


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def run_pipeline(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the three stages; returns the summary (also written to ``summary.json``).

    Before any engine starts (and before vLLM is imported) it raises
    :class:`BadInputError` (a ``ValueError``) for a bad value of ``cfg`` and the
    registry's errors for an unknown / unusable device; bad model files, an
    unwritable ``out`` and a too-long prompt follow before the first engine.
    A package that raises while being imported (``torch_npu`` without CANN,
    reached through torch's backend autoload or transformers) is
    :class:`~omni_backends.errors.VendorImportError` naming it.
    A stage that fails once running (its engine process died, out of memory,
    the model raised) is :class:`~omni_backends.errors.StageFailedError`
    naming the stage and the cause; then every engine already started is shut
    down and nothing is written to ``out``. Engines are also shut down when
    their stage is done.
    """
    cfg.check()  # values first: before the device, the file system or vLLM
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t_start = time.perf_counter()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the progress lines readable
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries only our result
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from omni_backends.probing import blame_import_failures
    from omni_backends.registry import select

    sel = select(cfg.device)  # cheap: no vendor stack imported yet
    say(f"device: {sel.name} ({sel.rule}): {sel.reason}")
    mp_given = cfg.multiprocess is not None
    cfg = device_defaults(cfg, sel.backend)
    runner = check_engine_choices(cfg, sel.backend)
    if runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    if mp_given:  # explicit: also over an in-process run earlier in this process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.multiprocess else "0"
    else:  # the device's default, unless the user's environment says otherwise
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if cfg.multiprocess else "0")
    with blame_import_failures():
        if cfg.model_dir is None:
            cfg.model_dir = default_model_dir()
            if not os.path.isdir(cfg.model_dir):
                from core.models.create import create_demo_models

                say(f"creating demo models in {cfg.model_dir} (first run)")
                create_demo_models(cfg.model_dir)
        configs = validate(cfg, sel.backend)
        sel.backend.check_vllm_platform()
    out = os.path.abspath(cfg.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".omni-run-", dir=os.path.dirname(out))
    try:
        with blame_import_failures():
            summary = run_stages(cfg, configs, staging, say, sel.backend)
        summary["device"] = {"selected": sel.name, "rule": sel.rule, "reason": sel.reason, "versions": sel.versions}
        summary["total_seconds"] = round(time.perf_counter() - t_start, 3)
        with open(os.path.join(staging, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        if os.path.isdir(out):
            for name in ("out.wav", "thinker.txt", "codes.json", "summary.json"):
                if os.path.exists(os.path.join(out, name)):
                    os.unlink(os.path.join(out, name))
            for name in os.listdir(staging):
                os.replace(os.path.join(staging, name), os.path.join(out, name))
            os.rmdir(staging)
        else:
            os.replace(staging, out)
            os.chmod(out, 0o777 & ~_umask())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary["out_dir"] = out
    return summary
