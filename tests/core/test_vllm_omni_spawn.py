"""vLLM-Omni's classes in an engine core vLLM *spawned* (``core.models.vllm_omni``'s pickling).

vLLM hands its ``VllmConfig`` to the engine-core process by pickle, and the model's ``hf_config`` is
vLLM-Omni's ``Qwen3TTSConfig``: unpickled by reference it imports the real ``vllm_omni`` package (its
``__init__`` runs ``patch.py``) in that process before any vLLM plugin runs there. The engine here runs in
vLLM's multiprocess engine (``VLLM_ENABLE_V1_MULTIPROCESSING=1``; the cpu platform spawns), started from a
``python -c`` script -- no ``__mp_main__`` module, so nothing but the core's loader can prepare the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.models import vllm_omni

pytestmark = [pytest.mark.device_cpu, pytest.mark.skipif(vllm_omni.installed_version() is None,
                                reason="vllm-omni is not installed (scripts/setup.sh test installs it)")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = r"""
import json, os, sys
from tests.core import qwen3_tts_scenarios as sc  # it sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for its own runs
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the engine core in a process of its own, spawned
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the probe below is a function (cloudpickled)
import torch
from tests.fixtures.qwen3_tts.tiny_checkpoint import CODEBOOK, NUM_CODE_GROUPS, create_tiny_qwen3_tts

def probe(worker):
    import os, sys
    pkg = sys.modules.get("vllm_omni")
    model = worker.model_runner.get_model()
    cfg = worker.model_runner.model_config.hf_config
    return {"pid": os.getpid(), "bare": getattr(pkg, "__omni_bare__", False) if pkg is not None else None,
            "patch_loaded": "vllm_omni.patch" in sys.modules,
            "model_class": [type(model).__module__, type(model).__qualname__],
            "hf_config": [type(cfg).__module__, type(cfg).__qualname__, cfg.model_type],
            "upsample": int(model._total_upsample)}

create_tiny_qwen3_tts(sys.argv[1])
llm = sc.code2wav_engine(sys.argv[1])
frames = torch.randint(0, CODEBOOK, (6, NUM_CODE_GROUPS), generator=torch.Generator().manual_seed(5))
wav = sc.synthesize(llm, [frames])[0]["model_outputs"]
print("RESULT " + json.dumps({"parent_pid": os.getpid(), "core": llm.collective_rpc(probe)[0],
                              "frames": 6, "samples": int(wav.numel()), "std": float(wav.float().std())}))
"""


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    env.pop("OMNI_BACKENDS_SELECTION", None)
    out = str(tmp_path_factory.mktemp("qwen3tts-spawn") / "tiny")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, out], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_the_spawned_engine_core_has_vllm_omni_bare_and_unpatched(spawned: dict) -> None:
    core = spawned["core"]
    assert core["pid"] != spawned["parent_pid"]  # the engine core is another process
    assert core["bare"] is True and core["patch_loaded"] is False
    assert core["hf_config"] == ["vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts",
                                 "Qwen3TTSConfig", "qwen3_tts"]
    assert core["model_class"] == ["vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code2wav",
                                   "Qwen3TTSCode2Wav"]


def test_the_spawned_engine_synthesises(spawned: dict) -> None:
    assert spawned["samples"] == spawned["frames"] * spawned["core"]["upsample"]
    assert spawned["std"] > 1e-3  # a real signal, not a placeholder


def test_a_vllm_omni_config_pickles_through_the_loader() -> None:
    """In-process control of the same path: the pickle names the loader's rebuild function, not
    ``vllm_omni``, and comes back equal."""
    import copy
    import pickle

    pytest.importorskip("transformers")
    from core.models import qwen3_tts

    cls = qwen3_tts.config_class()
    cfg = cls()
    data = pickle.dumps(cfg)
    assert b"core.models.vllm_omni" in data and b"_rebuild_config" in data
    assert b"vllm_omni.model_executor" not in data
    back = pickle.loads(data)
    assert type(back) is cls and back.to_dict() == cfg.to_dict()
    copied = copy.deepcopy(cfg)
    assert type(copied) is cls and copied.to_dict() == cfg.to_dict()
    assert type(copied.talker_config) is type(cfg.talker_config) and copied.talker_config is not cfg.talker_config
