"""Where the omni runner and vLLM's stock runner first differ on the same model (diagnosis, not a test).

``python ci/gpu/equivalence.py DEMO_DIR OUT.json [--device cuda]``: the demo thinker (an ``LlamaForCausalLM``
subclass) under the omni runner and the same weights as plain ``LlamaForCausalLM`` under vLLM's stock runner, both
in-process, V1, ``enforce_eager``, fp32, the batch of ``tests/core/engine_scenarios.sampling_batch``. Every model
call is recorded: the scheduler's tokens per request for the step, then the output of the embedding, of each
decoder layer and of the final norm, and the logits. The report names the first call and module where the two
differ (bit for bit), and the per-step batches of both engines, so a difference is traced to its cause (a batch
composition difference, an input path, an extra op) instead of a tolerance.

Then the same two engines in vLLM's multiprocess engine (the default off cpu), twice each: requests sent by
``LLM.generate`` (one by one; the engine core steps as soon as the first arrives) and by
``engine_scenarios.generate_as_one_batch`` (scheduler paused while all are added): the largest logprob
difference stock vs omni for each, which shows whether arrival timing (batch composition) is the cause.

``TRITON_F32_DEFAULT`` / ``VLLM_FLOAT32_MATMUL_PRECISION`` are left as the caller set them: the report prints them.

``--compiles``: instead, whether two *compilations* of one model differ (the graph variants' 7e-7 / 1.8e-6
logprob gaps between the stock and the omni thinker, each compiled in its own engine with its own compile cache,
ci/logs/h200-2026-12-02-summary-7921fa8-0e28e1d.md). vLLM's defaults on the device (compile + CUDA graphs; the runner as
``VLLM_USE_V2_MODEL_RUNNER`` says), multiprocess engines, one after another, each with the compile cache named:
stock in cache A (cold), stock in cache B (cold), stock in cache A again (warm: the artifact A compiled), the
omni thinker in cache C (cold), the omni thinker in cache D (cold). Each engine runs the tests' thinker batch as
one batch (``generate_as_one_batch``); the report gives the largest logprob difference of every pair. Stock A vs
stock B is the same class, weights and runner compiled twice: if they differ, separate compilations are the cause
of the gap, not the omni class or runner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "core"))


def record(llm) -> dict:
    """Wrap the in-process engine's scheduler and model to record steps and per-module outputs."""
    import torch

    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    model = runner.get_model()
    rec: dict = {"steps": [], "calls": []}
    sched = core.scheduler
    schedule = sched.schedule

    def scheduled(*a, **k):
        out = schedule(*a, **k)
        rec["steps"].append(sorted((str(k), int(v)) for k, v in out.num_scheduled_tokens.items()))
        return out

    sched.schedule = scheduled
    current: dict = {}

    def hook(name):
        def fn(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            if hasattr(t, "text_hidden_states"):
                t = t.text_hidden_states
            if isinstance(t, torch.Tensor):
                current.setdefault("mods", []).append((name, t.detach().float().cpu().clone()))
        return fn

    inner = getattr(model, "model", None)
    mods = [("embed", inner.embed_tokens)] + [(f"layer{i}", m) for i, m in enumerate(inner.layers)] + [("norm", inner.norm)]
    for name, m in mods:
        m.register_forward_hook(hook(name))
    compute_logits = model.compute_logits

    def logits(hidden, *a, **k):
        out = compute_logits(hidden, *a, **k)
        current["logits"] = out.detach().float().cpu().clone()
        rec["calls"].append(dict(current))
        current.clear()
        return out

    model.compute_logits = logits
    return rec


def compare(a: dict, b: dict) -> dict:
    """The first model call and module where ``a`` and ``b`` differ, and the steps' batches."""
    report: dict = {"steps_equal": a["steps"] == b["steps"], "steps_stock": a["steps"][:12], "steps_omni": b["steps"][:12],
                    "calls": [len(a["calls"]), len(b["calls"])], "first_difference": None}
    for i, (ca, cb) in enumerate(zip(a["calls"], b["calls"])):
        for (na, ta), (nb, tb) in zip(ca.get("mods", []) + [("logits", ca["logits"])],
                                      cb.get("mods", []) + [("logits", cb["logits"])]):
            if na != nb or ta.shape != tb.shape:
                report["first_difference"] = {"call": i, "module": [na, nb], "shapes": [list(ta.shape), list(tb.shape)]}
                return report
            if not (ta == tb).all():
                d = (ta - tb).abs()
                report["first_difference"] = {"call": i, "module": na, "shape": list(ta.shape),
                                              "max_abs": float(d.max()), "rows_differing": int((d.amax(-1) > 0).sum())}
                return report
    return report


def max_diff(a: list, b: list) -> float | str:
    """Largest logprob difference of two ``collect`` results (``"tokens differ"`` if a token differs)."""
    if [o["token_ids"] for o in a] != [o["token_ids"] for o in b]:
        return "tokens differ"
    return max((abs(x - y) for s, o in zip(a, b) for ls, lo in zip(s["logprobs"], o["logprobs"])
                for (_, x), (_, y) in zip(ls, lo)), default=0.0)


def compiles(demo_dir: str, device: str, out: str, cache_base: str) -> dict:
    """The ``--compiles`` report (module docstring)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    os.environ["OMNI_TEST_DEVICE"] = device
    os.environ["OMNI_TEST_GRAPHS"] = "default"
    import time

    import engine_scenarios as es
    from precision import ENGINE_PRECISION_ENV
    from vllm import LLM

    from core.models.create import create_demo_models, stock_thinker_view
    from core.stage import prepare_device

    os.environ.update(ENGINE_PRECISION_ENV)
    if not os.path.isdir(os.path.join(demo_dir, "thinker")):
        create_demo_models(demo_dir)
    thinker = os.path.join(demo_dir, "thinker")
    stock_path = stock_thinker_view(thinker, os.path.join(demo_dir, "thinker-stock"))
    prepare_device(device)
    prompts, params = es.sampling_batch()
    runs: dict = {}
    report: dict = {"device": device, "v2": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"), "engines": {},
                    "env": {k: os.environ.get(k) for k in ENGINE_PRECISION_ENV}}
    for name, side, cache in (("stock-A", "stock", "A"), ("stock-B", "stock", "B"), ("stock-A-warm", "stock", "A"),
                              ("omni-C", "omni", "C"), ("omni-D", "omni", "D")):
        os.environ["VLLM_CACHE_ROOT"] = os.path.join(cache_base, cache)  # the engine core inherits it at spawn
        t0 = time.perf_counter()
        try:
            llm = LLM(stock_path, **es.engine_kw(device, "default"), **es.memory_kw(stock_path)) if side == "stock" \
                else es.omni_engine(thinker)
        except Exception as exc:  # noqa: BLE001 -- a diagnosis: record and go on
            report["engines"][name] = {"error": repr(exc)[:400]}
            continue
        start = time.perf_counter() - t0
        runs[name] = es.collect(es.generate_as_one_batch(llm, prompts, params))
        report["engines"][name] = {"start_s": round(start, 1), "config": es.engine_config(llm)}
        llm.llm_engine.engine_core.shutdown()
        del llm
        print(f"{name}: started in {start:.0f} s", flush=True)
    names = list(runs)
    report["max_logprob_diff"] = {f"{a} vs {b}": max_diff(runs[a], runs[b])
                                  for i, a in enumerate(names) for b in names[i + 1:]}
    print(json.dumps(report, indent=1))
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("demo_dir")
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--multiprocess", action="store_true", help="also the multiprocess arrival-timing comparison")
    ap.add_argument("--compiles", metavar="CACHE_DIR",
                    help="instead: two compilations of one model compared (module docstring); caches under CACHE_DIR")
    args = ap.parse_args()
    if args.compiles:
        compiles(args.demo_dir, args.device, args.out, args.compiles)
        return
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    os.environ["OMNI_TEST_DEVICE"] = args.device
    os.environ["OMNI_TEST_GRAPHS"] = "eager"
    import engine_scenarios as es
    from vllm import LLM

    from core.models.create import create_demo_models, stock_thinker_view
    from core.stage import prepare_device

    if not os.path.isdir(os.path.join(args.demo_dir, "thinker")):
        create_demo_models(args.demo_dir)
    thinker = os.path.join(args.demo_dir, "thinker")
    prepare_device(args.device)
    prompts, params = es.sampling_batch()
    runs = {}
    for side in ("stock", "omni"):
        if side == "stock":
            path = stock_thinker_view(thinker, os.path.join(args.demo_dir, "thinker-stock"))
            llm = LLM(path, **es.engine_kw(args.device, "eager"), **es.memory_kw(path))
        else:
            llm = es.omni_engine(thinker)
        rec = record(llm)
        outs = es.collect(llm.generate(prompts, params, use_tqdm=False))
        rec["outputs"] = outs
        runs[side] = rec
        llm.llm_engine.engine_core.shutdown()
        del llm
    report = compare(runs["stock"], runs["omni"])
    report.update(device=args.device, inproc_max_logprob_diff=max_diff(runs["stock"]["outputs"],
                                                                       runs["omni"]["outputs"]),
                  env={k: os.environ.get(k) for k in (
                      "TRITON_F32_DEFAULT", "VLLM_FLOAT32_MATMUL_PRECISION", "VLLM_BATCH_INVARIANT")})
    if args.multiprocess:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        mp = {}
        for side in ("stock", "omni"):
            if side == "stock":
                path = os.path.join(args.demo_dir, "thinker-stock")
                llm = LLM(path, **es.engine_kw(args.device, "eager"), **es.memory_kw(path))
            else:
                llm = es.omni_engine(thinker)
            mp[side] = {"generate": [es.collect(llm.generate(prompts, params, use_tqdm=False)) for _ in range(2)],
                        "one_batch": [es.collect(es.generate_as_one_batch(llm, prompts, params)) for _ in range(2)],
                        "config": es.engine_config(llm)}
            llm.llm_engine.engine_core.shutdown()
            del llm
        report["multiprocess"] = {
            how: [max_diff(mp["stock"][how][i], mp["omni"][how][i]) for i in range(2)] for how in ("generate", "one_batch")}
        report["multiprocess"]["stock_generate_run_to_run"] = max_diff(*mp["stock"]["generate"])
        report["multiprocess"]["omni_generate_run_to_run"] = max_diff(*mp["omni"]["generate"])
        report["multiprocess"]["config"] = mp["omni"]["config"]
    print(json.dumps(report, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
