"""Engine-tier check, one side per process: run the demo thinker for a few steps
on stock vLLM or through the omni runner, and write tokens + logprobs as JSON.

    python -m omni_backends.testing.engine_check --device NAME --model DIR --side stock|omni --out F.json \
        [--graph-mode NONE|FULL|PIECEWISE|...]

``--side omni`` builds ``vllm.LLM`` with the omni worker and scheduler
(``--worker-cls`` / ``--scheduler-cls``, by default the core's
``core.worker.OmniARWorker`` and ``core.engine.OmniScheduler``, handed to vLLM
as class paths: this package never imports the core), which build the omni
runner over ``backend.model_runner_base()``; the runner class hierarchy each
rank built is recorded. ``--side stock`` runs the same checkpoint as vLLM's
plain ``LlamaForCausalLM`` (``hf_overrides``). Both sides select the driver
first (``omni_backends.registry.select``) so vLLM resolves its platform.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

OMNI_WORKER_CLS = "core.worker.OmniARWorker"
OMNI_SCHEDULER_CLS = "core.engine.OmniScheduler"
PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog", "Omni models hear, think and speak."]
MAX_TOKENS = [6, 4, 8]


def _params():
    from vllm import SamplingParams

    greedy = [SamplingParams(max_tokens=m, temperature=0.0, logprobs=2) for m in MAX_TOKENS]
    seeded = [SamplingParams(max_tokens=m, temperature=0.9, top_p=0.9, top_k=40, seed=7 + i, logprobs=2)
              for i, m in enumerate(MAX_TOKENS)]
    return PROMPTS + PROMPTS, greedy + seeded


def run(device: str, model: str, side: str, worker_cls: str, scheduler_cls: str, graph_mode: str = "NONE") -> dict:
    """Generate the fixed batch on ``side``; returns a JSON-able dict. ``graph_mode``: ``NONE`` (eager,
    ``enforce_eager``) or a ``CUDAGraphMode`` name the driver declares (compilation and graphs, vLLM's
    ``compilation_config.cudagraph_mode``); the mode vLLM resolved is recorded. Where vLLM's platform runs no
    static graphs (:func:`omni_backends.vllm_upstream.engine_static_graph_modes`) no engine starts: the
    result has ``skipped`` with the reason."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from omni_backends.registry import select

    sel = select(device)
    sel.backend.check_vllm_platform()
    graph_mode = graph_mode.strip().upper()
    if graph_mode != "NONE":
        from omni_backends.vllm_upstream import engine_static_graph_modes

        declared = tuple(sel.backend.capabilities().static_graph_modes)
        if graph_mode not in declared:
            raise SystemExit(f"--graph-mode {graph_mode}: driver {sel.name!r} declares {list(declared) or 'none'}")
        if not engine_static_graph_modes(sel.backend):
            from vllm.platforms import current_platform

            return {"side": side, "driver": sel.name, "graph_mode": graph_mode, "skipped": (
                f"driver {sel.name!r} declares static graph modes {list(declared)}, but vLLM's platform "
                f"{type(current_platform).__name__} (device type {current_platform.device_type!r}) runs none "
                "(support_static_graph_mode() is False): vLLM resolves cudagraph_mode NONE, so an engine in "
                f"{graph_mode} would run eager; the driver's graph wrapping is checked in the device tier")}
    from omni_backends.engine_lifetime import own_engines

    own_engines()  # the engine's processes end with this one, however it dies
    from vllm import LLM

    from omni_backends.engine_memory import engine_memory_kw

    kw = dict(dtype="float32", enforce_eager=graph_mode == "NONE", max_model_len=256, max_num_seqs=8, seed=0)
    if graph_mode != "NONE":
        kw["compilation_config"] = {"cudagraph_mode": graph_mode}
    # sized for the model, not vLLM's 0.9 of the card: other engines may share the device (issue 21)
    kw.update(engine_memory_kw(sel.backend, model, max_model_len=256, max_num_seqs=8, dtype="float32"))
    if side == "omni":
        llm = LLM(model, worker_cls=worker_cls, scheduler_cls=scheduler_cls, **kw)
    elif side == "stock":
        llm = LLM(model, hf_overrides={"architectures": ["LlamaForCausalLM"]}, **kw)
    else:
        raise SystemExit(f"--side must be stock or omni, got {side!r}")
    prompts, params = _params()
    outs = llm.generate(prompts, params, use_tqdm=False)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    resolved = getattr(getattr(config, "compilation_config", None), "cudagraph_mode", None)
    result = {
        "side": side,
        "driver": sel.name,
        "graph_mode": graph_mode,
        "resolved_cudagraph_mode": getattr(resolved, "name", str(resolved)),
        "model_runner_base": sel.backend.model_runner_base().__name__,
        "outputs": [
            {
                "token_ids": list(o.outputs[0].token_ids),
                "logprobs": [{str(t): lp.logprob for t, lp in d.items()} for d in (o.outputs[0].logprobs or [])],
            }
            for o in outs
        ],
    }
    if side == "omni":
        result["ranks"] = [{"runner_mro": r.get("runner_mro"), "driver": r.get("driver")}
                           for r in llm.collective_rpc("omni_state")]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", required=True)
    p.add_argument("--model", required=True, help="the demo thinker directory (omni-backends demo-model create)")
    p.add_argument("--side", required=True, choices=("stock", "omni"))
    p.add_argument("--out", required=True)
    p.add_argument("--worker-cls", default=OMNI_WORKER_CLS)
    p.add_argument("--scheduler-cls", default=OMNI_SCHEDULER_CLS)
    p.add_argument("--graph-mode", default="NONE", metavar="MODE",
                   help="NONE (eager, the default) or a CUDAGraphMode name the driver declares")
    a = p.parse_args(argv)
    result = run(a.device, a.model, a.side, a.worker_cls, a.scheduler_cls, a.graph_mode)
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
