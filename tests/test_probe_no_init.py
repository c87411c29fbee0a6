"""Probing the ``--device`` driver initialises neither torch nor the device runtime (issue 5).

Run in a fresh interpreter: ``probe()``, then check that torch (and vLLM)
were not imported by it, then import torch and check that the device
runtime is still uninitialised (``torch.cuda.is_initialized()`` is False).
Repository-only: it reads the runtime through ``torch.<device_type>``, as this
repository's drivers name it; the kit's ``probe`` contract is the vendor-facing
check. Takes the kit's ``backend`` (skips where the device is absent).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.device_tier

SCRIPT = r"""
import importlib, json, sys
mod, qual, dev = sys.argv[1:4]
cls = getattr(importlib.import_module(mod), qual)
probe = cls.probe()
out = {"probe": probe.to_json(), "torch_imported_by_probe": "torch" in sys.modules,
       "vllm_imported_by_probe": "vllm" in sys.modules}
import torch
runtime = getattr(torch, dev, None) if dev != "cpu" else None  # torch.cpu.is_initialized() is always True
out["runtime_initialized"] = bool(runtime.is_initialized()) if hasattr(runtime, "is_initialized") else None
print(json.dumps(out))
"""


def test_probe_does_not_initialise_the_device(backend):
    cls = type(backend)
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, cls.__module__, cls.__qualname__, cls.device_type],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))
    assert out["torch_imported_by_probe"] is False
    assert out["vllm_imported_by_probe"] is False
    if out["runtime_initialized"] is not None:
        assert out["runtime_initialized"] is False
    # the probe saw the device without initialising it
    assert out["probe"]["device_count"] >= 1
    assert out["probe"]["reason"]
