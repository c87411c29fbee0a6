"""Start the demo talker engine (vLLM's defaults on the device) and run one request; exit 0 if it served.

``python ci/gpu/talker_start.py DEMO_DIR [--after-thinker]`` -- the smallest reproduction of issue 21's main-job failure on the
H200: the talker stage's engine, started a second time in a fresh process with vLLM's torch.compile cache warm
(``$VLLM_CACHE_ROOT``), failed in ``determine_available_memory`` -> V2 ``_dummy_run`` at the first ``mm`` of the
cached Inductor graph with ``CUBLAS_STATUS_INTERNAL_ERROR when calling cublasCreate(handle)`` (3 of 3 warm
starts; the cold start passed; the device was empty). Both failing engines were the second or third engine of
their parent process; ``--after-thinker`` starts and releases the thinker's engine first, as the main job does.
``ci/gpu/run.sh cublas-probe`` runs it cold then warm under several settings. ``--preinit-cublas`` creates this
process's cuBLAS handle (``torch.cuda.current_blas_handle()`` and one ``mm``) before the engine starts: with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the engine core then runs on a thread whose handle already exists."""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))


def main(demo_dir: str, after_thinker: bool = False, preinit_cublas: bool = False) -> int:
    import torch

    if preinit_cublas:
        torch.cuda.current_blas_handle()
        torch.mm(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda")).sum().item()
        print("cuBLAS handle created before the engine", flush=True)
    from vllm import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack
    from omni_backends.engine_memory import engine_memory_kw
    from core.stage import make_engine, prepare_device

    if after_thinker:
        from core.pipeline import release_engine

        thinker = os.path.join(demo_dir, "thinker")
        tmem = engine_memory_kw(prepare_device("cuda").backend, thinker, max_model_len=256, max_num_seqs=8)
        th = make_engine(thinker, device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, seed=0, **tmem)
        th.generate(["Hello omni"], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
        release_engine(th, "thinker")
        print("thinker engine served and released", flush=True)
    model = os.path.join(demo_dir, "talker")
    t0 = time.perf_counter()
    mem = engine_memory_kw(prepare_device("cuda").backend, model, max_model_len=256, max_num_seqs=8)
    llm = make_engine(model, device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, seed=0,
                      skip_tokenizer_init=True, **mem)
    start = time.perf_counter() - t0
    h = torch.randn(6, 128, generator=torch.Generator().manual_seed(0))
    (out,) = llm.generate([{"prompt_token_ids": [0] * 6}], SamplingParams(
        max_tokens=3, temperature=0.0, ignore_eos=True, detokenize=False,
        extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": h, "voice": 1})}), use_tqdm=False)
    print(f"talker engine started in {start:.1f} s, served {len(out.outputs[0].token_ids)} tokens", flush=True)
    llm.llm_engine.engine_core.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--after-thinker" in sys.argv[2:], "--preinit-cublas" in sys.argv[2:]))
