"""The cuda driver on a machine without an NVIDIA GPU / vLLM CUDA build (CI), plus its probe logic.

What runs on the GPU is the kit (``omni_backends/testing/suite``) and the repository's device-tier tests
(``pytest --device cuda -m device_tier``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from omni_backends.backend import ProbeState
from omni_backends.cuda import driver as cuda_driver
from omni_backends.cuda.driver import CudaBackend

ON_NVIDIA_HOST = os.path.isdir("/proc/driver/nvidia/gpus") and bool(os.listdir("/proc/driver/nvidia/gpus"))


def test_identity():
    ident = CudaBackend.identity()
    assert ident["name"] == "cuda" and ident["device_type"] == "cuda"
    assert ident["dist_backend"] == "nccl"
    assert ident["visible_devices_env"] == "CUDA_VISIBLE_DEVICES"
    assert CudaBackend().vllm_platform_env() == {"VLLM_TARGET_DEVICE": "cuda"}


def test_capabilities():
    caps = CudaBackend().capabilities()
    assert caps.static_graphs and {"PIECEWISE", "FULL"} <= set(caps.static_graph_modes)
    assert caps.pinned_memory and caps.h2d_stream_ordered and caps.d2h_stream_ordered
    assert caps.v1_runner and caps.v2_runner


@pytest.mark.skipif(ON_NVIDIA_HOST, reason="this host has an NVIDIA GPU: the 'not usable here' case does not apply")
def test_probe_not_usable_here_with_reason_and_fix():
    res = CudaBackend.probe()
    assert res.state is not ProbeState.USABLE and not res.usable
    assert res.device_count == 0
    assert "0 NVIDIA GPU" in res.reason or "no NVIDIA GPU" in res.reason
    if res.versions.get("vllm") is None:
        assert "vLLM's CUDA build is not installed" in res.reason
        assert "omni-backends[cuda]" in res.fix
    assert res.error is None  # nothing raised: the absence is the answer, not an error


@pytest.mark.skipif(ON_NVIDIA_HOST, reason="this host has an NVIDIA GPU")
def test_device_cuda_fails_before_any_vllm_engine_starts():
    """`omni-backends run --device cuda` exits with the probe's reason; neither vLLM nor torch was imported."""
    code = (
        "import sys\n"
        "from omni_backends.cli import main\n"
        "try:\n    rc = main(['run', '--device', 'cuda'])\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "print('RC', rc, 'VLLM', 'vllm' in sys.modules, 'TORCH', 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMNI_BACKENDS_DEVICE"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    out = res.stdout + res.stderr
    assert "device 'cuda' was requested" in out and "not usable here" in out, out
    assert "omni-backends[cuda]" in out, out
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("RC ") and not last.startswith("RC 0"), last
    assert "VLLM False" in last and "TORCH False" in last, last


def _probe_with(monkeypatch, *, vllm, torch="2.14.0", gpus=1, visible=None):
    monkeypatch.setattr(cuda_driver, "versions_of", lambda reqs: {"vllm": vllm, "torch": torch})
    monkeypatch.setattr(cuda_driver, "dist_version", lambda name: None)
    monkeypatch.setattr(cuda_driver, "nvidia_gpu_count", lambda: (gpus, "NVML"))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return CudaBackend.probe()


def test_probe_states(monkeypatch):
    """Probe decisions for the environments it must tell apart (the environment is simulated, the logic is real)."""
    r = _probe_with(monkeypatch, vllm="0.33.0", gpus=2)
    assert r.state is ProbeState.USABLE and r.device_count == 2 and "vLLM 0.33.0" in r.reason
    r = _probe_with(monkeypatch, vllm="0.33.0", gpus=0)
    assert r.state is ProbeState.IMPORTABLE and "no NVIDIA GPU" in r.reason
    r = _probe_with(monkeypatch, vllm="0.33.0", torch="2.11.0", gpus=1)  # the probe checks each range, not the pairing
    assert r.state is ProbeState.USABLE
    r = _probe_with(monkeypatch, vllm="0.34.0", gpus=1)
    assert r.state is ProbeState.IMPORTABLE and "vllm 0.34.0 is installed but vllm>=0.26,<0.34 is required" in r.reason
    r = _probe_with(monkeypatch, vllm="0.33.0", torch="2.15.0", gpus=1)
    assert r.state is ProbeState.IMPORTABLE and "torch 2.15.0 is installed but torch>=2.11,<2.15" in r.reason
    r = _probe_with(monkeypatch, vllm="0.33.0", gpus=1, visible="")
    assert r.state is ProbeState.IMPORTABLE and "hides every GPU" in r.reason
    r = _probe_with(monkeypatch, vllm="0.33.0", gpus=2, visible="3")
    assert r.state is ProbeState.IMPORTABLE and "(2 present)" in r.reason and "below 2" in r.fix
    r = _probe_with(monkeypatch, vllm="0.33.0", gpus=4, visible="2,0")
    assert r.state is ProbeState.USABLE and r.device_count == 2
    r = _probe_with(monkeypatch, vllm=None, gpus=1)
    assert r.state is ProbeState.NOT_INSTALLED and r.device_count == 1


@pytest.mark.parametrize("vllm,torch", [("0.26.0", "2.11.0+cu130"), ("0.27.1", "2.13.0"), ("0.32.0", "2.13.0"),
                                         ("0.33.0", "2.14.0")])
def test_probe_accepts_the_version_window(monkeypatch, vllm, torch):
    r = _probe_with(monkeypatch, vllm=vllm, torch=torch, gpus=1)
    assert r.state is ProbeState.USABLE, r.reason


@pytest.mark.parametrize("vllm,torch", [("0.25.1", "2.11.0"), ("0.34.0", "2.14.0"), ("0.26.0", "2.10.0")])
def test_version_outside_the_window_is_reported_and_refused_with_the_fix(monkeypatch, vllm, torch):
    """Outside the window: ``devices`` reports it (importable, not usable) and an explicit --device cuda is refused."""
    from omni_backends.errors import DeviceNotUsableError
    from omni_backends.registry import decide

    r = _probe_with(monkeypatch, vllm=vllm, torch=torch, gpus=1)
    assert r.state is ProbeState.IMPORTABLE
    assert "the cuda driver supports vLLM >=0.26,<0.34 with torch >=2.11,<2.15" in r.reason
    assert "pip install 'omni-backends[cuda]'" in r.fix
    with pytest.raises(DeviceNotUsableError, match=r"device 'cuda' was requested .* not usable here: .*is required.*"
                                                   r"To fix: install a vLLM CUDA build inside the window"):
        decide("cuda", env={})


def test_cuda_extra_states_the_driver_window():
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["cuda"]
    assert f"vllm{cuda_driver.VLLM_WINDOW}" in extra
    assert CudaBackend.vendor_requirements == {"vllm": cuda_driver.VLLM_WINDOW, "torch": cuda_driver.TORCH_WINDOW}


def test_probe_never_raises(monkeypatch):
    def boom():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(cuda_driver, "nvidia_gpu_count", boom)
    r = CudaBackend.probe()
    assert r.state is ProbeState.NOT_INSTALLED and "libnvidia-ml" in r.reason and r.error


def test_gpu_count_without_torch():
    code = "import sys\nfrom omni_backends.cuda.driver import nvidia_gpu_count\nprint(nvidia_gpu_count()[0], 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert out[1] == "False"
    if ON_NVIDIA_HOST:
        assert int(out[0]) >= 1
    else:
        assert out[0] == "0"


def test_runner_bases_name_the_missing_stack(monkeypatch):
    """Without vLLM's CUDA build the runner/worker bases fail with what to install."""
    from omni_backends.errors import OmniBackendError

    def missing(self):
        raise ImportError(f"{self.qualname}: No module named 'vllm.v1.worker.gpu'")

    monkeypatch.setattr(cuda_driver.VendorSymbol, "resolve", missing)
    b = CudaBackend()
    for call in (lambda: b.model_runner_base(), lambda: b.model_runner_base(v2=True), b.worker_base):
        with pytest.raises(OmniBackendError, match=r"omni-backends\[cuda\]"):
            call()


def test_fence_buffer_rejects_unpinned_and_host_device():
    torch = pytest.importorskip("torch")
    import types

    b = CudaBackend()
    with pytest.raises(ValueError, match="must be pinned"):
        b.fence_buffer(types.SimpleNamespace(cpu=torch.zeros(4), gpu=torch.zeros(4)))


@pytest.mark.parametrize("visible", ["0,0", "0,5,1", "x", "2", "0,-1,1", "0,,1", " 1 , 0 ", "GPU-3f2a,1", "1,0", "-1", ""])
def test_probe_and_placement_read_cuda_visible_devices_alike(monkeypatch, visible):
    """One parser: what the probe counts is what placement maps ranks over, and a list
    placement refuses is not usable for the probe (before, the probe read CUDA's lenient
    prefix rule: "0,0" or "0,5,1" probed usable with one GPU, then placement refused them)."""
    from omni_backends.placement import PlacementError, visible_devices

    r = _probe_with(monkeypatch, vllm="0.33.0", gpus=2, visible=visible)
    try:
        ids = visible_devices(CudaBackend, {"CUDA_VISIBLE_DEVICES": visible}, device_count=2).ids
    except PlacementError as exc:
        assert r.state is ProbeState.IMPORTABLE and r.device_count == 0
        assert str(exc) in r.reason and "(2 present)" in r.reason and "below 2" in r.fix
        return
    if ids:
        assert r.state is ProbeState.USABLE and r.device_count == len(ids)
    else:
        assert r.state is ProbeState.IMPORTABLE and "hides every GPU" in r.reason


def test_cuda_engines_run_without_vllms_aot_compile_cache_unless_the_user_chose():
    # the H200, vLLM 0.26 (ci/logs/h200-2026-12-02-summary-99266e1-65439dc.md): the talker engine failed at
    # every warm start from vLLM's AOT compile cache (4 of 5 main jobs exit 3); with it off five main jobs exit 0
    # with identical out.wav
    from omni_backends.registry import Selection, export_selection

    sel = Selection("cuda", "explicit", "--device", [], [], {}, backend=CudaBackend())
    env: dict[str, str] = {}
    export_selection(sel, env)
    assert env["VLLM_USE_AOT_COMPILE"] == "0" and env["VLLM_TARGET_DEVICE"] == "cuda"
    env = {"VLLM_USE_AOT_COMPILE": "1"}
    assert "VLLM_USE_AOT_COMPILE" not in export_selection(sel, env) and env["VLLM_USE_AOT_COMPILE"] == "1"
