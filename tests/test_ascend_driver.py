"""Ascend (npu) driver: argument mapping, graphs, buffers and probing, on CPU.

No NPU, CANN or vllm-ascend exists here. Vendor calls go to recording
stand-ins with the real vendor signatures (``simulated.vendor_signatures``,
checked against the vllm-ascend 0.23.0.post1 and 0.26.0rc1 sources by
``test_drift_vendor_sources.py``); copies run on the simulated device whose
copy engine completes late and out of order (``simulated.device``).
"""

from __future__ import annotations

import types

import pytest
import torch

from omni_backends.ascend import driver as ascend
from omni_backends.ascend.driver import AscendBackend, ascend_forward_context_kwargs
from omni_backends.backend import Backend, ProbeState, Verification
from omni_backends.errors import DeviceNotUsableError, OmniBackendError
from simulated import vendor_signatures as vs
from simulated.device import CopyEngine, SimCpuGpuBuffer
from simulated.metadata import fake_dists

FULL, PIECEWISE, NONE = (types.SimpleNamespace(name=n) for n in ("FULL", "PIECEWISE", "NONE"))


@pytest.fixture
def npu():
    return AscendBackend(load_vendor=False)


def test_identity_and_labels():
    assert not AscendBackend.__abstractmethods__
    assert issubclass(AscendBackend, Backend)
    assert (AscendBackend.name, AscendBackend.aliases, AscendBackend.device_type) == ("npu", ("ascend",), "npu")
    assert AscendBackend.dist_backend == "hccl"
    assert AscendBackend.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert AscendBackend.verification == (Verification.STATIC, Verification.SIMULATED)
    caps = AscendBackend(load_vendor=False).capabilities()
    assert caps.h2d_stream_ordered is False and caps.pinned_memory and caps.static_graphs


# ------------------------------------------------------------ forward context
def test_forward_context_maps_vllm_arguments_onto_set_ascend_forward_context(npu, monkeypatch):
    rec = vs.Recorder(vs.set_ascend_forward_context)
    vs.install_module(monkeypatch, "vllm_ascend.ascend_forward_context", set_ascend_forward_context=rec)
    model, meta, cfg, dp, desc = object(), {"layer.0": "m"}, object(), torch.tensor([5, 7]), object()
    with npu.forward_context(meta, cfg, num_tokens=8, num_tokens_across_dp=dp, cudagraph_runtime_mode=FULL,
                             batch_descriptor=desc, slot_mapping={"layer.0": torch.arange(8)}, skip_compiled=True,
                             num_actual_tokens=6, model=model, is_profile=True):
        pass
    (call,) = rec.calls
    assert call["attn_metadata"] is meta and call["vllm_config"] is cfg
    assert call["num_tokens"] == 8 and call["num_tokens_across_dp"] is dp
    assert call["aclgraph_runtime_mode"] is FULL  # renamed from cudagraph_runtime_mode
    assert call["in_profile_run"] is True  # from is_profile
    assert call["model_instance"] is model  # from model
    assert call["num_actual_tokens"] == 6 and call["batch_descriptor"] is desc and call["skip_compiled"] is True
    assert call["is_draft_model"] is False  # untouched vendor extras keep their defaults


def test_forward_context_none_values_keep_vendor_defaults(npu, monkeypatch):
    rec = vs.Recorder(vs.set_ascend_forward_context)
    vs.install_module(monkeypatch, "vllm_ascend.ascend_forward_context", set_ascend_forward_context=rec)
    with npu.forward_context(None, "cfg"):
        pass
    (call,) = rec.calls
    assert call["num_tokens"] == 0  # vendor default, not None
    assert repr(call["aclgraph_runtime_mode"]) == "CUDAGraphMode.NONE"
    assert call["in_profile_run"] is False and call["model_instance"] is None


def test_mapping_output_binds_to_the_vendor_signature():
    # every keyword the mapping can produce is a parameter of the real function
    kwargs = ascend_forward_context_kwargs("m", "c", num_tokens=1, num_tokens_across_dp=None,
                                           cudagraph_runtime_mode=PIECEWISE, batch_descriptor=None, slot_mapping={},
                                           skip_compiled=False, is_padding=None, num_actual_tokens=1, model=None,
                                           is_profile=False)
    vs.Recorder(vs.set_ascend_forward_context)(**kwargs)
    assert "slot_mapping" not in kwargs and "is_padding" not in kwargs and "cudagraph_runtime_mode" not in kwargs


def test_forward_context_refuses_micro_batching(npu):
    with pytest.raises(OmniBackendError, match="ubatch_slices"):
        npu.forward_context(None, "cfg", ubatch_slices=[object()])
    with pytest.raises(TypeError):
        ascend_forward_context_kwargs(None, "cfg", not_a_vllm_argument=1)
    with pytest.raises(TypeError):  # the spec's signature, not **kwargs: a typo fails at the call
        npu.forward_context(None, "cfg", cudagraph_mode=FULL)


# --------------------------------------------------------------------- graphs
def test_wrap_graph_uses_acl_graph_wrapper(npu, monkeypatch):
    made = []

    def make(args):
        made.append(types.SimpleNamespace(args=args))
        return made[-1]

    rec = vs.Recorder(vs.ACLGraphWrapper, returns=make)
    vs.install_module(monkeypatch, "vllm_ascend.compilation.acl_graph", ACLGraphWrapper=rec)

    def runnable(x):
        return x

    wrapped = npu.wrap_graph(runnable, "cfg", FULL)
    assert wrapped is made[0] and rec.calls[0]["runnable"] is runnable and rec.calls[0]["runtime_mode"] is FULL
    assert npu.wrap_graph(runnable, "cfg", NONE) is runnable  # the vendor wrapper asserts mode != NONE
    assert npu.wrap_graph(runnable, "cfg", None) is runnable
    assert len(made) == 1


def test_wrap_graph_returns_runnable_when_graph_capability_is_off(monkeypatch):
    from omni_backends.backend import Capabilities

    monkeypatch.setattr(AscendBackend, "capabilities", lambda self: Capabilities(static_graph_modes=()))
    vs.install_module(monkeypatch, "vllm_ascend.compilation.acl_graph",
                      ACLGraphWrapper=lambda *a, **k: pytest.fail("wrapper built with graphs off"))

    def runnable():
        return 1

    assert AscendBackend(load_vendor=False).wrap_graph(runnable, "cfg", FULL) is runnable


def test_graph_capture_context_is_vllm_ascend_graph_capture(npu, monkeypatch):
    rec = vs.Recorder(vs.ascend_graph_capture)
    vs.install_module(monkeypatch, "vllm_ascend.worker.model_runner_v1", graph_capture=rec)
    with npu.graph_capture_context("npu:0"):
        pass
    assert rec.calls == [{"device": "npu:0"}]


# -------------------------------------------------------------- sampler, bases
def test_sampler_and_bases_resolve_vendor_classes(npu, monkeypatch):
    topk = types.SimpleNamespace(set_q_event=lambda q, e: ("q", q, e))  # AscendTopKTopPSampler's own method
    rec = vs.Recorder(vs.AscendSampler, returns=lambda a: types.SimpleNamespace(mode=a["logprobs_mode"],
                                                                                 topk_topp_sampler=topk))
    vs.install_module(monkeypatch, "vllm_ascend.sample.sampler", AscendSampler=rec)
    sampler = npu.make_sampler("processed_logprobs")
    assert sampler.mode == "processed_logprobs"
    # the one-token rule wraps AscendSampler.topk_topp_sampler; the vendor's methods still reach it
    assert sampler.topk_topp_sampler.inner is topk and sampler.topk_topp_sampler.set_q_event(1, 2) == ("q", 1, 2)
    assert npu.prepare_sampler(sampler) is sampler and sampler.topk_topp_sampler.inner is topk
    v1, v2, worker = type("V1", (), {}), type("V2", (), {}), type("W", (), {})
    vs.install_module(monkeypatch, "vllm_ascend.worker.model_runner_v1", NPUModelRunner=v1)
    vs.install_module(monkeypatch, "vllm_ascend.worker.v2.model_runner", NPUModelRunner=v2)
    vs.install_module(monkeypatch, "vllm_ascend.worker.worker", NPUWorker=worker)
    _install_model_state_patch(monkeypatch)
    assert (npu.model_runner_base(), npu.model_runner_base(v2=True), npu.worker_base()) == (v1, v2, worker)


def _install_model_state_patch(monkeypatch, applied: bool = True):
    """vllm-ascend's V2 state modules as stand-ins; ``applied``: its patch rebinds vLLM's runner
    ``init_model_state`` to ``init_asecnd_model_state`` (what ``NPUWorker.__init__``'s ``adapt_patch()`` does)."""
    import vllm.v1.worker.gpu.model_runner as runner_mod

    def init_asecnd_model_state(vllm_config, model, encoder_cache, device):
        return ("AscendModelState", model)

    vs.install_module(monkeypatch, "vllm_ascend.worker.v2.model_states", init_asecnd_model_state=init_asecnd_model_state)
    if applied:
        monkeypatch.setattr(runner_mod, "init_model_state", init_asecnd_model_state)
    return init_asecnd_model_state


def test_v2_base_is_refused_when_vllm_ascends_model_state_patch_is_not_applied(npu, monkeypatch):
    """Without vllm-ascend's patch, vLLM's V2 runner would build its DefaultModelState (whose prepare_attn is
    not the NPU one) and the omni hooks would compose with that: refused, naming the patch and the fix."""
    v2 = type("V2", (), {})
    vs.install_module(monkeypatch, "vllm_ascend.worker.v2.model_runner", NPUModelRunner=v2)
    _install_model_state_patch(monkeypatch, applied=False)
    with pytest.raises(OmniBackendError, match=r"vllm.v1.worker.gpu.model_states.init_model_state, not vllm-ascend's "
                                               r"vllm_ascend.worker.v2.model_states.init_asecnd_model_state.*"
                                               r"patch_v2.patch_model_state is not applied.*AscendModelState.*"
                                               r"prepare_attn.*adapt_patch.*VLLM_USE_V2_MODEL_RUNNER=0"):
        npu.model_runner_base(v2=True)
    _install_model_state_patch(monkeypatch)
    assert npu.model_runner_base(v2=True) is v2


# ------------------------------------------------------------ V2 runner gate
ASCEND_0_23 = {"vllm-ascend": "0.23.0.post1", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "vllm": "0.23.0"}
ASCEND_0_26 = {"vllm-ascend": "0.26.0rc1", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "vllm": "0.26.0"}


@pytest.mark.parametrize("versions, v2", [
    (ASCEND_0_23, False),  # vLLM 0.23's V2 runner never calls ModelState.remove_request
    (ASCEND_0_26, True),  # vLLM 0.26's calls every state seam on AscendModelState (test_drift_vendor_sources.py)
    ({**ASCEND_0_26, "vllm": "0.23.0"}, False),  # not a verified pair
    ({**ASCEND_0_23, "vllm-ascend": "0.25.1rc1", "vllm": "0.25.1"}, False),  # inside the window, not verified
], ids=["0.23", "0.26", "0.26-on-vllm-0.23", "0.25"])
def test_v2_runner_only_on_a_verified_stack_whose_runner_calls_every_state_seam(tmp_path, monkeypatch, versions, v2):
    fake_dists(tmp_path, monkeypatch, versions)
    assert AscendBackend(load_vendor=False).capabilities().v2_runner is v2
    note = ascend.v2_runner_note(versions)
    assert note.startswith(f"V2 runner: {'yes' if v2 else 'no'} (")
    if versions == ASCEND_0_23:
        assert "has no remove_request" in note and "state-override-never-called" in note


def test_v2_runner_is_off_where_vllm_ascend_is_not_installed(npu):
    assert npu.capabilities().v2_runner is False  # this box: no vllm-ascend
    assert ascend.stack_of({}) is None


def test_probe_refuses_a_pair_that_is_not_a_verified_stack_with_the_fix(tmp_path, monkeypatch):
    fake_dists(tmp_path, monkeypatch, {**ASCEND_0_26, "vllm": "0.23.0"})
    probe = AscendBackend.probe()
    assert probe.state is ProbeState.INSTALLED and not probe.usable
    assert "vllm-ascend 0.26.0rc1 with vllm 0.23.0 is not a verified stack" in probe.reason
    assert "vllm 0.23.0 is installed but vllm>=0.26,<0.27 is required" in probe.reason
    assert probe.fix == "pip install 'vllm>=0.26,<0.27'"


@pytest.mark.parametrize("versions, says", [(ASCEND_0_23, "V2 runner: no (vLLM 0.23's V2 ModelState has no remove_request"),
                                            (ASCEND_0_26, "V2 runner: yes (vLLM 0.26's V2 runner calls remove_request")])
def test_usable_probe_says_whether_the_v2_runner_runs_and_why(tmp_path, monkeypatch, versions, says):
    fake_dists(tmp_path, monkeypatch, versions)
    monkeypatch.setattr(ascend, "device_nodes", lambda pattern: ["/dev/davinci0"])
    monkeypatch.setattr(ascend, "find_shared_library", lambda name, dirs=(): "/usr/local/Ascend/lib64/libhccl.so")
    npu_mod = types.SimpleNamespace(device_count=lambda: 1)
    monkeypatch.setattr(ascend, "TORCH_NPU", types.SimpleNamespace(resolve=lambda: types.SimpleNamespace(npu=npu_mod)))
    probe = AscendBackend.probe()
    assert probe.usable, probe.reason
    assert f"vllm-ascend {versions['vllm-ascend']} on vllm {versions['vllm']}; {says}" in probe.reason


# -------------------------------------------------------------------- buffers
def test_make_buffer_pins_per_vendor_platform(npu, monkeypatch):
    from vllm.v1.utils import CpuGpuBuffer  # the real class, on CPU here

    seen = []
    vs.install_module(monkeypatch, "vllm_ascend.platform",
                      NPUPlatform=types.SimpleNamespace(is_pin_memory_available=lambda: seen.append(1) or False))
    monkeypatch.setattr(AscendBackend, "device", lambda self, index=None: torch.device("cpu"))
    buf = npu.make_buffer(4, 3, dtype=torch.int32)
    assert isinstance(buf, CpuGpuBuffer) and buf.cpu.shape == (4, 3) and buf.np.shape == (4, 3)
    assert seen == [1] and not buf.cpu.is_pinned()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_h2d_copies_not_ordered_no_stale_reads_no_in_flight_reuse(npu, seed):
    """200 steps on the simulated device: each step rewrites the host buffer,
    copies it through the driver and has the "next kernel" read the device side."""
    engine = CopyEngine(seed=seed, max_delay=4)
    buf = SimCpuGpuBuffer(64, dtype=torch.int64, engine=engine, device_type="npu")
    for step in range(200):
        n = 1 + (step * 7) % 64
        values = torch.arange(n) + 1000 * step
        engine.host_write(buf.cpu[:n], values)
        dev = npu.copy_to_device(buf, n)
        assert torch.equal(dev.read(), values), f"stale device data at step {step}"
    assert engine.violations == []
    assert engine.pending == [] and engine.blocking == 200


def test_simulated_device_catches_the_unguarded_copy():
    """Negative control: vLLM's plain non-blocking ``copy_to_gpu`` on the same device
    shows stale reads and in-flight source reuse, so the test above can fail."""
    engine = CopyEngine(seed=0, max_delay=4)
    buf = SimCpuGpuBuffer(64, dtype=torch.int64, engine=engine, device_type="npu")
    stale = 0
    for step in range(200):
        values = torch.arange(64) + 1000 * step
        engine.host_write(buf.cpu, values)
        if not torch.equal(buf.copy_to_gpu().read(), values):
            stale += 1
    assert stale > 50 and len(engine.violations) > 50


# -------------------------------------------------------------------- probing
def test_probe_not_usable_here_names_what_is_missing():
    probe = AscendBackend.probe()
    assert not probe.usable and probe.state is ProbeState.NOT_INSTALLED
    assert "vllm-ascend" in probe.reason and "torch-npu" in probe.reason
    assert "CANN" in probe.fix
    # which stacks the driver is verified on, and on which of them the omni V2 runner runs (devices output)
    assert probe.reason.endswith("verified stacks: vllm-ascend>=0.23,<0.24 on vllm>=0.23,<0.24 (V2 runner: no); "
                                 "vllm-ascend>=0.26.0rc1,<0.27 on vllm>=0.26,<0.27 (V2 runner: yes)")


@pytest.mark.parametrize("name", ["npu", "ascend", "NPU"])
def test_selecting_npu_fails_before_any_engine_starts(name):
    from omni_backends.registry import decide

    with pytest.raises(DeviceNotUsableError, match="not usable here: vllm-ascend and torch-npu not installed") as exc:
        decide(name)
    assert exc.value.probe is not None and not exc.value.probe.usable


def test_version_gate_reports_installed_required_and_what_to_install(tmp_path, monkeypatch):
    fake_dists(tmp_path, monkeypatch,
                {"vllm-ascend": "0.22.0", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "vllm": "0.23.0"})
    probe = AscendBackend.probe()
    assert not probe.usable
    assert probe.versions["vllm-ascend"] == "0.22.0"
    assert "vllm-ascend 0.22.0 is installed but vllm-ascend>=0.23,<0.27 is required" in probe.reason
    assert probe.fix == "pip install 'vllm-ascend>=0.23,<0.27'"


def test_version_gate_passes_then_cann_is_what_is_missing(tmp_path, monkeypatch):
    fake_dists(tmp_path, monkeypatch,
                {"vllm-ascend": "0.23.0.post1", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "vllm": "0.23.0"})
    monkeypatch.setattr(ascend, "find_shared_library", lambda name, dirs=(): None)
    probe = AscendBackend.probe()
    assert not probe.usable and probe.state is ProbeState.INSTALLED
    assert "libhccl.so" in probe.reason and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in probe.fix


@pytest.mark.parametrize("device", ["npu", "ascend", "xpu"])
def test_run_with_unusable_device_fails_before_vllm_is_imported(device):
    """``omni-backends run --device npu|ascend|xpu`` exits with the probe's reason
    before anything imports vLLM (so no engine can have started), with exit status 1
    (the README's table: this environment cannot do it; 2 is for usage errors)."""
    import subprocess
    import sys

    code = ("import sys\nfrom omni_backends.cli import build_parser, main\n"
            "parser, _ = build_parser()\n"
            "if 'run' not in parser._subparsers._group_actions[0].choices: print('NO-RUN'); sys.exit(0)\n"
            f"rc = main(['run', '--device', '{device}'])\n"
            "print('RC', rc, 'VLLM-IMPORTED', 'vllm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if "NO-RUN" in out.stdout:
        pytest.skip("the `run` command (core) is not installed")
    assert "RC 1 VLLM-IMPORTED False" in out.stdout, out.stdout + out.stderr
    shown = "'npu' (given as 'ascend')" if device == "ascend" else f"'{device}'"
    assert f"device {shown} was requested" in out.stderr
    assert "not usable here" in out.stderr


def test_probe_reports_oserror_from_torch_npu_on_a_host_without_cann(tmp_path, monkeypatch):
    fake_dists(tmp_path, monkeypatch,
               {"vllm-ascend": "0.23.0.post1", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "vllm": "0.23.0"})
    monkeypatch.setattr(ascend, "device_nodes", lambda pattern: ["/dev/davinci0"])
    monkeypatch.setattr(ascend, "find_shared_library", lambda name, dirs=(): "/usr/local/Ascend/lib64/libhccl.so")

    def fail():
        raise OSError("libascendcl.so: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ascend, "TORCH_NPU", types.SimpleNamespace(resolve=fail))
    probe = AscendBackend.probe()
    assert probe.state is ProbeState.INSTALLED and not probe.usable
    assert "importing torch_npu failed: OSError: libascendcl.so" in probe.reason
    assert probe.error and "OSError" in probe.error


def test_probes_import_neither_torch_nor_vendor_stacks():
    """Probing must not make ``import torch`` fail for anyone: on a host without an
    NPU it imports neither torch nor torch_npu (nor does the XPU probe)."""
    import subprocess
    import sys

    code = ("import sys\nfrom omni_backends.ascend.driver import AscendBackend\nfrom omni_backends.xpu.driver import "
            "XpuBackend\nAscendBackend.probe(); XpuBackend.probe()\n"
            "print(sorted(m for m in ('torch', 'torch_npu', 'vllm', 'vllm_ascend', 'intel_extension_for_pytorch') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
