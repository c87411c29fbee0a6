# Run on the lent H200 (vLLM 0.26.0) at commits 2abc97f and c587cce, 2026-12-01; logs: ci/logs/cuda-smoke-*.txt.
# Kept as run: the demo models have since moved to the vLLM-Omni contract (payload names differ).
"""H200 smoke of the omni runner on vLLM's defaults (in-process engines).
python ci/gpu/smoke.py {v1|v2} DEMO_DIR  -- thinker omni vs stock (default graphs), talker codes graph vs eager."""
import gc, os, sys, time, traceback
runner, demo = sys.argv[1], sys.argv[2]
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from omni_backends.cuda import driver as d
d.CudaBackend.vendor_requirements = {"vllm": ">=0.26,<0.34", "torch": ">=2.11,<2.15"}
import torch
from vllm import LLM, SamplingParams
from core.stage import make_engine
from core.payloads import EXTRA_ARGS_KEY, pack
KW = dict(dtype="float32", max_model_len=256, max_num_seqs=16, seed=0, gpu_memory_utilization=0.05)
P = ["Hello", "The quick brown fox jumps over the lazy dog", "Omni models hear, think and speak.", "A thinker"]
SP = [SamplingParams(max_tokens=m, temperature=0.0, logprobs=2) for m in (5, 9, 3, 12)] + \
     [SamplingParams(max_tokens=m, temperature=0.9, top_p=0.9, top_k=50, seed=100 + i, logprobs=2) for i, m in enumerate((5, 9, 3, 12))]
tag = f"[{runner}]"
def lp(o):
    return [[(t, l.logprob) for t, l in sorted(dd.items())] for dd in (o.outputs[0].logprobs or [])]
def run(fn, *a, **k):
    t = time.time(); e = fn(*a, **k); print(tag, "engine up", round(time.time() - t, 1), "s", flush=True); return e
def close(e):
    del e; gc.collect(); torch.cuda.empty_cache()
try:
    from core.models.create import stock_thinker_view
    stock = run(LLM, stock_thinker_view(os.path.join(demo, "thinker"), "/tmp/thinker-stock"), **KW)
    so = stock.generate(P + P, SP, use_tqdm=False); close(stock)
    omni = run(make_engine, os.path.join(demo, "thinker"), device="cuda", **KW)
    oo = omni.generate(P + P, SP, use_tqdm=False); close(omni)
    same = [a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(so, oo)]
    dl = max((abs(x[1] - y[1]) for a, b in zip(so, oo) for ra, rb in zip(lp(a), lp(b)) for x, y in zip(ra, rb)), default=0.0)
    print(tag, "thinker tokens identical:", same, "max logprob diff", dl, flush=True)
    print(tag, "hidden shapes", [tuple(o.multimodal_outputs["hidden"].shape) for o in oo], flush=True)
    g = torch.Generator().manual_seed(7)
    reqs = [(7, 0, 4), (12, 3, 9), (5, 1, 6)]
    hid = [torch.randn(n, 128, generator=g) for n, _, _ in reqs]
    codes = {}
    for mode in ("graph", "eager"):
        kw = dict(KW, enforce_eager=(mode == "eager"))
        talker = run(make_engine, os.path.join(demo, "talker"), device="cuda", skip_tokenizer_init=True, **kw)
        params = [SamplingParams(max_tokens=f, temperature=0.0, ignore_eos=True, detokenize=False,
                  extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": h, "voice": v})}) for h, (n, v, f) in zip(hid, reqs)]
        outs = talker.generate([{"prompt_token_ids": [0] * n} for n, _, _ in reqs], params, use_tqdm=False)
        codes[mode] = [torch.cat([torch.tensor(o.outputs[0].token_ids)[:, None], o.multimodal_outputs["residual_codes"]], 1) for o in outs]
        st = talker.collective_rpc("omni_state")[0]
        print(tag, mode, "mtp_mode", st["mtp_mode"], "graphs", st["mtp_graphs"], "replays", st["mtp_replays"], "runner", st["runner_cls"], flush=True)
        close(talker)
    print(tag, "talker codes graph == eager:", [torch.equal(a, b) for a, b in zip(codes["graph"], codes["eager"])], flush=True)
    print(tag, "OK", flush=True)
except Exception:
    traceback.print_exc(); print(tag, "FAILED", flush=True); sys.exit(1)
