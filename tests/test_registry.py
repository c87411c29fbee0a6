"""Driver discovery and selection, against fake drivers registered through
real entry-point metadata (``tests/fakes``). Each scenario runs omni-backends
in a fresh process; nothing patches the registry.

Fake drivers test registry logic only, never that a real driver works.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from fakes.sites import cache_file, cli, devices_json, driver, make_site, python

FAKE = "fake_drivers:"


@pytest.fixture
def cache_home(tmp_path):
    return tmp_path / "xdg-cache"


def _site(tmp_path, **dists):
    return make_site(tmp_path, {d.replace("_", "-"): eps for d, eps in dists.items()})


# ------------------------------------------------------------ auto-detect
def test_auto_skips_driver_without_device_for_lower_priority_usable(tmp_path, cache_home):
    site = _site(tmp_path, fake_nodev={"nodev": FAKE + "NoDeviceBackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    rep = devices_json(site, cache_home)
    assert driver(rep, "nodev")["probe"]["state"] == "importable"
    assert driver(rep, "nodev")["priority"] > driver(rep, "usable-low")["priority"]
    sel = rep["selection"]
    assert sel["selected"] == "usable-low", sel
    assert sel["rule"] == "auto-detect"
    assert any("nodev" in n and "reports 0 devices" in n for n in sel["notes"]), sel["notes"]
    assert rep["_returncode"] == 0


def test_equal_priority_tie_breaks_by_name_and_report_says_so(tmp_path, cache_home):
    # registered in reverse order so that name order, not discovery order, decides
    site = _site(tmp_path, fake_ties={"tie-b": FAKE + "TieBBackend", "tie-a": FAKE + "TieABackend"})
    sel = devices_json(site, cache_home)["selection"]
    assert sel["selected"] == "tie-a"
    assert any("tie" in n and "tie-a" in n and "tie-b" in n and "name" in n for n in sel["notes"]), sel["notes"]


def test_explicit_choice_that_is_not_usable_fails_with_probe_reason(tmp_path, cache_home):
    site = _site(tmp_path, fake_nodev={"nodev": FAKE + "NoDeviceBackend"})
    rep = devices_json(site, cache_home, "--device", "nodev")
    err = rep["selection"]["error"]
    assert err.startswith("DeviceNotUsableError")
    assert "reports 0 devices" in err and "plug in the fake device" in err
    assert rep["_returncode"] == 1


# ------------------------------------------------------- load failures
@pytest.mark.parametrize(("module", "exc_type", "message"), [
    ("fake_boom_oserror", "OSError", "libfakehccl.so: cannot open shared object file"),
    ("fake_boom_runtime", "RuntimeError", "driver version mismatch"),
])
def test_driver_import_error_is_shown_and_others_still_load(tmp_path, cache_home, module, exc_type, message):
    site = _site(tmp_path, fake_boom={"boom": f"{module}:Whatever"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    rep = devices_json(site, cache_home)
    boom = driver(rep, "boom")
    assert boom["probe"] is None
    assert boom["problem"].startswith(f"driver failed to load: {exc_type}: ") and message in boom["problem"]
    assert f"{module}.py" in boom["traceback"] and exc_type in boom["traceback"]
    for other in ("usable-low", "cpu", "cuda", "npu", "xpu"):
        assert driver(rep, other)["probe"] is not None, other
    assert rep["selection"]["selected"] == "usable-low"
    text = cli(["devices"], site, cache_home).stdout
    assert "boom" in text and message in text


@pytest.mark.parametrize("module", ["fake_boom_oserror", "fake_boom_runtime"])
def test_explicit_selection_of_broken_driver_reraises_with_original_traceback(tmp_path, cache_home, module):
    site = _site(tmp_path, fake_boom={"boom": f"{module}:Whatever"})
    code = textwrap.dedent("""
        import json, traceback, omni_backends
        from omni_backends.errors import DriverLoadError
        try:
            omni_backends.select("boom")
        except DriverLoadError as exc:
            cause = exc.__cause__
            frames = traceback.extract_tb(cause.__traceback__)
            print(json.dumps({"msg": str(exc), "cause": type(cause).__name__,
                              "frames": [(f.filename, f.name) for f in frames]}))
    """)
    proc = python(code, site, cache_home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "boom" in out["msg"] and "fake-boom" in out["msg"]
    assert out["cause"] in ("OSError", "RuntimeError")
    # the original traceback reaches into the failing module, down to the raising function
    assert any(f.endswith(f"{module}.py") for f, _ in out["frames"]), out["frames"]
    assert out["frames"][-1][1] in ("_load_vendor_library", "_check_vendor_runtime")
    # the CLI shows the chained traceback too
    proc = python("import sys; from omni_backends.cli import main; sys.exit(main(['devices', '--device', 'boom']))",
                  site, cache_home)
    assert proc.returncode == 1
    assert f"{module}.py" in proc.stdout + proc.stderr


def test_entry_point_that_is_not_a_backend_is_refused(tmp_path, cache_home):
    site = _site(tmp_path, fake_notabackend={"notabackend": FAKE + "NotABackend"})
    rep = devices_json(site, cache_home, "--device", "notabackend")
    assert "not a Backend subclass" in driver(rep, "notabackend")["problem"]
    assert rep["selection"]["error"].startswith("IncompatibleDriverError")


# ------------------------------------------------------ duplicates / names
def test_two_distributions_with_one_driver_name_is_an_error_naming_both(tmp_path, cache_home):
    site = _site(tmp_path, fake_dup_one={"dup": FAKE + "TieABackend"},
                 fake_dup_two={"dup": FAKE + "TieBBackend"})
    rep = devices_json(site, cache_home, "--device", "dup")
    problem = driver(rep, "dup")["problem"]
    assert "fake-dup-one" in problem and "fake-dup-two" in problem
    err = rep["selection"]["error"]
    assert err.startswith("DuplicateDriverError") and "fake-dup-one" in err and "fake-dup-two" in err
    # auto-detect never picks an ambiguous driver
    assert devices_json(site, cache_home)["selection"]["selected"] != "dup"


def test_same_target_from_two_distributions_is_still_a_duplicate(tmp_path, cache_home):
    site = _site(tmp_path, fake_dup_one={"dup": FAKE + "TieABackend"},
                 fake_dup_two={"dup": FAKE + "TieABackend"})
    problem = driver(devices_json(site, cache_home), "dup")["problem"]
    assert "fake-dup-one" in problem and "fake-dup-two" in problem


def test_unknown_name_lists_installed_names(tmp_path, cache_home):
    site = _site(tmp_path, fake_low={"usable-low": FAKE + "UsableLowBackend"})
    rep = devices_json(site, cache_home, "--device", "tpu")
    err = rep["selection"]["error"]
    assert err.startswith("UnknownDeviceError") and "'tpu'" in err
    for name in ("cpu", "cuda", "npu", "xpu", "usable-low", "ascend (= npu)"):
        assert name in err, name
    assert rep["_returncode"] == 2  # an unknown name is a usage error, as for `run`


@pytest.mark.parametrize("typed", ["ascend", "ASCEND", " Ascend ", "NPU"])
def test_ascend_alias_resolves_to_npu_case_insensitively(tmp_path, cache_home, typed):
    site = _site(tmp_path)
    code = ("import omni_backends.registry as r; e, _ = r.discover(); print(r.resolve_name(%r, e))" % typed)
    proc = python(code, site, cache_home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "npu"
    # through the CLI: the npu driver is chosen (and, with no NPU here, refused with its probe reason)
    rep = devices_json(site, cache_home, "--device", typed)
    err = rep["selection"].get("error") or ""
    assert rep["selection"].get("selected") == "npu" or "'npu'" in err, rep["selection"]


def test_out_of_tree_alias_any_case(tmp_path, cache_home):
    site = _site(tmp_path, fake_fancy={"fancy": FAKE + "AliasBackend"})
    for typed in ("shiny", "SHINY", "Fancy"):
        sel = devices_json(site, cache_home, "--device", typed)["selection"]
        assert sel["selected"] == "fancy", (typed, sel)


def test_incompatible_interface_version_is_refused_clearly(tmp_path, cache_home):
    site = _site(tmp_path, fake_future={"future": FAKE + "FutureInterfaceBackend"})
    rep = devices_json(site, cache_home)
    problem = driver(rep, "future")["problem"]
    assert "[99]" in problem and "version 1" in problem and "fake-future" in problem
    assert rep["selection"]["selected"] != "future"  # priority 70 but refused
    err = devices_json(site, cache_home, "--device", "future")["selection"]["error"]
    assert err.startswith("IncompatibleDriverError") and "[99]" in err


def test_probe_that_raises_is_recorded_not_propagated(tmp_path, cache_home):
    site = _site(tmp_path, fake_raises={"probe-raises": FAKE + "ProbeRaisesBackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    rep = devices_json(site, cache_home)
    probe = driver(rep, "probe-raises")["probe"]
    assert probe["usable"] is False and "fake probe exploded" in (probe["error"] or "")
    assert rep["selection"]["selected"] == "usable-low"


# ------------------------------------------------------- environment
def test_env_variable_valid_selects_it(tmp_path, cache_home):
    site = _site(tmp_path, fake_ties={"tie-a": FAKE + "TieABackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    sel = devices_json(site, cache_home, extra_env={"OMNI_BACKENDS_DEVICE": "usable-low"})["selection"]
    assert sel["selected"] == "usable-low"  # not tie-a, although tie-a has the higher priority
    assert sel["rule"] == "environment OMNI_BACKENDS_DEVICE"


def test_env_variable_invalid_is_an_error_naming_the_variable(tmp_path, cache_home):
    site = _site(tmp_path)
    rep = devices_json(site, cache_home, extra_env={"OMNI_BACKENDS_DEVICE": "gpu0"})
    err = rep["selection"]["error"]
    assert err.startswith("UnknownDeviceError") and "'gpu0'" in err and "OMNI_BACKENDS_DEVICE" in err
    assert rep["_returncode"] == 2  # an unknown name is a usage error (README, exit statuses)


def test_flag_wins_over_env_and_report_says_so(tmp_path, cache_home):
    site = _site(tmp_path, fake_ties={"tie-a": FAKE + "TieABackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    for env_value in ("tie-a", "not-a-driver"):
        rep = devices_json(site, cache_home, "--device", "usable-low", extra_env={"OMNI_BACKENDS_DEVICE": env_value})
        sel = rep["selection"]
        assert sel["selected"] == "usable-low" and sel["rule"] == "explicit --device"
        assert any("overrides" in n and env_value in n for n in sel["notes"]), sel["notes"]
    text = cli(["devices", "--device", "usable-low"], site, cache_home,
               {"OMNI_BACKENDS_DEVICE": "tie-a"}).stdout
    assert "--device=usable-low overrides OMNI_BACKENDS_DEVICE=tie-a" in text


def test_flag_and_env_naming_the_same_driver_by_alias_is_no_conflict(tmp_path, cache_home):
    site = _site(tmp_path, fake_fancy={"fancy": FAKE + "AliasBackend"})
    sel = devices_json(site, cache_home, "--device", "fancy", extra_env={"OMNI_BACKENDS_DEVICE": "SHINY"})["selection"]
    assert sel["selected"] == "fancy"
    assert not any("overrides" in n for n in sel["notes"]), sel["notes"]


def test_explicit_auto_overrides_env_and_says_so(tmp_path, cache_home):
    site = _site(tmp_path, fake_ties={"tie-a": FAKE + "TieABackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    sel = devices_json(site, cache_home, "--device", "auto",
                       extra_env={"OMNI_BACKENDS_DEVICE": "usable-low"})["selection"]
    assert sel["selected"] == "tie-a" and sel["rule"] == "auto-detect"
    assert any("overrides" in n and "usable-low" in n for n in sel["notes"]), sel["notes"]


# ---------------------------------------------------- select(): once, safely
SELECT_THREADS = """
import json, threading, omni_backends, fake_drivers
from omni_backends.errors import OmniBackendError
barrier = threading.Barrier(16)
results, errors = [], []
def worker():
    barrier.wait()
    try:
        results.append(omni_backends.select("counting"))
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=worker) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
out = {"selections": len({id(s) for s in results}), "backends": len({id(s.backend) for s in results}),
       "instances": fake_drivers.CountingBackend.instances, "errors": errors,
       "same_again": omni_backends.select("COUNTING") is results[0],
       "auto_again": omni_backends.select() is results[0],
       "get_backend": omni_backends.get_backend() is results[0].backend}
try:
    omni_backends.select("usable-low")
    out["switch"] = None
except OmniBackendError as exc:
    out["switch"] = str(exc)
print(json.dumps(out))
"""


def test_select_is_thread_safe_and_happens_once(tmp_path, cache_home):
    site = _site(tmp_path, fake_counting={"counting": FAKE + "CountingBackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    proc = python(SELECT_THREADS, site, cache_home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["errors"] == []
    assert (out["selections"], out["backends"], out["instances"]) == (1, 1, 1), out
    assert out["same_again"] and out["auto_again"] and out["get_backend"]
    assert out["switch"] and "'counting'" in out["switch"] and "'usable-low'" in out["switch"]


@pytest.mark.parametrize("name", ["reenter-init", "reenter-probe"])
def test_select_is_never_reentered(tmp_path, cache_home, name):
    cls = {"reenter-init": "ReentrantInitBackend", "reenter-probe": "ReentrantProbeBackend"}[name]
    site = _site(tmp_path, fake_reenter={name: FAKE + cls})
    code = textwrap.dedent(f"""
        import omni_backends
        try:
            omni_backends.select({name!r})
        except omni_backends.OmniBackendError as exc:
            print("ERR", exc)
        else:
            print("SELECTED", omni_backends.current().name)
    """)
    proc = python(code, site, cache_home)
    assert proc.returncode == 0, proc.stderr  # no RecursionError, no deadlock (timeout)
    assert "re-entered" in proc.stdout, proc.stdout
    assert "SELECTED" not in proc.stdout


def test_select_exports_choice_for_worker_processes(tmp_path, cache_home):
    site = _site(tmp_path, fake_low={"usable-low": FAKE + "UsableLowBackend"})
    code = textwrap.dedent("""
        import json, os, omni_backends
        sel = omni_backends.select("usable-low")
        print(json.dumps({"device": os.environ["OMNI_BACKENDS_DEVICE"],
                          "selection": json.loads(os.environ["OMNI_BACKENDS_SELECTION"]),
                          "fingerprint": sel.fingerprint}))
    """)
    proc = python(code, site, cache_home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["device"] == "usable-low"
    assert out["selection"]["name"] == "usable-low"
    assert out["selection"]["fingerprint"] == out["fingerprint"]
    assert out["selection"]["versions"] == {"fake-vendor": "1.0"}


def test_incomplete_driver_class_is_refused_with_clear_message(tmp_path, cache_home):
    """An abstract driver class (identity + probe only) must say what is missing, not raise a bare TypeError."""
    site = _site(tmp_path, fake_incomplete={"incomplete": FAKE + "IncompleteBackend"})
    code = textwrap.dedent("""
        import omni_backends
        try:
            omni_backends.select("incomplete")
        except omni_backends.OmniBackendError as exc:
            print(type(exc).__name__, exc)
        print("current:", omni_backends.current())
    """)
    proc = python(code, site, cache_home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("IncompatibleDriverError"), proc.stdout
    from omni_backends.backend import Backend

    missing = sorted(Backend.__abstractmethods__ - {"probe"})  # the fake defines the identity and probe only
    assert missing and f"(missing: {', '.join(missing)})" in proc.stdout, proc.stdout
    assert "current: None" in proc.stdout


# -------------------------------------------------- stevedore's entry-point cache
def _populate(site, cache_home):
    rep = devices_json(site, cache_home)
    assert driver(rep, "usable-low")["probe"]["usable"]
    return cache_file(site, cache_home)


def test_stevedore_cache_is_actually_exercised(tmp_path, cache_home):
    """Guards the cache tests below: this interpreter must make stevedore write its cache."""
    if sys.executable.startswith("/tmp"):
        pytest.skip(f"stevedore never writes its cache for interpreters under /tmp ({sys.executable})")
    site = _site(tmp_path, fake_low={"usable-low": FAKE + "UsableLowBackend"})
    path = _populate(site, cache_home)
    assert path.parent == cache_home / "python-entrypoints"
    data = json.loads(path.read_text())
    assert ["usable-low", "fake_drivers:UsableLowBackend", "omni_backends.drivers"] in data["groups"]["omni_backends.drivers"]


CORRUPT = {
    "garbage-text": b"{this is not json",
    "garbage-binary": b"\xff\xfe\x00\x9c not utf-8 \x80",
    "json-list": b"[]",
    "json-groups-list": b'{"groups": []}',
    "json-short-entry": b'{"groups": {"omni_backends.drivers": [["usable-low"]]}}',
    "json-null": b"null",
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_corrupt_stevedore_cache_does_not_break_discovery(tmp_path, cache_home, kind):
    site = _site(tmp_path, fake_low={"usable-low": FAKE + "UsableLowBackend"})
    path = cache_file(site, cache_home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(CORRUPT[kind])
    rep = devices_json(site, cache_home)
    assert rep["_returncode"] == 0, rep["_stderr"]
    for name in ("usable-low", "cpu", "cuda", "npu", "xpu"):
        assert driver(rep, name)["probe"] is not None, (kind, name)
    assert rep["selection"]["selected"] == "usable-low"
    assert "Traceback" not in rep["_stderr"]
    # proof that the corrupt file was really read by stevedore
    if kind == "garbage-text":  # stevedore catches JSONDecodeError itself and rebuilds the cache
        if not sys.executable.startswith("/tmp"):
            rebuilt = json.loads(path.read_text())
            assert "usable-low" in [e[0] for e in rebuilt["groups"]["omni_backends.drivers"]]
    else:  # stevedore raises: the registry says so and which cache to delete
        assert any("stevedore could not list the omni_backends.drivers entry points" in n and str(path.parent) in n for n in rep["notes"]), rep["notes"]


def test_stale_stevedore_cache_is_detected_and_bypassed(tmp_path, cache_home):
    """A cache that is valid JSON of the right shape but lists other drivers than installed."""
    site = _site(tmp_path, fake_low={"usable-low": FAKE + "UsableLowBackend"})
    path = cache_file(site, cache_home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "groups": {"omni_backends.drivers": [
            ["cpu", "omni_backends.cpu.driver:CpuBackend", "omni_backends.drivers"],
            ["ghost", "no_such_module_anywhere:Ghost", "omni_backends.drivers"],
        ]},
        "sys.executable": sys.executable, "sys.prefix": sys.prefix, "path_values": [],
    }))
    rep = devices_json(site, cache_home)
    for name in ("usable-low", "cpu", "cuda", "npu", "xpu"):
        assert driver(rep, name)["probe"] is not None, name
    assert "ghost" not in [d["name"] for d in rep["drivers"]]
    assert rep["selection"]["selected"] == "usable-low"
    notes = " ".join(rep["notes"])
    assert "stale" in notes and "usable-low" in notes and "ghost" in notes


def test_unwritable_stevedore_cache_does_not_break_discovery(tmp_path):
    site = _site(tmp_path, fake_low={"usable-low": FAKE + "UsableLowBackend"})
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("XDG_CACHE_HOME points at a file, so no cache directory can be created\n")
    rep = devices_json(site, blocker)
    assert rep["_returncode"] == 0, rep["_stderr"]
    assert rep["selection"]["selected"] == "usable-low"
    assert blocker.read_text().startswith("XDG_CACHE_HOME")


def test_selection_report_text_and_json_list_every_candidate(tmp_path, cache_home):
    site = _site(tmp_path, fake_nodev={"nodev": FAKE + "NoDeviceBackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    code = textwrap.dedent("""
        import json
        from omni_backends import registry
        sel = registry.decide()
        print(json.dumps({"text": sel.to_text(), "json": sel.to_json()}))
    """)
    proc = python(code, site, cache_home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    text = out["text"].splitlines()
    assert text[0] == "selected: usable-low  (rule: auto-detect)"
    rows = {line.split()[1] if line.lstrip().startswith("*") else line.split()[0]: line
            for line in text[text.index("  candidates:") + 1:]}
    assert set(rows) >= {"usable-low", "nodev", "cpu", "cuda", "npu", "xpu"}
    assert rows["usable-low"].lstrip().startswith("* usable-low") and "usable" in rows["usable-low"]
    assert "importable" in rows["nodev"] and "reports 0 devices" in rows["nodev"]
    names = [c["name"] for c in out["json"]["candidates"]]
    assert names == sorted(names) and {"usable-low", "nodev"} <= set(names)
    assert out["json"]["selected"] == "usable-low" and out["json"]["rule"] == "auto-detect"


WORKER = """
import json, os, omni_backends
from omni_backends import registry
try:
    sel = registry.verify_worker_selection()
    print(json.dumps({"selected": sel.name}))
except omni_backends.OmniBackendError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def test_worker_process_follows_parent_selection_and_detects_mismatch(tmp_path, cache_home):
    site = _site(tmp_path, fake_ties={"tie-a": FAKE + "TieABackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    parent = python("import os, omni_backends; omni_backends.select('usable-low'); "
                    "print(os.environ['OMNI_BACKENDS_SELECTION'])", site, cache_home)
    assert parent.returncode == 0, parent.stderr
    exported = parent.stdout.strip()
    # a worker with the parent's selection resolves the same driver, not auto-detect's tie-a
    out = json.loads(python(WORKER, site, cache_home, {"OMNI_BACKENDS_SELECTION": exported}).stdout)
    assert out == {"selected": "usable-low"}
    # a worker that sees different vendor versions (other fingerprint) refuses, naming both sides
    forged = json.loads(exported)
    forged["versions"], forged["fingerprint"] = {"fake-vendor": "0.9"}, "0000000000000000"
    out = json.loads(python(WORKER, site, cache_home, {"OMNI_BACKENDS_SELECTION": json.dumps(forged)}).stdout)
    assert "worker process resolved driver 'usable-low'" in out["error"] and "0000000000000000" in out["error"]


@pytest.mark.parametrize("raw", ["{not json", '{"versions": {}}', "[1, 2]"])
def test_worker_with_garbled_parent_selection_gets_a_clear_error(tmp_path, cache_home, raw):
    site = _site(tmp_path)
    proc = python(WORKER, site, cache_home, {"OMNI_BACKENDS_SELECTION": raw})
    assert proc.returncode == 0, proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert "OMNI_BACKENDS_SELECTION" in err and "parent" in err


def test_duplicate_row_names_both_distributions_and_claims_no_priority(tmp_path, cache_home):
    site = _site(tmp_path, fake_dup_one={"dup": FAKE + "TieABackend"},
                 fake_dup_two={"dup": FAKE + "UsableLowBackend"})
    dup = driver(devices_json(site, cache_home), "dup")
    assert dup["distribution"] == "fake-dup-one, fake-dup-two"
    assert dup["priority"] is None and dup["probe"] is None and "identity" not in dup


def test_driver_added_without_changing_stevedore_cache_key_is_still_found(tmp_path, cache_home):
    """stevedore keys its cache on entry_points.txt mtimes packed as 32-bit floats (~128 s
    resolution today), so a reinstall within that window leaves a stale cache. Reproduce it
    by rewriting entry_points.txt and restoring its mtime."""
    if sys.executable.startswith("/tmp"):
        pytest.skip(f"stevedore never writes its cache for interpreters under /tmp ({sys.executable})")
    import os

    site = _site(tmp_path, fake_low={"usable-low": FAKE + "UsableLowBackend"})
    path = _populate(site, cache_home)
    before = path.read_text()
    eps = next(site.glob("fake_low-*.dist-info")) / "entry_points.txt"
    stat = eps.stat()
    eps.write_text(eps.read_text() + "tie-a = fake_drivers:TieABackend\n")
    os.utime(eps, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache_file(site, cache_home) == path  # same key: stevedore will serve the old list
    rep = devices_json(site, cache_home)
    assert path.read_text() == before  # stevedore did not notice
    assert driver(rep, "tie-a")["probe"]["usable"]
    assert rep["selection"]["selected"] == "tie-a"
    assert any("stale" in n and "tie-a" in n for n in rep["notes"]), rep["notes"]


def test_errors_survive_pickling_between_processes():
    """vLLM's multiprocess engine ships worker exceptions by pickle: the probe must travel too."""
    import pickle

    from omni_backends.backend import ProbeResult, ProbeState
    from omni_backends.errors import DeviceNotUsableError, OmniBackendError, UnknownDeviceError

    probe = ProbeResult(ProbeState.IMPORTABLE, "no device", {"fake-vendor": "1.0"}, fix="plug it in")
    err = pickle.loads(pickle.dumps(DeviceNotUsableError("device 'x' is not usable", probe=probe)))
    assert str(err) == "device 'x' is not usable" and err.probe == probe
    assert isinstance(err, OmniBackendError)
    unknown = pickle.loads(pickle.dumps(UnknownDeviceError("unknown device 'tpu'")))
    assert isinstance(unknown, ValueError) and str(unknown) == "unknown device 'tpu'"


def test_interface_versions_given_as_a_bare_int_is_refused_clearly(tmp_path, cache_home):
    site = _site(tmp_path, fake_scalar={"scalar-interface": FAKE + "ScalarInterfaceBackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    rep = devices_json(site, cache_home, "--device", "scalar-interface")
    problem = driver(rep, "scalar-interface")["problem"]
    assert "interface_versions=1" in problem and "tuple of ints" in problem and "fake-scalar" in problem
    assert rep["selection"]["error"].startswith("IncompatibleDriverError")
    assert devices_json(site, cache_home)["selection"]["selected"] == "usable-low"  # the others still work


def test_driver_missing_identity_attributes_is_refused_clearly(tmp_path, cache_home):
    site = _site(tmp_path, fake_noid={"no-identity": FAKE + "NoIdentityBackend"},
                 fake_low={"usable-low": FAKE + "UsableLowBackend"})
    rep = devices_json(site, cache_home)
    assert rep["_returncode"] == 0, rep["_stderr"]
    problem = driver(rep, "no-identity")["problem"]
    assert "device_type" in problem and "priority" in problem and "fake-noid" in problem
    assert rep["selection"]["selected"] == "usable-low"


#: the public names of ``omni_backends.registry`` and ``omni_backends.probing`` before they became packages (issue 23)
REGISTRY_NAMES = ("AUTO ENV_DEVICE ENV_SELECTION NAMESPACE Candidate DriverEntry Selection current decide "
                  "cheap_capabilities devices_report discover export_selection load_plugins get_backend resolve_name "
                  "safe_probe select verify_worker_selection problem_of vendor_modules_of HEAVY_MODULES "
                  "_reset_for_tests").split()
PROBING_NAMES = ("dist_version versions_of version_mismatches module_findable device_nodes find_shared_library "
                 "pci_vendor_devices install_hint ImportFailure distribution_of top_level_modules find_import_failure "
                 "vendor_import_error blame_import_failures import_check BASE_DISTRIBUTIONS torch_backend_extensions "
                 "torch_autoload_enabled vendor_modules_to_check vendor_import_failures describe_import_failure "
                 "KNOWN_VENDOR_MODULES ENV_HIDDEN hidden_vendor_packages hide_vendor_module "
                 "apply_hidden_vendor_packages hide_broken_vendor_packages").split()


def test_the_package_keeps_every_public_name():
    from omni_backends import probing, registry

    assert [n for n in REGISTRY_NAMES if not hasattr(registry, n)] == []
    assert [n for n in PROBING_NAMES if not hasattr(probing, n)] == []
    assert registry.select is __import__("omni_backends").select


def test_export_puts_the_hide_site_shim_first_on_pythonpath(monkeypatch):
    """With hidden vendor packages, children get ``omni_backends/hide_site`` (its ``sitecustomize``)
    first on PYTHONPATH, wherever the registry module lives."""
    import os
    from pathlib import Path

    from omni_backends.probing import vendor_imports
    from omni_backends.registry import Selection, export_selection

    monkeypatch.setitem(vendor_imports._HIDDEN, "vendor_broken", {"package": "vendor_broken", "error": "OSError: x"})
    env = {"PYTHONPATH": "/elsewhere"}
    export_selection(Selection("fake", "auto-detect", "why", [], [], {}), env)
    first, *rest = env["PYTHONPATH"].split(os.pathsep)
    assert Path(first) == Path(__file__).resolve().parents[1] / "omni_backends" / "hide_site"
    assert (Path(first) / "sitecustomize.py").is_file() and rest == ["/elsewhere"]
    assert json.loads(env["OMNI_BACKENDS_HIDDEN_VENDORS"]) == {"vendor_broken": vendor_imports._HIDDEN["vendor_broken"]}


@pytest.mark.parametrize("chained", [False, True])
def test_hide_site_hides_silently_and_chains_the_next_sitecustomize(tmp_path, chained):
    """A child started with the hide-site shim first on PYTHONPATH: the hidden package is not importable, the
    interpreter prints nothing at start-up (no ``Error in sitecustomize``), and a ``sitecustomize`` further
    down ``sys.path`` still runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    shim = Path(__file__).resolve().parents[1] / "omni_backends" / "hide_site"
    path = [str(shim)]
    if chained:
        (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_SITECUSTOMIZE'] = 'ran'\n")
        path.append(str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path),
           "OMNI_BACKENDS_HIDDEN_VENDORS": json.dumps({"vendor_broken": {"package": "vendor_broken"}})}
    code = ("import os, sys\n"
            "try:\n    import vendor_broken\nexcept ImportError:\n    print('hidden')\n"
            "print(os.environ.get('CHAINED_SITECUSTOMIZE', 'not chained'))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.split() == ["hidden", "ran" if chained else "not"] + ([] if chained else ["chained"])
