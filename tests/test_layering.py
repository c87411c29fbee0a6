"""Layering rules, checked on the source (AST) and on what imports really load.

1. ``core/`` never names a device: no ``torch.cuda`` / ``.npu`` / ``.xpu``
   attribute (nor ``.cuda()``-style moves), no ``.is_cuda``-style test, no
   import of a device module or vendor device stack, no ``"cuda"``, ``"npu"``,
   ``"xpu"``, ``"nccl"``, ``"hccl"``, ``"xccl"`` in a string literal of code
   (docstrings and comments may mention devices).
2. ``omni_backends/`` never imports ``core``.
3. No module under ``omni_backends/`` or ``core/`` rebinds an attribute of
   ``torch`` (``torch.cuda = ...``, ``setattr(torch, ...)``,
   ``sys.modules["torch..."] = ...``, ``del torch.x``), whatever name torch is
   imported under.
4. Importing any ``omni_backends`` module loads no vendor stack (and, outside
   the conformance suite's test modules, not even torch); checked in a fresh
   interpreter per module, naming the ``file:line`` that triggered the import.

Every failure message names ``file:line``.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
PKG = ROOT / "omni_backends"

DEVICE_ATTRS = {"cuda", "npu", "xpu"}
DEVICE_TESTS = {"is_cuda", "is_npu", "is_xpu"}
DEVICE_WORD = re.compile(r"(?<![A-Za-z0-9])(cuda|npu|xpu|nccl|hccl|xccl)(?![A-Za-z0-9])", re.IGNORECASE)
VENDOR_DEVICE_STACKS = {"torch_npu", "intel_extension_for_pytorch", "vllm_ascend", "ipex"}
#: what importing an omni_backends module must not load
VENDOR_STACKS = ["vllm", "vllm_ascend", "torch_npu", "intel_extension_for_pytorch", "triton", "core"]


def py_files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def where(path: pathlib.Path, node: ast.AST) -> str:
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        rel = path
    return f"{rel}:{getattr(node, 'lineno', 0)}"


def parse(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def documentation_strings(tree: ast.AST) -> set[int]:
    """ids of string constants that are documentation: docstrings and any other
    bare string statement (attribute docs); never executed as data."""
    docs: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                docs.add(id(stmt.value))
    return docs


def _import_roots(node: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, imported names) of an Import / ImportFrom node."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [(node.module, [a.name for a in node.names])]
    return []


def _dynamic_import_target(node: ast.AST) -> str | None:
    """``importlib.import_module("x")`` / ``__import__("x")`` with a literal name."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


# ------------------------------------------------------------------ scanners
def device_names_in(path: pathlib.Path) -> list[str]:
    """Places where ``path`` names a device (rule 1)."""
    tree = parse(path)
    docs = documentation_strings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in DEVICE_ATTRS:
            found.append(f"{where(path, node)}: device attribute .{node.attr} ({ast.unparse(node)})")
        elif isinstance(node, ast.Attribute) and node.attr in DEVICE_TESTS:
            found.append(f"{where(path, node)}: device test .{node.attr}; use Backend.is_device_tensor")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            m = DEVICE_WORD.search(node.value)
            if m:
                found.append(f"{where(path, node)}: device name {m.group(1)!r} in string literal {node.value!r}")
        else:
            for module, names in _import_roots(node):
                parts = module.split(".")
                if parts[0] in VENDOR_DEVICE_STACKS or DEVICE_ATTRS & (set(parts[1:]) | set(names)):
                    found.append(f"{where(path, node)}: imports a device module ({module} {names or ''})".rstrip())
    return found


def core_imports_in(path: pathlib.Path) -> list[str]:
    """Places where ``path`` imports the ``core`` package (rule 2)."""
    tree = parse(path)
    found = []
    for node in ast.walk(tree):
        targets = [m for m, _ in _import_roots(node)]
        dyn = _dynamic_import_target(node)
        if dyn:
            targets.append(dyn)
        for module in targets:
            if module == "core" or module.startswith("core."):
                found.append(f"{where(path, node)}: imports {module!r}; omni_backends must not import core")
    return found


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _torch_aliases(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    names.add(a.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "torch":
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign) and (_dynamic_import_target(node.value) or "").split(".")[0] == "torch":
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _flat_targets(targets: list[ast.AST]) -> list[ast.AST]:
    out: list[ast.AST] = []
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            out.extend(_flat_targets(list(t.elts)))
        elif isinstance(t, ast.Starred):
            out.extend(_flat_targets([t.value]))
        else:
            out.append(t)
    return out


def _is_sys_modules_torch_key(target: ast.AST) -> bool:
    if not (isinstance(target, ast.Subscript) and ast.unparse(target.value) == "sys.modules"):
        return False
    key = target.slice
    return isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.split(".")[0] == "torch"


def torch_rebinding_in(path: pathlib.Path) -> list[str]:
    """Places where ``path`` rebinds or deletes an attribute of torch (rule 3)."""
    tree = parse(path)
    aliases = _torch_aliases(tree)
    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in _flat_targets(targets):
            if isinstance(t, (ast.Attribute, ast.Subscript)) and _root_name(t) in aliases:
                found.append(f"{where(path, node)}: rebinds torch attribute {ast.unparse(t)}")
            elif _is_sys_modules_torch_key(t):
                found.append(f"{where(path, node)}: replaces torch module {ast.unparse(t)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and _root_name(node.args[0]) in aliases:
                found.append(f"{where(path, node)}: {node.func.id} on torch ({ast.unparse(node)})")
    return found


def _fmt(problems: list[str]) -> str:
    return "\n  " + "\n  ".join(problems)


# ------------------------------------------------------- the rules on the tree
def test_core_never_names_a_device():
    problems = [p for f in py_files(CORE) for p in device_names_in(f)]
    assert not problems, "core/ must reach devices only through the Backend:" + _fmt(problems)


def test_omni_backends_never_imports_core():
    problems = [p for f in py_files(PKG) for p in core_imports_in(f)]
    assert not problems, "imports run core -> omni_backends, never back:" + _fmt(problems)


def test_no_module_rebinds_torch_attributes():
    problems = [p for root in (PKG, CORE) for f in py_files(root) for p in torch_rebinding_in(f)]
    assert not problems, "no global torch monkeypatching:" + _fmt(problems)


# The scanners themselves must catch what they claim to catch.
BAD_CORE = '''\
"""Docstrings may say cuda, npu, xpu and nccl."""
import torch
import torch_npu
from torch import cuda
from vllm.platforms import xpu  # comment: cuda is fine here
x = torch.cuda.is_available()
y = t.is_cuda
z = t.npu()
d = torch.device("cuda:0")
backend = f"hccl-{n}"
ok = "input CUDAGraphMode cudagraph_runtime_mode"
'''

BAD_TORCH = '''\
import torch as th
import importlib
from torch import cuda as c
t2 = importlib.import_module("torch")
th.cuda = th.xpu
c.synchronize = lambda: None
setattr(th, "npu", object())
th.backends.x, other = 1, 2
del th.foo
sys.modules["torch.cuda"] = None
t2.accelerator.thing += 1
th.__dict__["k"] = 1
fine = th.cuda  # reading is fine
local = {}
local["torch"] = 1
'''


BAD_IMPORTS = """\
import core.hooks
from core import runner
import importlib
importlib.import_module('core.stage')
import corelib
from omni_backends import core_like
"""


def _scan(tmp_path, source: str, scanner) -> tuple[list[str], list[int]]:
    f = tmp_path / "bad.py"
    f.write_text(source)
    found = scanner(f)
    assert all(p.startswith(f"{f}:") for p in found), found
    return found, sorted(int(p.split(":")[1]) for p in found)


@pytest.mark.parametrize("source, scanner, lines", [
    (BAD_CORE, device_names_in, [3, 4, 5, 6, 7, 8, 9, 10]),
    (BAD_TORCH, torch_rebinding_in, [5, 6, 7, 8, 9, 10, 11, 12]),
    (BAD_IMPORTS, core_imports_in, [1, 2, 4]),
], ids=["device-names", "torch-rebinding", "core-imports"])
def test_scanner_reports_each_offence_with_file_and_line(tmp_path, source, scanner, lines):
    found, got = _scan(tmp_path, source, scanner)
    assert got == lines, found


def test_device_scanner_says_what_to_use_instead(tmp_path):
    found, _ = _scan(tmp_path, BAD_CORE, device_names_in)
    assert any("is_cuda" in p and "Backend.is_device_tensor" in p for p in found)


# -------------------------------------------- what importing really loads
PROBE = textwrap.dedent("""
    import importlib, json, sys, traceback
    PKG, VENDOR, modules = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    first = {}

    class Spy:
        def find_spec(self, fullname, path=None, target=None):
            root = fullname.partition(".")[0]
            if root in VENDOR and root not in first:
                frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(PKG)]
                f = frames[-1] if frames else None
                first[root] = f"{f.filename}:{f.lineno}" if f else "?"
            return None

    sys.meta_path.insert(0, Spy())
    loaded = {}
    for m in modules:
        importlib.import_module(m)
        loaded[m] = sorted(r for r in VENDOR if r in sys.modules)
    print(json.dumps({"loaded": loaded, "first": first}))
""")


def _omni_backends_modules() -> tuple[list[str], list[str]]:
    """(library modules, conformance-suite modules) under omni_backends."""
    lib, suite = [], []
    for f in py_files(PKG):
        rel = f.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        name = ".".join(parts)
        (suite if name.startswith("omni_backends.testing.suite.") else lib).append(name)
    return lib, suite


def _probe(modules: list[str], vendor: list[str]) -> dict:
    env = dict(os.environ)
    env.pop("OMNI_BACKENDS_SELECTION", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(PKG) + os.sep, json.dumps(vendor), json.dumps(modules)],
        capture_output=True, text=True, timeout=180, cwd=str(ROOT), env=env,
    )
    assert proc.returncode == 0, f"importing {modules} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_any_omni_backends_module_loads_no_vendor_stack_nor_torch():
    lib, _ = _omni_backends_modules()
    assert "omni_backends.cpu.driver" in lib and "omni_backends.cuda.driver" in lib
    problems = []
    for module in lib:  # a fresh interpreter each: an earlier import cannot hide a later one
        out = _probe([module], VENDOR_STACKS + ["torch"])
        for root in out["loaded"][module]:
            problems.append(f"{out['first'].get(root, '?')}: importing {module} loads {root!r}; import it inside the function that needs it")
    assert not problems, "vendor stacks must be imported lazily:" + _fmt(problems)


def test_conformance_suite_modules_import_torch_but_no_vendor_stack():
    _, suite = _omni_backends_modules()
    assert suite, "the conformance suite has test modules"
    out = _probe(suite, VENDOR_STACKS)
    problems = [f"{out['first'].get(r, '?')}: importing {m} loads {r!r}" for m, roots in out["loaded"].items() for r in roots]
    assert not problems, "the conformance suite must import vendor stacks lazily (the driver does):" + _fmt(problems)


def test_import_probe_names_the_line_that_imports_a_vendor_stack(tmp_path):
    pkg = tmp_path / "omni_backends_fake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "eager.py").write_text("import json\nimport xml.dom  # stands in for a vendor stack\n")
    code = PROBE
    proc = subprocess.run(
        [sys.executable, "-c", code, str(pkg) + os.sep, json.dumps(["xml"]), json.dumps(["omni_backends_fake.eager"])],
        capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["loaded"]["omni_backends_fake.eager"] == ["xml"]
    assert out["first"]["xml"] == f"{pkg / 'eager.py'}:2"
