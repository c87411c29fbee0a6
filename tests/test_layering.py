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
5. No import circle among the modules of ``core/`` and ``omni_backends/``:
   the strongly connected components of the import graph read with AST
   (module-level and lazy imports alike, see :func:`import_graph`).
6. No product file (under ``core/`` or ``omni_backends/``) is over 600 lines.
7. Serving (``core/serving/``) and the stage graph (``core/pipeline/graph/``) know no pipeline: none of their
   modules imports a declaration (``core.pipeline.declarations.<name>``; the registry package itself, which
   resolves a model to its declaration, is allowed) or a model family (``core.models.<name>`` but the modules
   that are no family, :data:`MODELS_NOT_A_FAMILY`), lazily or not, nor holds a declared pipeline's name as a
   string (a switch on it). What differs per pipeline is its declaration's (``PipelineSpec.speech``,
   ``options``, ``served_name``); ``tests/core/test_new_family.py`` adds a family without touching them.

Every failure message names ``file:line`` (rule 6: the file and its length).
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
            found.append(f"{where(path, node)}: device test .{node.attr}; compare tensor.device.type with Backend.device_type")
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
    assert any("is_cuda" in p and "Backend.device_type" in p for p in found)


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


# ------------------------------------------------------------ import circles and file sizes
#: the product packages: no import circle among their modules, no file over MAX_LINES
PRODUCT = (CORE, PKG)
MAX_LINES = 600


def module_names(roots: tuple[pathlib.Path, ...], base: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """``{dotted module name: file}`` of every ``.py`` file under ``roots`` (a package is its ``__init__.py``)."""
    out = {}
    for root in roots:
        for f in py_files(root):
            parts = f.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _import_base(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from X import ...`` in ``module`` reads from (relative levels resolved)."""
    if node.level == 0:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(parts) - 1:
        return None  # beyond the top-level package
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, dict[str, str]]:
    """``{module: {imported module: file:line of the first such import}}`` among ``modules``.

    Every import counts, wherever it sits: module level, inside functions (lazy imports),
    under ``if TYPE_CHECKING:``, and ``importlib.import_module("literal")``. ``import a.b``
    imports ``a.b``; ``from a import b`` imports the submodule ``a.b`` when there is one, else
    ``a``; relative imports are resolved against the importing module. Importing a submodule is
    not counted as importing its parent package (whose ``__init__`` then runs): a package that
    re-exports its submodules is no circle."""
    graph: dict[str, dict[str, str]] = {m: {} for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(parse(path)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _import_base(module, is_package, node)
                if base is not None:
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif _dynamic_import_target(node):
                targets = [_dynamic_import_target(node)]
            for target in targets:
                if target in modules and target != module:
                    graph[module].setdefault(target, where(path, node))
    return graph


def strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module, each sorted,
    in sorted order (Tarjan's algorithm, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def import_circles(roots: tuple[pathlib.Path, ...], base: pathlib.Path = ROOT) -> list[str]:
    """One line per import circle among the modules under ``roots``: its modules, then each
    import inside it with ``file:line``."""
    graph = import_graph(module_names(roots, base))
    out = []
    for component in strongly_connected(graph):
        inside = [f"{a} -> {b} ({graph[a][b]})" for a in component for b in sorted(graph[a]) if b in component]
        out.append(f"{' <-> '.join(component)}: " + "; ".join(inside))
    return out


def long_files(roots: tuple[pathlib.Path, ...], limit: int = MAX_LINES) -> list[str]:
    """``file: N lines`` for every ``.py`` file under ``roots`` longer than ``limit`` lines."""
    out = []
    for root in roots:
        for f in py_files(root):
            n = len(f.read_text(encoding="utf-8").splitlines())
            if n > limit:
                out.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}: {n} lines")
    return out


def test_no_import_circle_in_product_code():
    circles = import_circles(PRODUCT)
    assert not circles, "imports run one way (lazy imports count too); break each circle:" + _fmt(circles)


def test_no_product_file_is_over_600_lines():
    problems = long_files(PRODUCT)
    assert not problems, f"split these by job (no product file over {MAX_LINES} lines):" + _fmt(problems)


CIRCLES = {
    "pkg/__init__.py": "from pkg.a import thing\nfrom pkg import b\n",  # re-exports: no circle with its submodules
    "pkg/a.py": "from pkg import b  # a submodule\nthing = 1\n",
    "pkg/b.py": "def lazy():\n    from .c import x\n",
    "pkg/c.py": "import json\nx = 1\ndef later():\n    from . import a\n",
    "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.e\n",
    "pkg/e.py": "import importlib\nmod = importlib.import_module('pkg.d')\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/g.py": "from ..h import y\n",
    "pkg/h.py": "y = 1\ndef f():\n    import pkg.sub.g\n",
    "pkg/alone.py": "import pkg\nfrom pkg import thing\nfrom pkg.sub import g\n",  # imports into circles, none back
}


def test_circle_scanner_finds_lazy_relative_and_submodule_imports(tmp_path):
    for rel, text in CIRCLES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(module_names((tmp_path / "pkg",), tmp_path))
    assert graph["pkg.a"] == {"pkg.b": f"{tmp_path / 'pkg/a.py'}:1"}
    assert set(graph["pkg.alone"]) == {"pkg", "pkg.sub.g"}
    assert strongly_connected(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"], ["pkg.h", "pkg.sub.g"]]
    circles = import_circles((tmp_path / "pkg",), tmp_path)
    assert circles[0].startswith("pkg.a <-> pkg.b <-> pkg.c: pkg.a -> pkg.b (")
    assert f"pkg.c -> pkg.a ({tmp_path / 'pkg/c.py'}:4)" in circles[0]
    assert f"pkg.h -> pkg.sub.g ({tmp_path / 'pkg/h.py'}:3)" in circles[2]


def test_long_file_scanner_names_each_file_over_the_limit(tmp_path):
    (tmp_path / "ok.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_files((tmp_path,)) == [f"{tmp_path / 'long.py'}: {MAX_LINES + 1} lines"]


# ------------------------------------------------------- 7. serving and the stage graph know no pipeline
#: the parts that must know no pipeline
KNOWS_NO_PIPELINE = ("core.serving", "core.pipeline.graph")
#: modules of ``core.models`` that are no model family: the architectures' registration, vLLM-Omni's loader (no
#: family's code: it loads vLLM-Omni's package without its patches) and the writer helpers every family shares
MODELS_NOT_A_FAMILY = {"core.models", "core.models.vllm_omni", "core.models.writing"}


def pipeline_knowledge(roots: tuple[pathlib.Path, ...], base: pathlib.Path = ROOT,
                       pipelines: tuple[str, ...] = ()) -> list[str]:
    """Places in the modules of :data:`KNOWS_NO_PIPELINE` (under ``roots``) that import a declaration or a model
    family, or hold one of ``pipelines`` (the declared names) as a string of code (rule 7)."""
    modules = module_names(roots, base)
    graph = import_graph(modules)
    found = []
    for module in sorted(m for m in graph if any(m == p or m.startswith(p + ".") for p in KNOWS_NO_PIPELINE)):
        for target, at in sorted(graph[module].items()):
            if target.startswith("core.pipeline.declarations."):
                found.append(f"{at}: imports the declaration {target}; read it from the graph's spec instead")
            elif target.startswith("core.models.") and target not in MODELS_NOT_A_FAMILY:
                found.append(f"{at}: imports the model family {target}; its declaration speaks for it")
        tree = parse(modules[module])
        docs = documentation_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in pipelines and id(node) not in docs:
                found.append(f"{where(modules[module], node)}: names the pipeline {node.value!r}; a switch on a "
                             "pipeline belongs in its declaration")
    return found


def test_serving_and_the_stage_graph_know_no_pipeline():
    from core.pipeline.declarations import PIPELINES

    problems = pipeline_knowledge((CORE,), pipelines=tuple(PIPELINES))
    assert not problems, "serving and the stage graph run any declared pipeline:" + _fmt(problems)


KNOWING = {
    "core/__init__.py": "",
    "core/models/__init__.py": "",
    "core/models/vllm_omni.py": "",
    "core/models/fam/__init__.py": "",
    "core/pipeline/__init__.py": "",
    "core/pipeline/declarations/__init__.py": "",
    "core/pipeline/declarations/fam.py": "",
    "core/pipeline/graph/__init__.py": "",
    "core/serving/__init__.py": "",
    "core/serving/app.py": ("from core.pipeline.declarations import resolve  # the registry: fine\n"
                            "from core.models.vllm_omni import x  # no family: fine\n"
                            "def f(spec):\n    from core.pipeline.declarations.fam import A\n"
                            "    return spec.name == 'fam'\n"),
    "core/pipeline/graph/flow.py": ('"""fam in a docstring is fine"""\nimport core.models.fam\n'
                                    "from core.pipeline.declarations import fam\n"),
    "core/pipeline/run.py": "from core.pipeline.declarations.fam import A  # outside serving and the graph\n",
}


def test_pipeline_knowledge_scanner_names_each_import_and_switch(tmp_path):
    for rel, text in KNOWING.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = pipeline_knowledge((tmp_path / "core",), tmp_path, pipelines=("fam",))
    where_ = sorted(f.split(": ")[0].replace(str(tmp_path) + "/", "") for f in found)
    assert where_ == ["core/pipeline/graph/flow.py:2", "core/pipeline/graph/flow.py:3", "core/serving/app.py:4",
                      "core/serving/app.py:5"], found
