"""Static tier: every vLLM symbol the cuda driver binds exists, with a compatible
signature, in vLLM 0.33.0's source (read with ``ast`` through the drift check
``omni_backends.drift``; nothing is imported or installed).

Get the source once (336 MB wheel):

    pip download --no-deps vllm==0.33.0 -d /tmp/vllm033
    unzip -q /tmp/vllm033/vllm-0.33.0-*.whl 'vllm/*' -d /tmp/vllm033/src

``OMNI_VLLM033_SRC`` overrides the path (a directory or the .whl itself).
"""

from __future__ import annotations

import glob
import os

import pytest

from omni_backends import drift
from omni_backends.binding import VendorSymbol
from omni_backends.cuda.driver import CudaBackend


def _vllm033_source() -> str | None:
    env = os.environ.get("OMNI_VLLM033_SRC")
    if env:
        return env if os.path.exists(env) else None
    if os.path.isfile("/tmp/vllm033/src/vllm/__init__.py"):
        return "/tmp/vllm033/src"
    wheels = sorted(glob.glob("/tmp/vllm033/vllm-0.33.0-*.whl"))
    return wheels[0] if wheels else None


SRC = _vllm033_source()
pytestmark = pytest.mark.skipif(
    SRC is None,
    reason="vLLM 0.33.0 source not present: run `pip download --no-deps vllm==0.33.0 -d /tmp/vllm033` "
    "(and unzip it to /tmp/vllm033/src) or set OMNI_VLLM033_SRC",
)

#: what the cuda driver must bind (issue 5), by declaration name
EXPECTED = {
    "SET_FORWARD_CONTEXT": "vllm.forward_context.set_forward_context",
    "CUDAGRAPH_MODE": "vllm.config.CUDAGraphMode",
    "CUDA_GRAPH_WRAPPER": "vllm.compilation.cuda_graph.CUDAGraphWrapper",
    "CUDA_GRAPH_ENTRIES": "vllm.compilation.cuda_graph.CUDAGraphWrapper.concrete_cudagraph_entries",
    "GRAPH_CAPTURE": "vllm.distributed.parallel_state.graph_capture",
    "SAMPLER": "vllm.v1.sample.sampler.Sampler",
    "SAMPLER_SAMPLE": "vllm.v1.sample.sampler.Sampler.sample",
    "SAMPLER_TOPK_TOPP": "vllm.v1.sample.sampler.Sampler.topk_topp_sampler",
    "TOPK_TOPP_FORWARD": "vllm.v1.sample.ops.topk_topp_sampler.TopKTopPSampler.forward_native",
    "CPU_GPU_BUFFER": "vllm.v1.utils.CpuGpuBuffer",
    "COMMON_ATTN_METADATA": "vllm.v1.attention.backend.CommonAttentionMetadata",
    "GPU_MODEL_RUNNER_V1": "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
    "GPU_MODEL_RUNNER_V2": "vllm.v1.worker.gpu.model_runner.GPUModelRunner",
    "GPU_WORKER": "vllm.v1.worker.gpu_worker.Worker",
    # whether vLLM's resolved platform runs static graphs at all (run / serve follow it: engine_static_graph_modes)
    "PLATFORM_STATIC_GRAPHS": "vllm.platforms.interface.Platform.support_static_graph_mode",
}


def test_cuda_driver_declares_every_binding():
    declared = {d.name: d.symbol.qualname for d in drift.driver_declarations(CudaBackend)}
    assert declared == EXPECTED


def test_cuda_bindings_match_vllm_033():
    report = drift.run_check(["cuda"], [SRC])
    assert report["versions"].get("vllm") == "0.33.0", report["versions"]
    (cuda,) = report["drivers"]
    assert cuda["symbols"] == len(EXPECTED)
    assert cuda["checked"] == cuda["symbols"], drift.render_text(report)  # nothing left unverified
    assert cuda["drift"] == 0, drift.render_text(report)


def test_wrong_declarations_are_caught():
    """Negative control: the same check flags a parameter vLLM 0.33 lacks and an unfilled required one."""
    resolver = drift.SourceResolver([drift.SourceTree(SRC)])
    bad = [
        drift.Declared("BAD_PARAM", VendorSymbol("vllm.v1.utils", "CpuGpuBuffer", params=("dtype", "device", "bogus_flag"),
                                                 required=("dtype", "device"), kind="class"), ()),
        drift.Declared("BAD_REQUIRED", VendorSymbol("vllm.v1.worker.gpu_worker", "Worker", params=("vllm_config",),
                                                    required=("vllm_config",), kind="class"), ()),
        drift.Declared("BAD_NAME", VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunnerV9", kind="class"), ()),
    ]
    rep = drift.check_declarations("cuda", bad, resolver)
    kinds = {f.symbol: f.kind for f in rep.findings}
    assert kinds.get("BAD_PARAM") in ("removed-param", "renamed-param"), rep.findings  # 'pin_memory' sits in its slot
    assert kinds.get("BAD_REQUIRED") == "new-required-param", rep.findings
    assert kinds.get("BAD_NAME") == "missing-symbol", rep.findings


def _vllm026_wheel() -> str | None:
    env = os.environ.get("OMNI_VLLM026_SRC")
    if env:
        return env if os.path.exists(env) else None
    wheels = sorted(glob.glob(os.path.expanduser("~/.cache/gpu-stack/0.26.0/vllm-whl/vllm-0.26.0-*.whl")))
    wheels += sorted(glob.glob("/tmp/vllm026/vllm-0.26.0-*.whl"))
    return wheels[0] if wheels else None


def test_cuda_bindings_match_vllm_026():
    """The oldest vLLM of the driver's window (what runs on the H200): every binding resolves, no drift."""
    src = _vllm026_wheel()
    if src is None:
        pytest.skip("vLLM 0.26.0 wheel not present: pip download --no-deps vllm==0.26.0 -d /tmp/vllm026 "
                    "(or set OMNI_VLLM026_SRC)")
    report = drift.run_check(["cuda"], [src])
    assert report["versions"].get("vllm") == "0.26.0", report["versions"]
    (cuda,) = report["drivers"]
    assert cuda["checked"] == cuda["symbols"] == len(EXPECTED)
    assert cuda["drift"] == 0, drift.render_text(report)

