"""Every vLLM symbol the core binds is declared once, in core/seams.py (or, for what a patch of a live vLLM
object assumes, in that patch's module under core/patches/), where check-drift reads it.

Read from the core's source (``ast``; lazy imports inside functions included): a ``VendorSymbol(...)`` built
anywhere in ``core/`` but ``core/seams.py`` and ``core/patches/``, or a ``from vllm... import NAME`` whose
``(module, NAME)`` is not one of ``core.seams.SYMBOLS``, fails here naming the file and line. So a new binding
cannot skip the drift check (``tests/test_patches.py``: every symbol of a patch module is one of its checks).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
DECLARATION = CORE / "seams.py"
PATCHES = CORE / "patches"
VENDOR_ROOTS = ("vllm",)


def bindings(path: pathlib.Path) -> tuple[list[tuple[str, str, int]], list[int]]:
    """``([(module, name, line) for every from-vllm import], [lines that build a VendorSymbol])`` of ``path``.
    ``import vllm.x`` (a whole module) is reported as ``(module, "*", line)``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imports: list[tuple[str, str, int]] = []
    builds: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.split(".")[0] in VENDOR_ROOTS:
            imports += [(node.module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            imports += [(a.name, "*", node.lineno) for a in node.names if a.name.split(".")[0] in VENDOR_ROOTS]
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            if name == "VendorSymbol":
                builds.append(node.lineno)
    return imports, builds


def undeclared(files: list[pathlib.Path], declared: set[tuple[str, str]]) -> list[str]:
    out = []
    for path in files:
        imports, builds = bindings(path)
        rel = path.relative_to(ROOT)
        for module, name, line in imports:
            if (module, name) not in declared:
                out.append(f"{rel}:{line}: from {module} import {name} is not declared in core/seams.py")
        if path != DECLARATION and PATCHES not in path.parents:
            out += [f"{rel}:{line}: VendorSymbol built outside core/seams.py and core/patches/" for line in builds]
    return out


def _declared() -> set[tuple[str, str]]:
    from core.seams import SYMBOLS

    return {(s.module, s.attr) for s in SYMBOLS}


def test_every_vllm_binding_of_the_core_is_declared_in_core_seams():
    files = sorted(CORE.rglob("*.py"))
    assert DECLARATION in files
    assert undeclared(files, _declared()) == []


def test_a_new_binding_outside_the_declaration_is_caught(tmp_path):
    """The check fails for both forms of a new binding (the control for the test above)."""
    src = tmp_path / "new_module.py"
    src.write_text("def f():\n    from vllm.v1.worker.gpu.model_runner import GPUModelRunner\n"
                   "    from omni_backends.binding import VendorSymbol\n"
                   "    return VendorSymbol('vllm.config', 'CUDAGraphMode', kind='class'), GPUModelRunner\n")
    imports, builds = bindings(src)
    assert imports == [("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", 2)] and builds == [4]
    assert ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner") not in _declared()


def test_the_contract_check_drift_reads_holds_every_declared_group_once():
    import core.seams as seams
    from omni_backends.binding import VendorSymbol

    assert seams.CONTRACT.symbols == seams.SYMBOLS
    assert len({id(s) for s in seams.SYMBOLS}) == len(seams.SYMBOLS)
    assert len({(s.module, s.attr) for s in seams.SYMBOLS}) == len(seams.SYMBOLS)  # one home per symbol
    module_level = {id(v) for v in vars(seams).values() if isinstance(v, VendorSymbol)}
    grouped = {id(s) for s in seams.SYMBOLS}
    assert module_level <= grouped, "a symbol declared in core/seams.py is missing from SYMBOLS"
    for group in ("IMPORTED", "ENGINE_SYMBOLS", "PIPELINE_SYMBOLS", "GRAPH_SYMBOLS", "V1_SYMBOLS", "V2_SYMBOLS"):
        assert {id(s) for s in getattr(seams, group)} <= grouped, group


@pytest.mark.parametrize("module", ["core.runner.v1", "core.runner.model_state", "core.runner.v2",
                                    "core.hooks.graphs", "core.model_io", "core.engine"])
def test_runner_modules_import_the_declaration_instead_of_restating_it(module):
    import importlib

    from omni_backends.binding import VendorSymbol

    mod = importlib.import_module(module)
    import core.seams as seams

    declared = {id(v) for v in vars(seams).values() if isinstance(v, VendorSymbol)}
    declared |= {id(s) for p in seams.CONTRACT.patches for s in p.checks}
    own = [n for n, v in vars(mod).items() if isinstance(v, VendorSymbol) and id(v) not in declared]
    assert own == [], f"{module} declares its own vendor symbols {own}: declare them in core/seams.py"


def test_the_vllm_omni_seams_are_proven_against_the_installed_wheel():
    """What vLLM-Omni's models read from the core (``core.seams.VLLM_OMNI_SYMBOLS``) is resolved by
    ``check-drift`` against the installed vllm-omni (its installed mode reads every top-level package the
    contract names); a seam whose behaviour is gone from that source is drift (the control)."""
    import dataclasses

    from core.models import vllm_omni
    from core.seams import CODE2WAV_READS_DECODE_CONFIG, CONTRACT, VLLM_OMNI_SYMBOLS
    from omni_backends.drift.cli import run_check
    from omni_backends.drift.model import Declared
    from omni_backends.drift.symbols import check_declarations

    if vllm_omni.installed_version() is None:
        pytest.skip("vllm-omni is not installed (scripts/setup.sh test installs it)")
    vllm_omni.load_module("model_executor.models.qwen3_tts.configuration_qwen3_tts", platform=False)  # bare: no spec
    report = run_check(["cpu"], contracts=[CONTRACT])
    core = next(r for r in report["contract_symbols"] if r["driver"] == "core")
    assert core["checked"] == core["symbols"] == len(CONTRACT.symbols) and core["drift"] == 0, core["findings"]
    from omni_backends.drift.cli import installed_sources

    resolver = installed_sources({"vllm_omni"})
    ok = check_declarations("core", [Declared(s.qualname, s, ()) for s in VLLM_OMNI_SYMBOLS], resolver)
    assert ok.checked == len(VLLM_OMNI_SYMBOLS) and not ok.drift
    gone = dataclasses.replace(CODE2WAV_READS_DECODE_CONFIG, mentions=("decode_setting_that_is_not_there",))
    bad = check_declarations("core", [Declared(gone.qualname, gone, ())], resolver)
    assert [f.kind for f in bad.drift] == ["missing-behaviour"], [f.to_json() for f in bad.findings]
