"""Engine scenarios run in a fresh process each (vLLM and the driver selection
are per process). ``python tests/core/engine_scenarios.py SCENARIO DEMO_DIR OUT.pt``.

Each scenario saves a dict with ``torch.save``; tests compare the files.

The device and the engine variant come from the environment (set by
``tests/core/conftest.py`` from pytest's ``--device`` and the variant under test):

- ``OMNI_TEST_DEVICE``: the driver (``cpu`` default, ``cuda``, ...);
- ``OMNI_TEST_GRAPHS``: ``eager`` (``enforce_eager=True``), ``default`` (vLLM's
  defaults for the device: compilation + CUDA graphs on CUDA) or ``warmup``
  (cpu: compilation on with Dynamo's eager backend, so vLLM's CPU worker runs
  its warm-up, ``profile_run`` -> ``_dummy_run`` with the omni model; with
  ``enforce_eager`` vLLM skips it: ``CPUModelRunner.warming_up_model`` returns
  at ``CompilationMode.NONE``);
- ``VLLM_USE_V2_MODEL_RUNNER``: vLLM's own switch (V1 ``0`` / V2 ``1``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

DEVICE = os.environ.get("OMNI_TEST_DEVICE", "cpu")
GRAPHS = os.environ.get("OMNI_TEST_GRAPHS", "eager")
GRAPH_VARIANTS = ("eager", "default", "warmup")

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog",
    "Omni models hear, think and speak.",
    "A thinker writes text",
]
MAX_TOKENS = [5, 9, 3, 12]
MAX_MODEL_LEN, MAX_NUM_SEQS = 256, 16


def engine_kw(device: str = DEVICE, graphs: str = GRAPHS) -> dict:
    """``vllm.LLM`` arguments of the variant: fp32, seed 0, small context;
    ``enforce_eager`` only for ``eager``. Device memory: :func:`memory_kw`."""
    if graphs not in GRAPH_VARIANTS:
        raise SystemExit(f"OMNI_TEST_GRAPHS must be one of {GRAPH_VARIANTS}, got {graphs!r}")
    kw: dict = dict(dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS, seed=0)
    if graphs == "eager":
        kw["enforce_eager"] = True
    elif graphs == "warmup":
        # DYNAMO_TRACE_ONCE (2) with the "eager" backend: compilation mode != NONE (so vLLM's CPU worker warms
        # up through profile_run -> _dummy_run), traced once by Dynamo, no Inductor code generation (CI cost)
        kw["compilation_config"] = {"mode": 2, "backend": "eager"}
    return kw


ENGINE_KW = engine_kw()


def memory_kw(model: str) -> dict:
    """Per-engine device memory sized for the model (``omni_backends.engine_memory.engine_memory_kw``; on cpu
    ``VLLM_CPU_KVCACHE_SPACE`` still sets the KV size)."""
    from omni_backends.engine_memory import engine_memory_kw
    from core.stage import prepare_device

    return engine_memory_kw(prepare_device(DEVICE).backend, model, max_model_len=MAX_MODEL_LEN,
                           max_num_seqs=MAX_NUM_SEQS, dtype="float32")


def omni_engine(model: str, **kw):
    """``core.stage.make_engine`` on the test device with the variant's arguments."""
    from core.stage import make_engine

    return make_engine(model, device=DEVICE, **{**ENGINE_KW, **memory_kw(model), **kw})


def engine_config(llm) -> dict:
    """What vLLM resolved for this engine (to check the variant really ran)."""
    cfg = llm.llm_engine.vllm_config
    cc = cfg.compilation_config
    return {"device": DEVICE, "graphs": GRAPHS, "use_v2_model_runner": bool(getattr(cfg, "use_v2_model_runner", False)),
            "async_scheduling": bool(cfg.scheduler_config.async_scheduling), "enforce_eager": cfg.model_config.enforce_eager,
            "compilation_mode": int(cc.mode), "cudagraph_mode": str(cc.cudagraph_mode),
            "multiprocess": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0"}


def sampling_batch():
    from vllm import SamplingParams

    params = [SamplingParams(max_tokens=m, temperature=0.0, logprobs=2) for m in MAX_TOKENS]
    params += [SamplingParams(max_tokens=m, temperature=0.9, top_p=0.9, top_k=50, seed=100 + i, logprobs=2)
               for i, m in enumerate(MAX_TOKENS)]
    return PROMPTS + PROMPTS, params


def pause_scheduler(llm) -> None:
    """vLLM's ``EngineCore.pause_scheduler("keep")``: requests added from now on queue without being scheduled."""
    client = llm.llm_engine.engine_core
    if hasattr(client, "call_utility"):  # multiprocess: SyncMPClient
        client.call_utility("pause_scheduler", "keep", False)
    else:  # in-process: InprocClient
        client.engine_core.pause_scheduler("keep", False)


def resume_scheduler(llm) -> None:
    """vLLM's ``EngineCore.resume_scheduler()``: every queued request is schedulable at once."""
    client = llm.llm_engine.engine_core
    if hasattr(client, "call_utility"):
        client.call_utility("resume_scheduler")
    else:
        client.engine_core.resume_scheduler()


def generate_as_one_batch(llm, prompts, params) -> list:
    """``llm.generate``, except that every request reaches vLLM's scheduler before its first step.

    ``LLM.generate`` sends requests one by one; a multiprocess engine core starts stepping as soon as the first
    arrives, so how many requests share the first steps depends on timing (on a GPU, where kernels and cuBLAS
    algorithms depend on the batch shape, that changes logprobs in the 5th decimal). Here the scheduler is paused
    (``EngineCore.pause_scheduler("keep")``, requests queue) while all are added, then resumed: stock and omni
    engines see the same batches step for step, so their outputs compare bit for bit."""
    eng = llm.llm_engine
    pause_scheduler(llm)
    ids = [str(i) for i in range(len(prompts))]
    try:
        for rid, prompt, p in zip(ids, prompts, params):
            eng.add_request(rid, prompt, p)
    finally:
        resume_scheduler(llm)
    done: dict = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    return [done[r] for r in ids]


def collect(outputs):
    res = []
    for o in outputs:
        c = o.outputs[0]
        lps = [[(tid, lp.logprob) for tid, lp in sorted(d.items())] for d in (c.logprobs or [])]
        res.append({
            "request_id": o.request_id,
            "prompt_token_ids": list(o.prompt_token_ids),
            "token_ids": list(c.token_ids),
            "logprobs": lps,
            "multimodal_outputs": dict(getattr(o, "multimodal_outputs", {}) or {}),
        })
    return res


def in_process_runner(llm):
    """The model runner of an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def count_mtp(llm) -> dict:
    """Count talker-MTP work in an in-process engine: ``rows`` the head ran on in
    all, ``per_request`` MTP calls per request (kept past the request's end).
    A multiprocess engine's runner is out of reach: counts stay ``None``."""
    try:
        hooks = in_process_runner(llm).omni_hooks
    except AttributeError:
        return {"rows": None, "calls": None, "per_request": {}, "live": {}}
    counts = {"rows": 0, "calls": 0, "per_request": {}}
    mtp = hooks.talker_mtp
    head = mtp.mtp

    def counted(ids, *args, **kwargs):
        counts["rows"] += int(ids.shape[0])
        counts["calls"] += 1
        return head(ids, *args, **kwargs)

    mtp.mtp = mtp.eager = counted
    finish = hooks.on_finished_requests

    def record(ids):
        ids = list(ids)
        counts["per_request"].update({r: hooks.mtp_calls.get(r, 0) for r in ids if r in hooks.mtp_calls})
        finish(ids)

    hooks.on_finished_requests = record
    counts["live"] = hooks.mtp_calls
    return counts


TALKER_REQUESTS = [(7, 0, 4), (12, 3, 9), (5, 1, 6)]  # (prompt rows, voice, frames)


def talker_batch(demo_dir: str) -> dict:
    """3 talker requests (different lengths and voices) in one batch, then code2wav on each."""
    import torch
    from vllm import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack

    g = torch.Generator().manual_seed(7)
    hiddens = [torch.randn(n, 128, generator=g) for n, _, _ in TALKER_REQUESTS]
    talker = omni_engine(os.path.join(demo_dir, "talker"), skip_tokenizer_init=True)
    prompts, params = [], []
    for h, (n, voice, frames) in zip(hiddens, TALKER_REQUESTS):
        prompts.append({"prompt_token_ids": [0] * n})
        # a frame is a token plus its MTP residuals, made at the next decode step: one token more than frames
        params.append(SamplingParams(max_tokens=frames + 1, temperature=0.0, ignore_eos=True, detokenize=False,
                                     extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": h, "voice": voice})}))
    counts = count_mtp(talker)
    outs = talker.generate(prompts, params, use_tqdm=False)
    mtp_calls = {**counts["per_request"], **counts.pop("live")}
    if counts["rows"] is None:  # multiprocess: the worker's own record (finished requests, then live ones)
        (state,) = talker.collective_rpc("omni_state")
        mtp_calls = {**(state.get("mtp_calls_finished") or {}), **(state.get("mtp_calls") or {})}
    rows = [o.multimodal_outputs["codes.audio"] for o in outs]
    codes = [r[r[:, 0] >= 0] for r in rows]  # prompt rows carry -1
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    c2w = omni_engine(os.path.join(demo_dir, "code2wav"), kind="generation", skip_tokenizer_init=True)
    wouts = c2w.generate([{"prompt_token_ids": [0] * c.shape[0]} for c in codes],
                         [SamplingParams(max_tokens=1, detokenize=False, extra_args={EXTRA_ARGS_KEY: pack({"codes": c})})
                          for c in codes], use_tqdm=False)
    try:  # a generation-kind engine refuses max_tokens != 1 in the caller's thread, and keeps running
        c2w.generate([{"prompt_token_ids": [0] * 3}], [SamplingParams(max_tokens=4, detokenize=False, extra_args={
            EXTRA_ARGS_KEY: pack({"codes": codes[0][:3]})})], use_tqdm=False)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    bad_payloads = {}
    for name, (engine, prompt, payload, n) in {
        "voice": (talker, [0] * 7, {"thinker_hidden": hiddens[0], "voice": 9}, 2),
        "rows": (talker, [0] * 5, {"thinker_hidden": hiddens[0], "voice": 0}, 2),
        "codes": (c2w, [0] * 3, {"codes": codes[0][:3] + 1000}, 1),
    }.items():
        try:
            engine.generate([{"prompt_token_ids": prompt}], [SamplingParams(max_tokens=n, detokenize=False,
                            extra_args={EXTRA_ARGS_KEY: pack(payload)})], use_tqdm=False)
            bad_payloads[name] = None
        except ValueError as exc:
            bad_payloads[name] = str(exc)
    result_bad = bad_payloads
    again = c2w.generate([{"prompt_token_ids": [0] * codes[0].shape[0]}], [SamplingParams(
        max_tokens=1, detokenize=False, extra_args={EXTRA_ARGS_KEY: pack({"codes": codes[0]})})], use_tqdm=False)
    res = {"requests": TALKER_REQUESTS, "hiddens": hiddens, "codes": codes, "refused": refused,
            "talker_workers": talker.collective_rpc("omni_state"), "config": engine_config(talker),
            "waveform_again": again[0].multimodal_outputs["waveform"].reshape(-1), "bad_payloads": result_bad,
            "code_rows": [r.shape[0] for r in rows], "tokens": tokens,
            "mtp_calls": [next((v for k, v in mtp_calls.items() if k == o.request_id or k.startswith(f"{o.request_id}-")),
                                None) for o in outs],
            "mtp_calls_raw": mtp_calls, "mtp_counts": counts,
            "waveforms": [o.multimodal_outputs["waveform"].reshape(-1) for o in wouts]}
    shutdown(talker, c2w)
    return res


def payload_lifecycle(talker: str) -> dict:
    """Talker requests with payloads: one finishes, one is aborted mid-way; then a live one.

    Each snapshot (``omni_state``) is taken while the requests it must see are far from done: a multiprocess
    engine core (the default off cpu) steps on its own between ``step()`` calls, so a request of a few tokens
    may finish, and its payload be released, before the snapshot arrives."""
    import torch
    from vllm import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack

    llm = omni_engine(talker, skip_tokenizer_init=True)
    eng = llm.llm_engine
    g = torch.Generator().manual_seed(0)
    ids = {"done": "talk-done", "aborted": "talk-aborted", "live": "talk-next"}
    long = 200  # steps a request stays live (max_model_len 256, prompts of 6)
    for name, n_tokens in (("done", 40), ("aborted", long)):
        payload = pack({"thinker_hidden": torch.randn(6, 128, generator=g), "voice": 1})
        params = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True,
                                extra_args={EXTRA_ARGS_KEY: payload}, detokenize=False)
        eng.add_request(ids[name], {"prompt_token_ids": [0] * 6}, params)
    eng.step()
    during = llm.collective_rpc("omni_state")
    for _ in range(4):
        eng.step()
    eng.abort_request([ids["aborted"]])
    while eng.has_unfinished_requests():
        eng.step()
    # A live request: in process, its first step carries the finished/aborted ids to the worker (a multiprocess
    # engine core sends them on a step of their own as soon as they finish); its payload must stay.
    eng.add_request(ids["live"], {"prompt_token_ids": [0] * 4},
                    SamplingParams(max_tokens=long, temperature=0.0, ignore_eos=True, detokenize=False,
                                   extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": torch.randn(4, 128),
                                                                     "voice": 0})}))
    eng.step()
    after = llm.collective_rpc("omni_state")
    eng.abort_request([ids["live"]])
    shutdown(llm)
    return {"ids": ids, "during": during, "after": after}


def shutdown(*engines) -> None:
    """Release each engine (its engine-core process in multiprocess mode) before the next scenario starts."""
    from core.pipeline import release_engine

    for llm in engines:
        release_engine(llm, "test")


def thinker_batch(llm) -> dict:
    """The sampling batch (greedy + seeded, four lengths) as one batch; what vLLM resolved; the workers' state."""
    prompts, params = sampling_batch()
    return {"outputs": collect(generate_as_one_batch(llm, prompts, params)), "config": engine_config(llm)}


def run_one(scenario: str, demo_dir: str) -> dict:
    """One scenario's result (its engines shut down before it returns)."""
    from core.models.create import stock_thinker_view

    thinker = os.path.join(demo_dir, "thinker")
    if scenario == "stock-thinker":
        from vllm import LLM

        from core.stage import prepare_device

        prepare_device(DEVICE)  # the same driver selection and vLLM platform as the omni engines
        stock = stock_thinker_view(thinker, os.path.join(demo_dir, "thinker-stock"))
        llm = LLM(stock, **ENGINE_KW, **memory_kw(stock))
        res = thinker_batch(llm)
        shutdown(llm)
        return res
    if scenario in ("omni-thinker", "omni-thinker-mp"):
        llm = omni_engine(thinker)
        res = thinker_batch(llm)
        res["workers"] = llm.collective_rpc("omni_state")
        shutdown(llm)
        return res
    if scenario == "omni-plain-thinker":  # a stock vLLM class (LlamaForCausalLM) on the omni runner
        stock = stock_thinker_view(thinker, os.path.join(demo_dir, "thinker-stock"))
        llm = omni_engine(stock)
        res = thinker_batch(llm)
        res["workers"] = llm.collective_rpc("omni_state")
        shutdown(llm)
        return res
    if scenario == "omni-thinker-tp2":
        llm = omni_engine(thinker, tensor_parallel_size=2)
        prompts, params = sampling_batch()
        res = {"outputs": collect(generate_as_one_batch(llm, prompts[:4], params[:4])),
               "workers": llm.collective_rpc("omni_state")}
        shutdown(llm)
        return res
    if scenario == "talker-batch":
        return talker_batch(demo_dir)
    if scenario == "payloads":
        return payload_lifecycle(os.path.join(demo_dir, "talker"))
    raise SystemExit(f"unknown scenario {scenario!r}")


def main(scenario: str, demo_dir: str, out: str) -> None:
    """``SCENARIO`` is one scenario, or ``suite``: the comma-separated ``OMNI_TEST_SCENARIOS`` one after another
    in this process (engines of one variant shared by every test that reads them, stock and omni side by side);
    a scenario that raises is saved as ``{"error": traceback}`` and the next one still runs."""
    import time
    import traceback

    import torch

    result: dict = {"scenario": scenario, "parent_pid": os.getpid()}
    if scenario != "suite":
        result.update(run_one(scenario, demo_dir))
        torch.save(result, out)
        return
    for name in [n for n in os.environ.get("OMNI_TEST_SCENARIOS", "").split(",") if n]:
        t0 = time.perf_counter()
        try:
            part = {"scenario": name, "parent_pid": os.getpid(), **run_one(name, demo_dir)}
        except BaseException as exc:  # noqa: BLE001 -- reported to the tests that read this scenario
            part = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-6000:]}"}
        part["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"scenario {name}: {'FAILED' if 'error' in part else 'ok'} in {part['seconds']} s", flush=True)
        result[name] = part
        torch.save(result, out + ".partial")
        os.replace(out + ".partial", out)
    torch.save(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
