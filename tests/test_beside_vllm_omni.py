"""omni-backends beside vLLM-Omni: a vLLM-Omni user's environment -- the ``vllm-omni`` 0.30 wheel (in ``.venv``)
and its pure-Python dependencies (``.vllm-omni-deps``, built by ``scripts/setup.sh test``; torchvision,
torchaudio and av cannot be installed on the cpu stack) -- with omni-backends installed.

- a normal ``import vllm_omni`` and then vLLM's plugin loading (vLLM-Omni's plugin and ours) work: ours
  registers the demo models and does not raise; ``from vllm_omni import Omni`` gets as far as the cpu stack
  allows (it stops only at torchvision, named);
- the main process of ``run`` / ``serve`` (the stage graph's start) keeps vLLM-Omni's plugin out before vLLM
  loads its general plugins, so ``vllm_omni``'s patches never run there;
- an engine started there (``core.stage.make_engine``, its engine core in a process of its own, the worker in
  it): neither process imported ``vllm_omni`` normally and vLLM's request class is vLLM's own, and its greedy
  tokens equal those of the same engine outside the environment.

vLLM-Omni 0.30 imports one name vLLM 0.32 removed (``RoutedExpertsLists``); the environment's start-up hook
(``tests/fixtures/vllm_omni_beside/sitecustomize.py``) places it back, nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPS = Path(os.environ.get("OMNI_BACKENDS_VLLM_OMNI_DEPS") or ROOT / ".vllm-omni-deps")
HOOK = ROOT / "tests" / "fixtures" / "vllm_omni_beside"
#: what cannot be installed beside torch 2.13.0+cpu (binary builds), the first of them ``Omni`` needs
NOT_INSTALLABLE = ("torchvision", "torchaudio", "av")

pytestmark = pytest.mark.skipif(not (DEPS / "omegaconf").is_dir(),
                                reason=f"vLLM-Omni's dependencies are not in {DEPS} (scripts/setup.sh test builds them)")


def _need_wheel() -> None:
    from core.models.vllm_omni import installed_version

    if installed_version() is None:  # never imported here: its patches would apply to this test process
        pytest.skip("the vllm-omni wheel is not installed (scripts/setup.sh test installs it)")


def _env(beside: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "OMNI_BACKENDS_ENGINE_OWNER")}
    path = [str(HOOK), str(ROOT), str(DEPS)] if beside else [str(ROOT)]
    env.update(PYTHONPATH=os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]), VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_LOGGING_LEVEL="ERROR")
    return env


def _python(code: str, beside: bool = True, timeout: float = 600) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], env=_env(beside), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vllm_plugin_loading_works_after_a_normal_import_of_vllm_omni():
    _need_wheel()
    got = _python("""
import json, vllm_omni
from vllm.plugins import load_general_plugins
load_general_plugins()  # vLLM-Omni's plugin and omni-backends' (core.models:register)
from vllm.model_executor.models.registry import ModelRegistry
archs = set(ModelRegistry.get_supported_archs())
try:
    from vllm_omni import Omni
    omni = "ok"
except ImportError as exc:
    omni = f"{type(exc).__name__}: {exc.name}"
print(json.dumps({"demo": "OmniDemoThinker" in archs, "omni": omni,
                  "vllm_omni_archs": "Qwen3TTSTalkerForConditionalGeneration" in archs}))
""")
    assert got["demo"] and got["vllm_omni_archs"], got
    assert got["omni"] == "ok" or got["omni"] == f"ModuleNotFoundError: {NOT_INSTALLABLE[0]}", got


def test_the_stage_graph_start_keeps_vllm_omni_out_before_vllm_loads_its_plugins(tmp_path):
    """What ``run`` and ``serve`` do in their main process (``StageGraph.start``), up to the first engine (a
    factory that refuses to build one stops it there)."""
    _need_wheel()
    from core.models.create import create_demo_models

    create_demo_models(str(tmp_path / "demo"))
    got = _python(f"""
import asyncio, json, os, sys
import core.stage
from core.pipeline.config import GraphConfig
from core.pipeline.graph.engines import start_engines

def refuse(model, **kw):
    raise ValueError("no engine in this test")

core.stage.make_async_engine = refuse
try:
    asyncio.run(start_engines(GraphConfig(model_dir={str(tmp_path / "demo")!r}, device="cpu")))
except Exception as exc:
    assert "no engine in this test" in str(exc), exc
import vllm.plugins
from core.models.vllm_omni import imported_normally
print(json.dumps({{"loaded": vllm.plugins.plugins_loaded, "vllm_omni": imported_normally(),
                  "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS")}}))
""")
    assert got["loaded"] and got["vllm_omni"] is False, got
    assert "vllm_omni_register_models" not in got["VLLM_PLUGINS"] and "omni_backends_models" in got["VLLM_PLUGINS"]


ENGINE = """
import json, os
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the engine core in a process of its own
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc(probe): a function, pickled
from core.stage import make_engine
from vllm import SamplingParams

def probe(worker):
    import os, sys
    from core.models.vllm_omni import imported_normally
    import vllm.v1.engine as e
    return {"pid": os.getpid(), "vllm_omni": imported_normally(),
            "request_cls": f"{e.EngineCoreRequest.__module__}.{e.EngineCoreRequest.__qualname__}"}

llm = make_engine(os.path.join(DEMO, "thinker"), device="cpu", dtype="float32", enforce_eager=True,
                  max_model_len=128, max_num_seqs=2, seed=0)
tokens = llm.generate(["Hello omni models"], SamplingParams(max_tokens=8, temperature=0.0),
                      use_tqdm=False)[0].outputs[0].token_ids
from core.models.vllm_omni import imported_normally
import vllm.v1.engine as e
print(json.dumps({"main": {"pid": os.getpid(), "vllm_omni": imported_normally(),
                           "request_cls": f"{e.EngineCoreRequest.__module__}.{e.EngineCoreRequest.__qualname__}"},
                  "worker": llm.collective_rpc(probe)[0], "tokens": list(tokens)}))
"""


@pytest.mark.slow
def test_an_engine_beside_vllm_omni_is_untouched_by_its_patches_and_generates_the_same(tmp_path):
    _need_wheel()
    from core.models.create import create_demo_models

    create_demo_models(str(tmp_path / "demo"))
    code = f"DEMO = {str(tmp_path / 'demo')!r}\n" + ENGINE
    procs = {beside: subprocess.Popen([sys.executable, "-c", code], env=_env(beside), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for beside in (True, False)}  # both at once: the wall time of one
    out = {}
    for beside, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-4000:]
        out[beside] = json.loads(stdout.strip().splitlines()[-1])
    beside, plain = out[True], out[False]
    for where in ("main", "worker"):
        assert beside[where]["vllm_omni"] is False, beside
        assert beside[where]["request_cls"] == "vllm.v1.engine.EngineCoreRequest", beside
    assert beside["worker"]["pid"] != beside["main"]["pid"]  # the engine core's process (the worker runs in it)
    assert beside["tokens"] == plain["tokens"] and len(plain["tokens"]) == 8
