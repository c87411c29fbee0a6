"""check-drift names the vendor symbols a driver imports directly instead of declaring them as VendorSymbols
(issue 38: such an import escapes the check; the example driver had one)."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from omni_backends.drift.cli import render_text, run_check
from omni_backends.drift.declarations import undeclared_vendor_imports


def test_a_direct_vendor_import_in_the_driver_package_is_named(tmp_path, monkeypatch):
    pkg = tmp_path / "omni_fake_vendor_drv"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("import os\n\n\ndef ready():\n    import vllm.platforms\n    return vllm.platforms\n")
    (pkg / "driver.py").write_text(textwrap.dedent("""
        from omni_backends.cpu.driver import CpuBackend


        class FakeDrv(CpuBackend):
            name = "fake-drv"

            def wrap_graph(self, runnable, vllm_config, runtime_mode):
                from vllm.forward_context import is_forward_context_available  # escapes check-drift
                return runnable
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m.startswith("omni_fake_vendor_drv")]:
        monkeypatch.delitem(sys.modules, mod)
    cls = importlib.import_module("omni_fake_vendor_drv.driver").FakeDrv
    found = undeclared_vendor_imports(cls)
    assert [f.split(": ", 1)[1] for f in found] == ["from vllm.forward_context import is_forward_context_available",
                                                   "import vllm.platforms"], found
    assert found[0].split(":")[0].endswith("omni_fake_vendor_drv/driver.py")


@pytest.mark.parametrize("module, cls", [("omni_backends.cpu.driver", "CpuBackend"),
                                         ("omni_backends.cuda.driver", "CudaBackend"),
                                         ("omni_backends.ascend.driver", "AscendBackend"),
                                         ("omni_backends.xpu.driver", "XpuBackend")])
def test_the_in_tree_drivers_import_no_vendor_symbol_directly(module, cls):
    assert undeclared_vendor_imports(getattr(importlib.import_module(module), cls)) == []


def test_check_drift_reports_them_for_the_example_driver():
    pytest.importorskip("omni_simdev")
    report = run_check(["simdev"], contracts=[])
    (simdev,) = report["drivers"]
    assert simdev["undeclared_imports"] == []  # it declares is_forward_context_available
    report["drivers"][0]["undeclared_imports"] = ["omni_simdev/driver.py:52: from vllm.x import y"]
    assert "[note: undeclared-import] omni_simdev/driver.py:52: from vllm.x import y -- NOT checked" in render_text(report)
