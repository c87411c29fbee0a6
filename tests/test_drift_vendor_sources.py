"""The drivers' bindings and the recorded stand-in signatures against the real vendor sources.

Needs the vendor wheels, which do not install on this box and are not
downloaded by CI: vLLM 0.33.0, vllm-ascend 0.23.0.post1, torch-npu
2.10.0.post4. Point ``OMNI_BACKENDS_VENDOR_SOURCES`` at them (paths separated
by ``os.pathsep``; wheels, sdists or source trees), or leave them where
docs/drift.md's commands put them (``/tmp/vllm033``, ``/tmp/vllm_ascend_src``,
``/tmp/torchnpu``). Each test skips, saying which source is missing.
"""

from __future__ import annotations

import glob
import inspect
import os

import pytest

from omni_backends import drift
from omni_backends.binding import VendorSymbol
from simulated.vendor_signatures import STANDINS, Src

DEFAULT_GLOBS = ["/tmp/vllm033/vllm-0.33.0-*.whl", "/tmp/vllm_ascend_src/vllm_ascend-0.23.0*.whl",
                 "/tmp/torchnpu/torch_npu-2.10.0*.whl"]


def _sources() -> list[drift.SourceTree]:
    env = os.environ.get("OMNI_BACKENDS_VENDOR_SOURCES")
    paths = env.split(os.pathsep) if env else [p for g in DEFAULT_GLOBS for p in sorted(glob.glob(g))[:1]]
    return [drift.SourceTree(p) for p in paths if p and os.path.exists(p)]


SOURCES = _sources()


def _resolver_for(*tops: str) -> drift.SourceResolver:
    trees = [t for t in SOURCES if any(t.has_top(top) for top in tops)]
    missing = [top for top in tops if not any(t.has_top(top) for t in trees)]
    if missing:
        pytest.skip(f"vendor source for {', '.join(missing)} not available (set OMNI_BACKENDS_VENDOR_SOURCES)")
    return drift.SourceResolver(trees)


def _standin_params(fn) -> list[tuple[str, str, str | None]]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.default is inspect.Parameter.empty:
            default = None
        else:
            default = p.default.text if isinstance(p.default, Src) else repr(p.default)
        out.append((p.name, p.kind.name.lower(), default))
    return out


@pytest.mark.parametrize("key", list(STANDINS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_standin_signature_equals_vendor_source(key):
    module, attr, kind = key
    fn, recorded_from = STANDINS[key]
    resolver = _resolver_for(module.split(".")[0])
    where, params, _ = resolver.resolve(VendorSymbol(module, attr, required=(), kind=kind))
    real = [(p.name, p.kind, p.default) for p in params]
    assert real == _standin_params(fn), f"{recorded_from} changed at {where}: re-record the stand-in"


@pytest.mark.parametrize(("driver", "tops"), [
    ("cpu", ("vllm",)), ("cuda", ("vllm",)), ("xpu", ("vllm",)), ("npu", ("vllm", "vllm_ascend", "torch_npu")),
])
def test_driver_bindings_have_no_drift_against_vendor_sources(driver, tops):
    from omni_backends.registry import discover

    resolver = _resolver_for(*tops)
    entries, _ = discover()
    report = drift.check_declarations(driver, drift.driver_declarations(entries[driver].cls), resolver)
    assert report.drift == [], drift.render_text({
        "mode": "source", "against": resolver.describe(), "date": "", "drift": True, "drivers": [report.to_json()]})
    assert report.checked > 0
