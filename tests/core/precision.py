"""Numerics of the engine tests: the precision settings the tests set, and the tolerances, in one place.

Two kinds of comparison, never mixed:

- **Runner equivalence** (the omni runner vs vLLM's stock runner on the same model class and weights, or one
  omni engine in two process layouts): the same batches (``engine_scenarios.generate_as_one_batch``) run the
  same kernels on the same shapes, so tokens, logprobs and hidden states are compared **bit for bit**. No
  tolerance exists for it: a difference is a runner fault.
- **Model vs a plain-PyTorch reference** (transformers' ``LlamaForCausalLM`` plus torch ops,
  ``tests/core/reference.py``): the reference runs on **the same device and dtype** as the engine, with the
  settings below; kernels differ (vLLM's fused RMSNorm / rotary / attention vs PyTorch's), so the comparison is
  to :data:`TOLERANCES` of ``(device, dtype)``.

Precision settings (set by the tests, stated here):

- engines (every scenario process and the engine-core processes it starts, :data:`ENGINE_PRECISION_ENV`):
  ``VLLM_FLOAT32_MATMUL_PRECISION=highest`` (vLLM's default, restated: ``torch.set_float32_matmul_precision``
  in vLLM's GPU worker, so fp32 GEMMs do not use TF32) and ``TRITON_F32_DEFAULT=ieee``: vLLM's Triton
  attention (the fp32 attention backend on CUDA; FlashAttention has no fp32) calls ``tl.dot`` without an
  ``input_precision``, which Triton defaults to **TF32** on NVIDIA GPUs -- a 10-bit mantissa, which put the
  H200's hidden states 2.8e-3 and the code2wav waveform 5.2e-4 away from an fp32 reference (2026-12-01). With
  ``ieee`` the attention dots are fp32: the H200 then passed hidden states and waveforms against the fp32
  reference on the GPU at the tolerances below, all four variants. On cpu these variables change nothing.
- in-process engines (the Qwen3-TTS scenarios, :func:`set_engine_process_precision`): also
  ``torch.backends.cudnn.allow_tf32 = False`` (no environment variable sets it; PyTorch's default is True).
  vLLM-Omni's code2wav decodes with convolutions: with cuDNN's TF32 its eager engine was 5.3e-4 away from the
  fp32 direct forward on the H200 (2026-12-02, v1-eager; the compiled variant passed).
- no ``TORCHINDUCTOR_DETERMINISTIC``: it was set once to make Inductor pick kernels without on-device
  benchmarking; it does not make two compilations agree, and with vLLM's AOT compile cache off (the cuda
  driver's default since 2026-12-02) Inductor's fusion benchmarking raised under it at every graph engine's
  start (H200, 2026-12-02, at aeb6ef5,
  ``ci/logs/h200-2026-12-02-summary-aeb6ef5-9dbc52c.md``), so the tests no longer set it.
  Two compilations differ: on the H200 (2026-12-02, vLLM 0.26, V2, compile +
  CUDA graphs, ``ci/gpu/equivalence.py --compiles``, ``ci/logs/h200-2026-12-02-compiles-99266e1.txt``) stock
  ``LlamaForCausalLM`` compiled twice in two fresh compile caches gave logprobs 3.1e-6 apart (tokens equal),
  while a warm start loading the first compilation's artifact equalled it bit for bit (0.0); the omni demo
  thinker compiled apart was 0.0 from one stock compilation and 2.4e-6 .. 3.6e-6 from the others. So where two
  engines each compile their own graph (the omni demo thinker class vs stock ``LlamaForCausalLM``: separate
  compile-cache entries; one model in two process layouts with caches of their own), the graph variants' gaps
  (7.2e-7 V1 / 1.8e-6 V2 on 2026-12-01, 2.6e-6 on 2026-12-02) are compilation, not the runner: those
  comparisons are tokens equal and logprobs within :data:`COMPILED_APART_LOGPROB_ATOL`
  (:func:`compiled_apart`). Runner equivalence proper -- one model class under the stock and the omni runner,
  which share the compiled artifact -- stays bit for bit in every variant
  (``test_a_stock_model_on_the_omni_runner_gives_stock_tokens_and_logprobs``).
- **Batch composition** (one request served alone vs the same request batched with others, e.g. 16
  concurrent HTTP requests): not runner equivalence -- the batches differ, so GEMMs run on other shapes (the
  code2wav's ``[num_tokens, H]`` rows; CPU GEMM kernels block by M and are not batch invariant, and vLLM makes
  no batch-invariance promise outside ``VLLM_BATCH_INVARIANT``). Measured on cpu (2026-12-02, clean-clone CI of
  b64480d, then 6 rounds of ``tests/serving``'s 16 requests): the tokens and codes were equal every time, one
  float sample in 960 rounded to a neighbouring int16 in 3 rounds of 6. So served PCM is compared as int16 with
  equal lengths and at most :data:`BATCH_COMPOSITION_PCM16_LSB` apart per sample; a differing code changes a
  whole frame of ``hop_length`` samples by far more.
- the reference (:func:`reference_settings`): ``torch.backends.cuda.matmul.allow_tf32 = False`` and
  ``torch.backends.cudnn.allow_tf32 = False`` (PyTorch's default for cuDNN is True; the demo models have no
  convolution, vLLM-Omni's code2wav has, and its reference must be fp32 too), eval mode, no autocast.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

#: environment of every engine process of the tests (see the module docstring)
ENGINE_PRECISION_ENV = {"VLLM_FLOAT32_MATMUL_PRECISION": "highest", "TRITON_F32_DEFAULT": "ieee"}

#: (device, dtype) -> quantity -> assert_close tolerances, engine vs the plain-PyTorch reference.
#: fp32, both sides IEEE fp32: the difference is summation order (fused kernels, GEMM tiling) through the demo
#: models' 2 layers; hidden states (values up to ~4) to 2e-4 absolute, the waveform (tanh, |x| < 1) to 1e-5.
TOLERANCES: dict[tuple[str, str], dict[str, dict[str, float]]] = {
    ("cpu", "float32"): {"hidden": {"atol": 2e-4, "rtol": 1e-4}, "waveform": {"atol": 1e-5, "rtol": 1e-5}},
    ("cuda", "float32"): {"hidden": {"atol": 2e-4, "rtol": 1e-4}, "waveform": {"atol": 1e-5, "rtol": 1e-5}},
}


#: int16 PCM of one request batched with others vs served alone (module docstring, "Batch composition"): one
#: LSB, the rounding of a float an ulp away
BATCH_COMPOSITION_PCM16_LSB = 1

#: logprobs of two engines that compiled the same model apart (Inductor code generation on a GPU): the H200's
#: largest measured gap 3.6e-6 (module docstring), with a margin of ~5x
COMPILED_APART_LOGPROB_ATOL = 2e-5


def compiled_apart(config: dict, device: str) -> bool:
    """True if two engines of ``config`` (``engine_scenarios.engine_config``) on ``device`` each generate their
    own compiled code: compilation on, off the cpu (the cpu variants compile with Dynamo's eager backend, no
    code generation: bit for bit there)."""
    return device != "cpu" and int(config["compilation_mode"]) != 0  # enforce_eager: mode 0


def tolerance(device: str, dtype: str, quantity: str) -> dict[str, float]:
    """``{"atol", "rtol"}`` for ``quantity`` (``hidden`` / ``waveform``) on ``device`` in ``dtype``.

    Raises ``KeyError`` naming the missing entry: a device or dtype without measured tolerances has none
    (never borrowed from another device)."""
    try:
        return TOLERANCES[(device, dtype)][quantity]
    except KeyError:
        raise KeyError(f"no reference tolerance for {quantity} on ({device!r}, {dtype!r}): add one to "
                       f"tests/core/precision.py TOLERANCES, from a measured run") from None


def set_engine_process_precision() -> None:
    """For a process whose engines run in it: fp32 convolutions (cuDNN TF32 off) and fp32 matmuls."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


@contextlib.contextmanager
def reference_settings(device: str) -> Iterator[Any]:
    """Run the plain-PyTorch reference on ``device`` with TF32 off (matmul and cuDNN); restores the settings."""
    import torch

    cuda = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            yield torch.device(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = cuda
