"""Issue 17: omni-backends on machines as users have them.

Every environmental fault is built for real in temporary directories (a
vendor package whose import raises, stale ``.egg-info`` next to a fresh
``.dist-info``, a stevedore cache with wrong targets) and exercised in fresh
subprocesses, the way a user meets it:

1. a broken accelerator stack (``torch_npu`` without CANN) is named as the
   cause, never put down to something else (an unreadable weight file); where
   torch itself still imports, it never stops a run on another device: it is
   hidden from that process, third-party availability checks see it as not
   installed, and ``devices`` / ``--device npu`` show the vendor's own error
   (issue 22);
2. packaging metadata in the wild: the installed driver is found or one error
   names every conflicting record; an entry-point name that differs from its
   class's name is refused with both;
3. every option is checked before any engine starts, and every command
   follows one table of exit statuses (README);
4. probe / identity / capabilities import no vLLM and leave torch's
   namespace as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakes.sites import GROUP, cache_file, env_for, make_site

HCCL_ERROR = "libhccl.so: cannot open shared object file: No such file or directory"
CLI = ["-m", "omni_backends.cli"]


def _run(args, site, cache_home, *, cwd=None, env=None, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=cwd or site, env=env_for(site, cache_home, env),
                          capture_output=True, text=True, timeout=timeout)


def _one_error(proc) -> str:
    """The single ``omni-backends: error:`` line of a failed command (and no traceback)."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("omni-backends: error:")]
    assert len(errors) == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return errors[0]


# ------------------------------------------------------------------ 1. broken vendor stack
def vendor_site(root: Path, *, autoload: bool, package: str = "torch_npu", dist: str = "torch-npu",
                version: str = "2.10.0.post4", error: str = HCCL_ERROR, bare: bool = False) -> Path:
    """A site holding an installed vendor package (real dist-info with RECORD) whose import
    raises ``OSError(error)``; with ``autoload`` it also registers a ``torch.backends``
    entry point, as torch_npu does, so that ``import torch`` imports it. With ``bare``
    the package directory has no metadata at all (merely importable from ``sys.path``)."""
    site = root / "vendor-site"
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(
        f"def _load_runtime():\n    raise OSError({error!r})\n\n\n_load_runtime()\n\n\ndef _autoload():\n    pass\n")
    if bare:
        return site
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{package}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    if autoload:
        (info / "entry_points.txt").write_text(f"[torch.backends]\n{package} = {package}:_autoload\n")
    return site


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    from core.models.create import create_demo_models

    d = str(tmp_path_factory.mktemp("demo") / "models")
    create_demo_models(d)
    return d


@pytest.mark.parametrize("autoload", [True], ids=["torch-autoload"])
def test_broken_vendor_package_is_named_as_the_cause_of_a_failed_run(tmp_path, demo, autoload):
    """torch_npu without CANN, reached through torch's backend autoload (``import torch``
    fails): the cpu run cannot start, and the one error names torch_npu, its own error and
    the fix -- not "weight file unreadable", not a traceback. (Reached through transformers'
    ``is_torch_npu_available()`` instead, it no longer stops the run: see
    test_broken_vendor_package_does_not_stop_a_run_on_the_default_device.)"""
    site = vendor_site(tmp_path, autoload=autoload)
    out = tmp_path / "out"
    proc = _run([*CLI, "run", "--model-dir", demo, "--out", str(out), "--max-tokens", "2"], site, tmp_path / "c",
                env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 1, proc.stderr[-4000:]  # the environment, not the input (README exit statuses)
    msg = _one_error(proc)
    assert "torch_npu" in msg and "torch-npu 2.10.0.post4" in msg and f"OSError: {HCCL_ERROR}" in msg
    assert "pip uninstall torch-npu" in msg
    assert "weight file" not in msg and "unreadable" not in msg
    if autoload:
        assert "torch's device-backend autoload" in msg and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in msg
    else:
        assert "is_torch_npu_available() in transformers" in msg and "TORCH_DEVICE_BACKEND_AUTOLOAD" not in msg
    assert not out.exists()


def test_devices_shows_the_vendor_error_and_explicit_npu_fails_with_it(tmp_path):
    site = vendor_site(tmp_path, autoload=True)
    proc = _run([*CLI, "devices", "--json"], site, tmp_path / "c")
    rep = json.loads(proc.stdout)
    npu = next(d for d in rep["drivers"] if d["name"] == "npu")
    (failure,) = npu["vendor_import_errors"]
    assert failure["package"] == "torch_npu" and failure["distribution"] == "torch-npu"
    assert failure["error"] == f"OSError: {HCCL_ERROR}" and failure["autoload"] is True
    assert any("`import torch` fails" in n and "torch_npu" in n for n in rep["notes"]), rep["notes"]
    text = _run([*CLI, "devices"], site, tmp_path / "c").stdout
    assert "vendor error" in text and HCCL_ERROR.split(":")[0] in text
    for cmd in (["devices", "--device", "npu"], ["run", "--device", "ascend", "--out", str(tmp_path / "o")]):
        proc = _run([*CLI, *cmd], site, tmp_path / "c")
        assert proc.returncode == 1, (cmd, proc.stderr[-3000:])
        said = proc.stdout + proc.stderr
        assert HCCL_ERROR in said and "torch_npu" in said, (cmd, said[-3000:])
    assert not (tmp_path / "o").exists()


def test_make_engine_names_the_broken_vendor_package_before_any_engine(tmp_path, demo):
    site = vendor_site(tmp_path, autoload=True)
    code = textwrap.dedent(f"""
        import json, sys
        from omni_backends.errors import VendorImportError
        from core.stage import make_engine
        try:
            make_engine({os.path.join(demo, "thinker")!r}, enforce_eager=True)
        except VendorImportError as exc:
            print(json.dumps({{"package": exc.package, "dist": exc.distribution, "msg": str(exc)}}))
    """)
    proc = _run(["-c", code], site, tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["package"] == "torch_npu" and out["dist"] == "torch-npu" and HCCL_ERROR in out["msg"]


KINDS = {"installed": False, "bare": True}  # a torch-npu distribution (dist-info + RECORD), or a bare directory


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_broken_vendor_package_does_not_stop_a_run_on_the_default_device(tmp_path, kind):
    """Issue 22: torch_npu without CANN (no autoload entry point, so torch imports) used to stop
    `run --device auto` (exit 1; a raw traceback through transformers for the bare package).
    Now the cpu run writes its outputs, saying once which package it hid and why."""
    site = vendor_site(tmp_path, autoload=False, bare=KINDS[kind])
    out = tmp_path / "out"
    proc = _run([*CLI, "run", "--device", "auto", "--out", str(out), "--max-tokens", "2"], site, tmp_path / "c",
                env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMNI_BACKENDS_CACHE": str(tmp_path / "cache")}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["codes.json", "out.wav", "summary.json", "thinker.txt"]
    assert json.loads((out / "summary.json").read_text())["device"]["selected"] == "cpu"
    warned = [line for line in proc.stderr.splitlines() if line.startswith("omni-backends: warning: torch_npu")]
    assert len(warned) == 1 and f"OSError: {HCCL_ERROR}" in warned[0] and "install CANN" in warned[0], proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]


THIRD_PARTY_VIEW = """
import importlib.util, json, os, subprocess, sys
import omni_backends.probing as probing
from omni_backends.registry import select
hidden_vendor_packages = getattr(probing, "hidden_vendor_packages", dict)  # (absent before issue 22)
sel = select("cpu")
from transformers.utils import import_utils
import vllm  # noqa: F401  (vLLM imports transformers)
child = subprocess.run([sys.executable, "-c", "import importlib.util, json, sys; "
                        "print(json.dumps([importlib.util.find_spec(m) is None for m in sys.argv[1:]]))",
                        *sys.argv[1:]], capture_output=True, text=True)
def outcome(call):
    try:
        return call()
    except Exception as exc:  # before issue 22: the vendor's OSError
        return f"raised {{type(exc).__name__}}: {{exc}}"
def imports():
    try:
        import {package}
        return True
    except ImportError:
        return False
print(json.dumps({{
    "spec_none": [importlib.util.find_spec(m) is None for m in sys.argv[1:]],
    "npu_available": outcome(import_utils.is_torch_npu_available),
    "package_available": outcome(lambda: import_utils._is_package_available("{package}", return_version=True)[0]),
    "imported": outcome(imports),
    "hidden": hidden_vendor_packages(),
    "notes": sel.notes,
    "child": child.stdout.strip() or child.stderr[-2000:],
}}))
"""


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("package, dist", [("torch_npu", "torch-npu"),
                                           ("intel_extension_for_pytorch", "intel-extension-for-pytorch")])
def test_a_broken_vendor_package_is_unavailable_to_third_party_checks_in_a_run(tmp_path, kind, package, dist):
    """After select() picked another driver, the broken package is absent for this process and
    for fresh interpreters it starts (vLLM inspects models in `python -m ...` children):
    find_spec is None, transformers' checks say unavailable, `import vllm` works, and the
    vendor's own error is recorded."""
    site = vendor_site(tmp_path, autoload=False, package=package, dist=dist, version="2.8.10", bare=KINDS[kind])
    proc = _run(["-c", THIRD_PARTY_VIEW.format(package=package), package], site, tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["spec_none"] == [True] and got["child"] == "[true]", got
    assert (got["npu_available"], got["package_available"], got["imported"]) == (False, False, False), got
    failure = got["hidden"][package]
    assert failure["error"] == f"OSError: {HCCL_ERROR}" and failure["package"] == package
    assert failure["distribution"] == (None if KINDS[kind] else dist)
    assert any(n.startswith(f"{package} hidden from this process: importable: no — OSError:") for n in got["notes"])
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_devices_and_explicit_npu_name_a_broken_vendor_package_installed_or_bare(tmp_path, kind):
    """Issue 22: with a bare torch_npu `devices` called npu "not-installed" without the
    OSError and `--device npu` did not name it."""
    site = vendor_site(tmp_path, autoload=False, bare=KINDS[kind])
    rep = json.loads(_run([*CLI, "devices", "--json"], site, tmp_path / "c").stdout)
    npu = next(d for d in rep["drivers"] if d["name"] == "npu")
    (failure,) = npu["vendor_import_errors"]
    assert failure["package"] == "torch_npu" and failure["error"] == f"OSError: {HCCL_ERROR}"
    assert failure["distribution"] == (None if KINDS[kind] else "torch-npu") and "install CANN" in failure["repair"]
    assert rep["selection"]["selected"] == "cpu"
    text = " ".join(_run([*CLI, "devices"], site, tmp_path / "c").stdout.split())
    assert f"importable: no — OSError: {HCCL_ERROR}" in text, text
    for cmd in (["devices", "--device", "npu"], ["run", "--device", "npu", "--out", str(tmp_path / "o")]):
        proc = _run([*CLI, *cmd], site, tmp_path / "c")
        assert proc.returncode == 1, (cmd, proc.stderr[-3000:])
        msg = " ".join((proc.stdout if cmd[0] == "devices" else _one_error(proc)).split())
        assert "not usable here" in msg and f"OSError: {HCCL_ERROR}" in msg, (cmd, msg)
        assert "install CANN" in msg and "set_env.sh" in msg, (cmd, msg)
        assert ("remove it from sys.path" if KINDS[kind] else "pip uninstall torch-npu") in msg, (cmd, msg)
    assert not (tmp_path / "o").exists()


def test_an_autoloaded_broken_vendor_package_is_not_hidden(tmp_path):
    """Where `import torch` itself fails (a torch.backends entry point that raises) hiding cannot
    help: nothing is hidden, and the run's one error still names TORCH_DEVICE_BACKEND_AUTOLOAD=0
    (test_broken_vendor_package_is_named_as_the_cause_of_a_failed_run)."""
    site = vendor_site(tmp_path, autoload=True)
    code = ("import json, omni_backends.probing as p; from omni_backends.registry import select; select('cpu'); "
            "print(json.dumps(getattr(p, 'hidden_vendor_packages', dict)()))")
    proc = _run(["-c", code], site, tmp_path / "c")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {}, proc.stderr[-3000:]
    proc = _run(["-c", code], site, tmp_path / "c", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0 and list(json.loads(proc.stdout)) == ["torch_npu"], proc.stderr[-3000:]


def test_find_import_failure_names_the_package_and_who_imported_it(tmp_path, monkeypatch):
    from omni_backends.errors import BadInputError
    from omni_backends.probing import find_import_failure, vendor_import_error

    (tmp_path / "vendor_broken").mkdir()
    (tmp_path / "vendor_broken" / "__init__.py").write_text("raise OSError('libvendor.so: missing')\n")
    info = tmp_path / "vendor_broken-1.0.dist-info"  # an installed distribution (a loose script is not blamed)
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-broken\nVersion: 1.0\n")
    (info / "RECORD").write_text("vendor_broken/__init__.py,,\n")
    (tmp_path / "third_party_check.py").write_text(
        "def is_vendor_available():\n    import vendor_broken\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import third_party_check

    try:
        try:
            third_party_check.is_vendor_available()
        except OSError as exc:
            raise BadInputError("weight file unreadable") from exc  # the symptom, as seen before the fix
    except BadInputError as exc:
        symptom = exc
        found = find_import_failure(symptom)
        blamed = vendor_import_error(symptom)
    assert found is not None and found.package == "vendor_broken"
    assert found.via == "is_vendor_available() in third_party_check" and not found.autoload
    assert found.error == "OSError: libvendor.so: missing"
    assert (found.distribution, found.version) == ("vendor-broken", "1.0")
    assert blamed is not None and "vendor_broken" in str(blamed) and blamed.__cause__ is symptom
    # a module no installed distribution owns (a script, a model's remote code) is not blamed
    (tmp_path / "loose_broken.py").write_text("raise OSError('loose')\n")
    try:
        import loose_broken  # noqa: F401
    except OSError as loose:
        assert find_import_failure(loose) is None
    # an exception no import raised is left alone
    try:
        raise ValueError("plain bad value")
    except ValueError as plain:
        assert find_import_failure(plain) is None and vendor_import_error(plain) is None


# ------------------------------------------------------------ 2. packaging metadata in the wild
FAKE = "fake_drivers:"


def _egg_info(root: Path, dist: str, version: str, eps: dict[str, str]) -> Path:
    """A stale ``<dist>.egg-info`` as ``setup.py develop`` leaves it in a source checkout."""
    info = root / f"{dist.replace('-', '_')}.egg-info"
    info.mkdir(parents=True)
    (info / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n" + "".join(f"{n} = {t}\n" for n, t in eps.items()))
    return info


STALE = {  # what an old checkout's egg-info declares for the same distribution
    "gone-target": {"usable-low": "fake_drivers_removed_long_ago:UsableLowBackend"},
    "old-name": {"low-old": FAKE + "UsableLowBackend"},
}


@pytest.mark.parametrize("order", ["egg-info-in-cwd-first", "egg-info-after"])
@pytest.mark.parametrize("stale", sorted(STALE))
def test_stale_egg_info_next_to_fresh_dist_info_finds_the_installed_driver(tmp_path, order, stale):
    site = make_site(tmp_path, {"fake-stale": {"usable-low": FAKE + "UsableLowBackend"}})
    checkout = tmp_path / "checkout"
    egg = _egg_info(checkout, "fake-stale", "0.1", STALE[stale])
    env = None
    if order == "egg-info-after":  # on PYTHONPATH behind the site; cwd elsewhere
        env = {"PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).parent / "fakes" / "modules"),
                                              str(checkout), os.environ.get("PYTHONPATH", "")])}
    cwd = checkout if order == "egg-info-in-cwd-first" else tmp_path  # `python -m` puts the cwd first
    proc = _run([*CLI, "devices", "--json", "--device", "usable-low"], site, tmp_path / "c", cwd=cwd, env=env)
    rep = json.loads(proc.stdout)
    assert proc.returncode == 0, (rep["selection"], proc.stderr[-2000:])
    assert rep["selection"]["selected"] == "usable-low"
    assert "low-old" not in [d["name"] for d in rep["drivers"]]
    if stale == "gone-target" or order == "egg-info-in-cwd-first":
        assert any("stale metadata" in n and str(egg) in n for n in rep["notes"]), rep["notes"]


def test_two_conflicting_dist_infos_are_refused_naming_every_record(tmp_path):
    one = make_site(tmp_path / "one", {"fake-split": {"usable-low": FAKE + "UsableLowBackend"}})
    two = make_site(tmp_path / "two", {"fake-split": {"usable-low": FAKE + "TieABackend"}})
    env = {"PYTHONPATH": os.pathsep.join([str(one), str(two), str(Path(__file__).parent / "fakes" / "modules"),
                                          os.environ.get("PYTHONPATH", "")])}
    rep = json.loads(_run([*CLI, "devices", "--json"], one, tmp_path / "c", env=env).stdout)
    row = next(d for d in rep["drivers"] if d["name"] == "usable-low")
    assert row["probe"] is None and "conflicting metadata records" in row["problem"]
    assert str(one) in row["problem"] and str(two) in row["problem"]
    proc = _run([*CLI, "devices", "--json", "--device", "usable-low"], one, tmp_path / "c", env=env)
    err = json.loads(proc.stdout)["selection"]["error"]
    assert proc.returncode == 1 and str(one) in err and str(two) in err


def test_stevedore_cache_with_swapped_targets_loads_the_installed_classes(tmp_path):
    if sys.executable.startswith("/tmp"):
        pytest.skip(f"stevedore never writes its cache for interpreters under /tmp ({sys.executable})")
    site = make_site(tmp_path, {"fake-ties": {"tie-a": FAKE + "TieABackend", "tie-b": FAKE + "TieBBackend"}})
    cache_home = tmp_path / "c"
    path = cache_file(site, cache_home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({  # the right names, swapped targets
        "groups": {GROUP: [["tie-a", FAKE + "TieBBackend", GROUP], ["tie-b", FAKE + "TieABackend", GROUP]]},
        "sys.executable": sys.executable, "sys.prefix": sys.prefix, "path_values": [],
    }))
    proc = _run([*CLI, "devices", "--json", "--device", "tie-a"], site, cache_home)  # -m: the cache's sys.path
    rep = json.loads(proc.stdout)
    assert proc.returncode == 0 and rep["selection"]["selected"] == "tie-a", (rep["selection"], proc.stderr)
    for name in ("tie-a", "tie-b"):
        row = next(d for d in rep["drivers"] if d["name"] == name)
        assert row["problem"] is None and row["identity"]["name"] == name, row
    assert any("tie-a = fake_drivers:TieBBackend (installed: fake_drivers:TieABackend)" in n for n in rep["notes"])


def test_driver_class_whose_name_differs_from_its_entry_point_is_refused_with_both(tmp_path):
    site = make_site(tmp_path, {"fake-misnamed": {"lowish": FAKE + "UsableLowBackend"}})
    rep = json.loads(_run([*CLI, "devices", "--json"], site, tmp_path / "c").stdout)
    row = next(d for d in rep["drivers"] if d["name"] == "lowish")
    assert "'lowish'" in row["problem"] and "'usable-low'" in row["problem"] and row["probe"] is None
    proc = _run([*CLI, "devices", "--device", "lowish"], site, tmp_path / "c")
    assert proc.returncode == 1 and "'usable-low'" in proc.stdout


# ----------------------------------------------------- 3. options checked first, one exit-status table
RUN_THEN_REPORT = """
import json, sys
from omni_backends.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "vllm": "vllm" in sys.modules, "torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("args, words", [
    (["--seed", "-1"], ["seed (--seed)", "0..4294967295", "-1"]),
    (["--seed", str(2**32)], ["seed (--seed)", str(2**32)]),
    (["--max-tokens", "0"], ["max_tokens (--max-tokens)", "got 0"]),
    (["--max-tokens", "100000"], ["max_tokens (--max-tokens)", "1..511"]),
    (["--voice", "-3"], ["voice (--voice)", ">= 0", "-3"]),
    (["--prompt", "  "], ["prompt is empty"]),
    (["--out", ""], ["out (--out)"]),
    (["--seed", "abc"], ["argument --seed: invalid int value: 'abc'"]),
])
def test_run_refuses_bad_option_values_before_vllm_with_one_line_and_status_2(tmp_path, args, words):
    site = make_site(tmp_path, {})
    out = tmp_path / "out"
    cmd = ["-c", RUN_THEN_REPORT, "run", "--out", str(out), "--model-dir", str(tmp_path / "nonexistent"), *args]
    if "--out" in args:
        cmd.remove(str(out)), cmd.remove("--out")
    proc = _run(cmd, site, tmp_path / "c")
    msg = _one_error(proc)
    for w in words:
        assert w in msg, (w, msg)
    if "abc" in args:  # argparse exits itself, with the same line format and status
        assert proc.returncode == 2
        return
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res == {"rc": 2, "vllm": False, "torch": False}, res
    assert not out.exists()


def test_python_api_refuses_bad_values_with_value_error_naming_the_argument_before_vllm(tmp_path):
    site = make_site(tmp_path, {})
    code = textwrap.dedent("""
        import json, sys
        from core.pipeline import RunConfig
        from core.stage import make_engine
        said = {}
        for name, call in {
            "run-seed": lambda: RunConfig(seed=-1),
            "run-voice": lambda: RunConfig(voice=True),
            "run-tokens": lambda: RunConfig(options={"max_tokens": 2.5}),
            "engine-seed": lambda: make_engine("/nowhere", seed=-1),
            "engine-len": lambda: make_engine("/nowhere", max_model_len=0),
            "engine-seqs": lambda: make_engine("/nowhere", max_num_seqs="8"),
            "engine-tp": lambda: make_engine("/nowhere", tensor_parallel_size=0),
            "engine-mem": lambda: make_engine("/nowhere", gpu_memory_utilization=1.5),
            "engine-model": lambda: make_engine(""),
        }.items():
            try:
                call()
                said[name] = None
            except ValueError as exc:
                said[name] = str(exc)
        print(json.dumps({"said": said, "vllm": "vllm" in sys.modules}))
    """)
    proc = _run(["-c", code], site, tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["vllm"] is False
    s = out["said"]
    assert "seed (--seed)" in s["run-seed"] and "voice (--voice) must be an integer" in s["run-voice"]
    assert "max_tokens" in s["run-tokens"]
    assert "seed must be in 0..4294967295" in s["engine-seed"] and "max_model_len must be >= 1" in s["engine-len"]
    assert "max_num_seqs must be an integer" in s["engine-seqs"]
    assert "tensor_parallel_size must be >= 1" in s["engine-tp"]
    assert "gpu_memory_utilization must be in (0, 1]" in s["engine-mem"] and "model must be" in s["engine-model"]


@pytest.mark.parametrize("command", [["devices"], ["run", "--out", "OUT"]])
def test_every_command_follows_the_exit_status_table(tmp_path, command):
    site = make_site(tmp_path, {})
    cmd = [c.replace("OUT", str(tmp_path / "o")) for c in command]
    def said(proc):
        return " ".join((proc.stderr + proc.stdout).split())  # the text report wraps lines

    unknown = _run([*CLI, *cmd, "--device", "nosuch"], site, tmp_path / "c")
    assert unknown.returncode == 2 and "unknown device 'nosuch'" in said(unknown)
    unusable = _run([*CLI, *cmd, "--device", "cuda"], site, tmp_path / "c")
    assert unusable.returncode == 1 and "not usable here" in said(unusable)
    bad_flag = _run([*CLI, *cmd, "--no-such-flag"], site, tmp_path / "c")
    assert bad_flag.returncode == 2 and _one_error(bad_flag).startswith("omni-backends: error: unrecognized argument")


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_an_empty_device_means_auto_from_the_flag_and_the_variable(tmp_path, how):
    site = make_site(tmp_path, {})
    env = {"OMNI_BACKENDS_DEVICE": "" if how == "variable" else "nosuch"}
    args = ["devices", "--json"] + (["--device", ""] if how == "flag" else [])
    proc = _run([*CLI, *args], site, tmp_path / "c", env=env)
    rep = json.loads(proc.stdout)
    assert proc.returncode == 0 and rep["selection"]["rule"] == "auto-detect", rep["selection"]
    assert rep["selection"]["selected"] == "cpu"


# ------------------------------------------------------------------ 4. torch's namespace
NAMESPACE_SNAPSHOT = """
import inspect, json, sys
import torch
def snap():
    return {name: {k: id(v) for k, v in vars(obj).items()}
            for name, obj in (("torch", torch), ("torch.cuda", torch.cuda), ("torch.Tensor", torch.Tensor),
                              ("torch.xpu", torch.xpu))}
from omni_backends.cpu.driver import CpuBackend
from omni_backends.cuda.driver import CudaBackend
from omni_backends.ascend.driver import AscendBackend
from omni_backends.xpu.driver import XpuBackend
before = snap()
calls = []
for cls in (CpuBackend, CudaBackend, AscendBackend, XpuBackend):
    cls.probe(); cls.identity()
    kw = {"load_vendor": False} if "load_vendor" in inspect.signature(cls).parameters else {}
    cls(**kw).capabilities()
    calls.append(cls.name)
after = snap()
changed = {n: sorted(k for k in before[n].keys() | after[n].keys() if before[n].get(k) != after[n].get(k))
           for n in before}
print(json.dumps({"calls": calls, "changed": {n: c for n, c in changed.items() if c},
                  "vllm": sorted(m for m in sys.modules if m.partition(".")[0] == "vllm")[:5]}))
"""


def test_probe_identity_and_capabilities_import_no_vllm_and_leave_torch_as_it_was(tmp_path):
    """The calls docs/vendor-drivers.md documents as vLLM-free, on every in-tree driver."""
    site = make_site(tmp_path, {})
    proc = _run(["-c", NAMESPACE_SNAPSHOT], site, tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["calls"] == ["cpu", "cuda", "npu", "xpu"]
    assert out["vllm"] == [], "imported vLLM: %s" % out["vllm"]
    assert out["changed"] == {}, out["changed"]


def test_what_vllm_itself_patches_on_import_is_what_the_docs_say(tmp_path):
    """Pins the vendor behaviour docs/vendor-drivers.md reports: ``import vllm`` rebinds
    ``torch.cuda.set_stream``; importing vLLM's CPU worker rebinds torch.cuda's stream and
    event API and two ``torch.Tensor`` methods. (If this fails after a vLLM upgrade, update
    the docs' list.)"""
    site = make_site(tmp_path, {})
    code = textwrap.dedent("""
        import json, types, torch
        def snap():  # submodules imported on the way are not patches
            return {n: {k: id(v) for k, v in vars(o).items() if not isinstance(v, types.ModuleType)} for n, o in
                    (("torch.cuda", torch.cuda), ("torch.Tensor", torch.Tensor))}
        def diff(a, b):
            return {n: sorted(k for k in a[n].keys() | b[n].keys() if a[n].get(k) != b[n].get(k)) for n in a}
        s0 = snap(); import vllm; s1 = snap()
        import vllm.v1.worker.cpu_worker; s2 = snap()
        print(json.dumps({"vllm": diff(s0, s1), "cpu_worker": diff(s1, s2)}))
    """)
    proc = _run(["-c", code], site, tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["vllm"] == {"torch.cuda": ["set_stream"], "torch.Tensor": []}
    assert out["cpu_worker"]["torch.cuda"] == ["Event", "Stream", "current_stream", "set_stream", "stream"]
    assert out["cpu_worker"]["torch.Tensor"] == ["pin_memory", "record_stream"]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "vendor-drivers.md").read_text()
    for name in ("torch.cuda.set_stream", "vllm/v1/worker/cpu/shm.py", "torch.Tensor.pin_memory"):
        assert name in doc, name
