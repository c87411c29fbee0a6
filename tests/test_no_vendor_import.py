"""Importing omni_backends and running ``devices`` imports no vendor stack, not
even torch, and leaves torch's namespace exactly as it was."""

from __future__ import annotations

import json
import textwrap

from fakes.sites import make_site, python

VENDOR = ["torch", "vllm", "vllm_ascend", "torch_npu", "intel_extension_for_pytorch", "triton"]
FAKES = {
    "fake-heavy": {"heavy-caps": "fake_drivers:HeavyCapabilitiesBackend"},
    "fake-low": {"usable-low": "fake_drivers:UsableLowBackend"},
    "fake-boom": {"boom": "fake_boom_oserror:X"},
}

DEVICES_WITHOUT_TORCH = """
import io, json, sys, contextlib
VENDOR = %r
def loaded():
    return sorted(m for m in sys.modules if m.partition(".")[0] in VENDOR)
import omni_backends
after_import = loaded()
from omni_backends.cli import main
from omni_backends import registry
with contextlib.redirect_stdout(io.StringIO()) as text:
    rc_text = main(["devices"])
with contextlib.redirect_stdout(io.StringIO()):
    rc_json = main(["devices", "--json"])
registry.decide()
registry.decide("cpu")
print(json.dumps({"after_import": after_import, "after_devices": loaded(), "rc": [rc_text, rc_json],
                  "text": text.getvalue()}))
"""


def test_import_and_devices_import_no_vendor_stack_nor_torch(tmp_path):
    # a command plugin that imports torch at module level must not be loaded for `devices`
    site = make_site(tmp_path, FAKES, commands={"fake-heavy-cmd": {"heavy": "fake_commands_heavy:add"}})
    proc = python(DEVICES_WITHOUT_TORCH % VENDOR, site, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["after_import"] == []
    assert out["after_devices"] == []
    assert out["rc"] == [0, 0]
    # the fake whose capabilities() imports torch was refused, not satisfied
    assert "not shown: needs torch" in out["text"]


TORCH_UNTOUCHED = """
import json, sys
import torch
VENDOR = %r
def snapshot():
    mods = {m: sys.modules[m] for m in sorted(sys.modules) if m.partition(".")[0] == "torch"}
    spaces = {m: dict(vars(mod)) for m, mod in mods.items() if m in ("torch", "torch.cuda", "torch.xpu",
                                                                       "torch.accelerator", "torch.backends")}
    return mods, spaces
mods0, spaces0 = snapshot()
vendor0 = sorted(m for m in sys.modules if m.partition(".")[0] in VENDOR and m.partition(".")[0] != "torch")
import io, contextlib
import omni_backends
from omni_backends import registry
from omni_backends.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["devices"]); main(["devices", "--json"]); main(["devices", "--device", "ascend"])
registry.devices_report()
sel = omni_backends.select("cpu")
mods1, spaces1 = snapshot()
diff = {}
for m, before in spaces0.items():
    after = spaces1[m]
    changed = sorted(k for k in before.keys() | after.keys()
                     if k not in before or k not in after or before[k] is not after[k])
    if changed:
        diff[m] = changed
print(json.dumps({
    "diff": diff,
    "replaced_modules": sorted(m for m in mods0 if mods1.get(m) is not mods0[m]),
    "torch_cuda_is_cuda": sys.modules["torch"].cuda is mods0["torch.cuda"] if "torch.cuda" in mods0 else True,
    "has_npu": hasattr(torch, "npu"),
    "vendor_before": vendor0,
    "vendor_after": sorted(m for m in sys.modules if m.partition(".")[0] in VENDOR and m.partition(".")[0] != "torch"),
    "selected": sel.name,
}))
"""


def test_devices_and_select_change_no_attribute_of_torch(tmp_path):
    site = make_site(tmp_path, FAKES)
    proc = python(TORCH_UNTOUCHED % VENDOR, site, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["selected"] == "cpu"
    assert out["diff"] == {}, "attributes of torch modules added/rebound: %s" % out["diff"]
    assert out["replaced_modules"] == []
    assert out["torch_cuda_is_cuda"] and out["has_npu"] is False
    assert out["vendor_after"] == out["vendor_before"], "vendor stacks imported"


def test_devices_probes_each_driver_once(tmp_path):
    site = make_site(tmp_path, {"fake-probe-log": {"probe-log": "fake_drivers:ProbeLogBackend"}})
    log = tmp_path / "probes.log"
    code = textwrap.dedent("""
        import io, contextlib
        from omni_backends.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["devices"])
    """)
    proc = python(code, site, tmp_path / "cache", {"FAKE_PROBE_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().count("probe") == 1
