"""The engine and serving tests run on pytest's ``--device`` (the ``test_device`` fixture), so a GPU run covers
them: none names the cpu device itself when it starts an engine, a stage graph or a server.

Read from the sources (AST), so a new test that hard-codes the device fails here, not silently on cpu in a GPU run.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent
#: files that may name cpu, and why
ALLOWED = {
    "core/test_pipeline_faults.py": "fake engine factories over the cpu driver (cpu_selected); no device work",
    "core/test_pipeline_options.py": "the cpu driver's own refusals of engine choices, before any engine starts",
    "core/tp_scenarios.py": "tensor parallelism of cpu ranks under Ray: a cpu-only scenario (test_tp.py)",
}


def _cpu_device_uses(tree: ast.AST) -> list[int]:
    """Lines that pass ``device="cpu"``, ``_need_vllm("cpu")`` or ``"--device", "cpu"`` in an argument list."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if any(k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "cpu"
                   for k in node.keywords):
                lines.append(node.lineno)
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "_need_vllm" and node.args and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value == "cpu":
                lines.append(node.lineno)
        if isinstance(node, (ast.List, ast.Tuple)):
            values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if any(a == "--device" and b == "cpu" for a, b in zip(values, values[1:])):
                lines.append(node.lineno)
    return lines


def test_engine_and_serving_tests_take_the_device_from_pytest():
    found = []
    for folder in ("core", "serving"):
        for path in sorted((ROOT / folder).glob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED:
                continue
            found += [f"tests/{rel}:{n}" for n in _cpu_device_uses(ast.parse(path.read_text(), str(path)))]
    assert not found, ("these name the cpu device instead of the test_device fixture (pytest's --device): "
                       + ", ".join(found))
