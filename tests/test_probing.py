"""The probe helpers (``omni_backends.probing``): metadata, version gates, device files."""

from __future__ import annotations

import sys

import pytest

from fakes.sites import make_site
from omni_backends import probing


@pytest.fixture
def fake_dist(tmp_path, monkeypatch):
    """A distribution ``fake-vendor`` 1.2.3 visible to importlib.metadata (real dist-info on sys.path)."""
    site = make_site(tmp_path, {"fake-vendor": {}})
    info = next(site.glob("*.dist-info"))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-vendor\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_dist_version_reads_metadata_and_none_when_absent(fake_dist):
    assert probing.dist_version("fake-vendor") == "1.2.3"
    assert probing.dist_version("fake_vendor") == "1.2.3"  # normalised name
    assert probing.dist_version("surely-not-installed-anywhere") is None
    assert probing.versions_of(["fake-vendor", "surely-not-installed-anywhere"]) == {
        "fake-vendor": "1.2.3", "surely-not-installed-anywhere": None}


@pytest.mark.parametrize(("spec", "version", "ok"), [
    (">=2.13,<2.14", "2.13.0+cpu", True),          # local label ignored
    (">=2.13,<2.14", "2.14.0+cu130", False),
    (">=0.23,<0.24", "0.23.0.post1", True),
    ("==0.23.0.post1", "0.23.0.post1", True),      # a post release pinned exactly
    ("==0.23.0.post1", "0.23.0", False),
    ("==2.10.0", "2.10.0+cann8", True),
    (">=2.14", "2.14.0rc1", False),                # a pre-release is below its release
    (">=2.14.0rc1", "2.14.0rc2+cu130", True),
])
def test_version_mismatches(spec, version, ok):
    problems = probing.version_mismatches({"pkg": spec}, {"pkg": version})
    assert (problems == []) is ok, problems
    if not ok:
        assert problems == [f"pkg {version} is installed but pkg{spec} is required"]


def test_version_mismatches_missing_and_unparsable():
    problems = probing.version_mismatches({"a": ">=1", "b": ">=1", "c": "not a spec"},
                                          {"a": None, "b": "not-a-version", "c": "1.0"})
    assert problems[0] == "a is not installed (need a>=1)"
    assert problems[1].startswith("b not-a-version: cannot check against '>=1'")
    assert problems[2].startswith("c 1.0: cannot check against 'not a spec'")
    assert probing.version_mismatches({}, {"a": "1"}) == []


def test_install_hint_lists_only_unmet_requirements():
    req = {"vllm": ">=0.33,<0.34", "torch": ">=2.14,<2.15"}
    assert probing.install_hint(req, {"vllm": "0.33.1", "torch": "2.13.0+cpu"}) == "pip install 'torch>=2.14,<2.15'"
    assert probing.install_hint(req, {"vllm": "0.33.1", "torch": "2.14.0"}) == ""


def test_module_findable_does_not_import(fake_dist):
    (fake_dist / "fake_probe_target.py").write_text("raise RuntimeError('must not be imported by a probe')\n")
    assert probing.module_findable("fake_probe_target") is True
    assert "fake_probe_target" not in sys.modules
    assert probing.module_findable("surely_not_a_module_xyz") is False
    with pytest.raises(ValueError, match="top-level"):
        probing.module_findable("os.path")


def test_device_nodes_and_shared_library_search(tmp_path):
    for n in ("davinci0", "davinci1", "davinci_manager"):
        (tmp_path / n).write_text("")
    assert probing.device_nodes(str(tmp_path / "davinci[0-9]*")) == [str(tmp_path / "davinci0"), str(tmp_path / "davinci1")]
    lib = tmp_path / "toolkit" / "lib64" / "libfakehccl.so.8"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    assert probing.find_shared_library("fakehccl", [str(tmp_path / "toolkit")]) == str(lib)
    assert probing.find_shared_library("surely-no-such-library-xyz", [str(tmp_path)]) is None


def test_pci_vendor_devices_never_raises():
    found = probing.pci_vendor_devices("0x8086")
    assert isinstance(found, list) and all(p.startswith("/sys/class/drm/card") for p in found)
