"""``omni-backends devices`` and the tool's help, in fresh processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fakes.sites import cli, devices_json, driver, env_for, make_site

REAL = ("cpu", "cuda", "npu", "xpu")


@pytest.fixture
def site(tmp_path):
    return make_site(tmp_path, {
        "fake-low": {"usable-low": "fake_drivers:UsableLowBackend"},
        "fake-nodev": {"nodev": "fake_drivers:NoDeviceBackend"},
        "fake-heavy": {"heavy-caps": "fake_drivers:HeavyCapabilitiesBackend"},
        "fake-incomplete": {"incomplete": "fake_drivers:IncompleteBackend"},
        "fake-boom": {"boom": "fake_boom_runtime:X"},
    })


def _script() -> list[str]:
    """The installed console script if there is one next to this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("omni-backends")
    return [str(script)] if script.exists() else [sys.executable, "-m", "omni_backends.cli"]


def test_help_explains_the_tool_and_selection(tmp_path):
    env = env_for(tmp_path, tmp_path / "cache")
    top = subprocess.run([*_script(), "--help"], capture_output=True, text=True, env=env)
    assert top.returncode == 0
    for phrase in ("omni-modality", "devices", "--device", "OMNI_BACKENDS_DEVICE", "auto-detect",
                   "usable", "ascend", "omni_backends.drivers"):
        assert phrase in top.stdout, phrase
    sub = subprocess.run([*_script(), "devices", "--help"], capture_output=True, text=True, env=env)
    assert sub.returncode == 0
    for phrase in ("not-installed", "installed", "importable", "usable", "exit status", "--json",
                   "--device", "no vendor stack", "capability"):
        assert phrase in sub.stdout, phrase


def test_no_command_prints_help_and_fails(tmp_path):
    proc = subprocess.run(_script(), capture_output=True, text=True, env=env_for(tmp_path, tmp_path / "cache"))
    assert proc.returncode == 2 and "devices" in proc.stdout


def test_text_report_lists_every_driver_with_state_reason_and_selection(site, tmp_path):
    proc = cli(["devices"], site, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    table = out.split("\n\n")[1].splitlines()
    header, rows = table[0], table[1:]
    assert header.split() == ["DRIVER", "STATE", "PRIORITY", "DISTRIBUTION", "VERIFIED", "BY"]
    names = [r.split()[0] for r in rows]
    assert set(REAL) <= set(names) and {"usable-low", "nodev", "boom", "heavy-caps"} <= set(names)
    # the columns line up: each row's STATE starts where the header's does
    col = header.index("STATE")
    for r in rows:
        assert r[col - 2:col] == "  " and r[col] != " ", r
    row = {r.split()[0]: r.split() for r in rows}
    assert row["usable-low"][1:3] == ["*", "usable"] and row["usable-low"][3] == "40"
    assert row["nodev"][1] == "importable" and row["boom"][1] == "error"
    assert "reports 0 devices" in out and "fake vendor runtime refused" in out
    assert "would select: usable-low  (rule: auto-detect)" in out
    flat = " ".join(out.split())
    assert "note nodev (priority 50) skipped: fake vendor package imports but reports 0 devices" in flat


def _block(out: str, name: str) -> str:
    return out.split(f"\n  {name}\n", 1)[1].split("\n\n", 1)[0]


def test_text_report_shows_capability_flags_when_cheap(site, tmp_path):
    out = cli(["devices"], site, tmp_path / "cache").stdout
    caps = " ".join(_block(out, "usable-low").split())
    for flag in ("static_graph_modes none", "h2d_stream_ordered yes", "pinned_memory no", "v2_runner no"):
        assert flag in caps, flag
    assert "not shown: needs torch" in _block(out, "heavy-caps")
    assert "not shown: driver class is incomplete" in _block(out, "incomplete")
    assert "capabilities" not in _block(out, "boom")


def test_json_report_shape(site, tmp_path):
    rep = devices_json(site, tmp_path / "cache")
    assert rep["interface_version"] == 1
    low = driver(rep, "usable-low")
    assert low["probe"]["state"] == "usable" and low["probe"]["versions"] == {"fake-vendor": "1.0"}
    assert low["identity"]["device_type"] == "cpu" and low["verification"] == ["simulated"]
    assert low["capabilities"]["v1_runner"] is True and low["capabilities_skipped"] is None
    assert driver(rep, "heavy-caps")["capabilities"] is None
    for name in REAL:
        d = driver(rep, name)
        assert d["probe"]["state"] in ("not-installed", "installed", "importable", "usable")
        assert d["probe"]["reason"] and d["verification"] and d["identity"]["name"] == name
    assert driver(rep, "npu")["identity"]["aliases"] == ["ascend"]
    sel = rep["selection"]
    assert sel["selected"] == "usable-low" and "candidates" not in sel
    assert len(sel["fingerprint"]) == 16


def test_real_drivers_on_this_machine(tmp_path):
    """No fakes: the in-tree drivers only (plus whatever else is installed)."""
    rep = devices_json(make_site(tmp_path, {}), tmp_path / "cache")
    for name in REAL:
        assert driver(rep, name)["problem"] is None, driver(rep, name)["problem"]
    if driver(rep, "cpu")["probe"]["usable"]:
        assert rep["selection"]["selected"] is not None
        assert rep["_returncode"] == 0


def test_the_text_report_says_what_each_verification_means():
    """The table's VERIFIED BY words are explained under it, one meaning each (from ``Verification.meaning``)."""
    from omni_backends.backend import Verification
    from omni_backends.cli import render_devices_text

    report = {"interface_version": 1, "selection": {"selected": "cpu", "rule": "test", "reason": "test"},
              "drivers": [{"name": "cpu", "priority": 0, "distribution": "omni-backends",
                           "verification": [v.value for v in Verification]}]}
    text = " ".join(render_devices_text(report).split())  # the legend is wrapped: compare with single spaces
    assert "verified by" in text
    for v in Verification:
        assert f"{v.value}: {v.meaning}" in text and v.meaning, v


def test_broken_pipe_is_quiet(site, tmp_path):
    env = env_for(site, tmp_path / "cache")
    cmd = f"{' '.join(_script())} devices --json | head -c 10"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, env=env, cwd=site)
    assert proc.stdout == '{\n  "inter'
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_command_plugins_load_and_a_broken_one_only_warns(tmp_path):
    site = make_site(
        tmp_path,
        {"fake-boom": {"boom": "fake_boom_oserror:X"}, "fake-low": {"usable-low": "fake_drivers:UsableLowBackend"}},
        # "a-raises" and "a-dup" sort before "select-now": a failing plugin must not stop later ones
        commands={"fake-cmds": {"select-now": "fake_commands:add_select_now",
                                "broken-cmd": "fake_commands_broken:add",
                                "a-raises": "fake_commands:add_raises",
                                "a-dup": "fake_commands:add_duplicate_devices"}},
    )
    ok = cli(["select-now", "--device", "USABLE-LOW"], site, tmp_path / "cache")
    assert ok.returncode == 0 and ok.stdout.strip() == "selected usable-low", ok.stderr
    assert "warning: command 'broken-cmd'" in ok.stderr and "not installed" in ok.stderr
    assert "warning: command 'a-raises'" in ok.stderr and "broke while adding its parser" in ok.stderr
    assert "warning: command 'a-dup'" in ok.stderr
    assert "devices" in cli(["--help"], site, tmp_path / "cache").stdout  # built-in command still there
    # a command that selects a driver whose import failed: one clear error plus the original traceback
    bad = cli(["select-now", "--device", "boom"], site, tmp_path / "cache")
    assert bad.returncode == 1  # a driver that fails to import: the environment (README, exit statuses)
    assert "omni-backends: error: driver 'boom'" in bad.stderr
    assert "fake_boom_oserror.py" in bad.stderr and "OSError: libfakehccl.so" in bad.stderr
    unknown = cli(["select-now", "--device", "tpu"], site, tmp_path / "cache")
    assert unknown.returncode == 2 and "unknown device 'tpu'" in unknown.stderr and "Traceback" not in unknown.stderr


def test_command_plugins_survive_a_corrupt_stevedore_cache(tmp_path):
    from fakes.sites import cache_file

    site = make_site(tmp_path, {"fake-low": {"usable-low": "fake_drivers:UsableLowBackend"}},
                     commands={"fake-cmds": {"select-now": "fake_commands:add_select_now"}})
    path = cache_file(site, tmp_path / "cache")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe not a cache \x80")
    proc = cli(["select-now", "--device", "usable-low"], site, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "selected usable-low"
    assert "stevedore" in proc.stderr and str(path.parent) in proc.stderr  # says which cache to delete


@pytest.mark.parametrize("how", ["flag", "env"])
def test_devices_with_an_unknown_device_gives_one_error_line_and_status_2(tmp_path, how):
    """Like ``run``: one ``omni-backends: error:`` line on stderr (the report on stdout says it too)."""
    env = env_for(tmp_path, tmp_path / "cache")
    args = ["devices", "--device", "nosuch"] if how == "flag" else ["devices"]
    if how == "env":
        env["OMNI_BACKENDS_DEVICE"] = "nosuch"
    p = subprocess.run([*_script(), *args], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2
    errors = [line for line in p.stderr.splitlines() if line.startswith("omni-backends: error:")]
    assert len(errors) == 1 and "unknown device 'nosuch'" in errors[0], p.stderr


def _stale_egg_info(checkout, commands: dict[str, str]):
    """A stale ``fake_cmds.egg-info`` (what an old ``setup.py develop`` leaves in a source checkout)."""
    info = checkout / "fake_cmds.egg-info"
    info.mkdir(parents=True)
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: fake-cmds\nVersion: 0.1\n")
    lines = ["[omni_backends.drivers]", "usable-low = fake_drivers:UsableLowBackend", ""]
    if commands:
        lines += ["[omni_backends.commands]", *(f"{n} = {t}" for n, t in commands.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))


@pytest.mark.parametrize("stale", ["egg-info-without-commands", "egg-info-other-target", "cache-without-commands",
                                   "cache-wrong-target"])
def test_installed_commands_survive_stale_metadata_and_a_stale_stevedore_cache(tmp_path, stale):
    """The command namespace is cross-checked against the installed metadata as the drivers' is: a stale
    ``.egg-info`` first on ``sys.path`` (the cwd, ``python -m``) or a stevedore cache that lists no command or
    the wrong target never hides an installed command (``invalid choice: 'select-now'``)."""
    import json

    from fakes.sites import COMMANDS, GROUP, cache_file

    site = make_site(tmp_path, {"fake-cmds": {"usable-low": "fake_drivers:UsableLowBackend"}},
                     commands={"fake-cmds": {"select-now": "fake_commands:add_select_now"}})
    cwd, cache_home = site, tmp_path / "cache"
    if stale.startswith("egg-info"):
        cwd = tmp_path / "checkout"
        _stale_egg_info(cwd, {} if stale == "egg-info-without-commands" else
                        {"select-now": "fake_commands_removed_long_ago:add"})
    else:
        if sys.executable.startswith("/tmp"):
            pytest.skip(f"stevedore never writes its cache for interpreters under /tmp ({sys.executable})")
        path = cache_file(site, cache_home)
        path.parent.mkdir(parents=True, exist_ok=True)
        cmds = [] if stale == "cache-without-commands" else [["select-now", "fake_commands_removed_long_ago:add",
                                                              COMMANDS]]
        path.write_text(json.dumps({
            "groups": {GROUP: [["usable-low", "fake_drivers:UsableLowBackend", GROUP]], COMMANDS: cmds},
            "sys.executable": sys.executable, "sys.prefix": sys.prefix, "path_values": []}))
    proc = subprocess.run([sys.executable, "-m", "omni_backends.cli", "select-now", "--device", "usable-low"],
                          cwd=cwd, env=env_for(site, cache_home), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "selected usable-low", proc.stderr
    assert "invalid choice" not in proc.stderr and "Traceback" not in proc.stderr


def test_incomplete_driver_class_shows_what_run_will_do(site, tmp_path):
    """A driver class with abstract methods left: `devices` says `run` refuses it (state error, exit 1 when
    named, never auto-selected), with the message `run` gives, not "usable" and exit 0."""
    from omni_backends.backend import Backend

    missing = ", ".join(sorted(Backend.__abstractmethods__ - {"probe"}))
    named = devices_json(site, tmp_path / "cache", "--device", "incomplete")
    inc = driver(named, "incomplete")
    assert named["_returncode"] == 1, named
    assert f"(missing: {missing})" in inc["problem"] and "`run` refuses it" in inc["problem"]
    assert named["selection"]["selected"] is None and "IncompatibleDriverError" in named["selection"]["error"]
    text = cli(["devices", "--device", "incomplete"], site, tmp_path / "cache")
    assert text.returncode == 1
    row = [r for r in text.stdout.splitlines() if r.strip().startswith("incomplete ")][0]
    assert row.split()[1] == "error", row
    run = cli(["run", "--device", "incomplete", "--model-dir", str(tmp_path)], site, tmp_path / "cache")
    assert run.returncode == 1 and f"(missing: {missing})" in run.stderr, run.stderr[-2000:]
    auto = devices_json(site, tmp_path / "cache")
    assert auto["selection"]["selected"] != "incomplete"


def test_out_of_tree_verification_is_labelled_as_declared_by_its_vendor(site, tmp_path):
    """This project's CI backs its own drivers' verification levels; an out-of-tree driver's are its vendor's claim."""
    rep = devices_json(site, tmp_path / "cache")
    assert driver(rep, "usable-low")["verification_declared_by"] == "fake-low"
    assert all(driver(rep, name)["verification_declared_by"] is None for name in REAL)
    out = cli(["devices"], site, tmp_path / "cache").stdout
    rows = {r.split()[0]: r for r in out.split("\n\n")[1].splitlines()[1:]}
    assert rows["usable-low"].rstrip().endswith("simulated (declared by vendor)"), rows["usable-low"]
    assert "declared by vendor" not in rows["cpu"]
    assert "not checked by this project" in " ".join(out.split())
