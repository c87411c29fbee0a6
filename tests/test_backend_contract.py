"""The Backend contract itself (issue 23): every method has a caller outside the
tests, its three parts are what docs/vendor-guide.md counts, backend.py reads
required -> defaults -> kit operations, every driver keeps the one
``forward_context`` signature, and the shared bases are real Backends.

Pure source and class inspection: no device, no vLLM engine.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import textwrap

import pytest

from omni_backends.backend import Backend
from omni_backends.torch_device import TorchAcceleratorBackend
from omni_backends.vllm_upstream import VllmUpstreamBackend

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: where a caller counts: the core runner and this package (its kit included), never tests/
CALLER_ROOTS = ("core", "omni_backends")


# ------------------------------------------------------------------ the parts, read from the class
def _function(cls: type, name: str):
    attr = inspect.getattr_static(cls, name)
    return getattr(attr, "__func__", attr)


def public_methods(cls: type = Backend) -> list[str]:
    """Public callables ``cls`` defines (class attributes that are data excluded)."""
    return [n for n, v in vars(cls).items()
            if not n.startswith("_") and callable(getattr(v, "__func__", v)) and not isinstance(v, type)]


def contract_parts(cls: type = Backend) -> dict[str, list[str]]:
    """``required`` (abstract), ``defaults``, ``kit`` (marked ``kit_operation``), in definition order."""
    methods = public_methods(cls)
    required = [n for n in methods if n in cls.__abstractmethods__]
    kit = [n for n in methods if getattr(_function(cls, n), "__kit_operation__", False)]
    defaults = [n for n in methods if n not in required and n not in kit]
    return {"required": required, "defaults": defaults, "kit": kit}


def test_backend_reads_required_then_defaults_then_kit_operations():
    parts = contract_parts()
    order = public_methods()
    assert order == parts["required"] + parts["defaults"] + parts["kit"], (
        "omni_backends/backend.py must define the abstract methods first, then the defaults, then the kit operations; "
        f"got {order}")
    assert parts["required"] and parts["defaults"] and parts["kit"]


# ------------------------------------------------------------------ the counts in the vendor guide
def _guide_counts() -> dict[str, int]:
    text = (ROOT / "docs" / "vendor-guide.md").read_text()
    found = {}
    for key, pattern in (("required", r"\*\*(\d+) required methods\*\*"), ("defaults", r"\*\*(\d+) methods with defaults\*\*"),
                         ("kit", r"\*\*(\d+) kit operations\*\*"), ("identity", r"\*\*(\d+) identity attributes\*\*"),
                         ("on_shared_bases", r"\*\*(\d+) methods on the shared bases\*\*")):
        m = re.search(pattern, text)
        assert m, f"docs/vendor-guide.md no longer states the count {pattern!r}"
        found[key] = int(m.group(1))
    return found


def _identity_without_default() -> list[str]:
    return [n for n in Backend.__annotations__ if not n.startswith("_") and n not in vars(Backend)]


def test_vendor_guide_states_the_counts_the_class_has():
    parts = contract_parts()
    on_both = type("OnBoth", (TorchAcceleratorBackend, VllmUpstreamBackend), {})
    have = {k: len(v) for k, v in parts.items()} | {"identity": len(_identity_without_default()),
                                                    "on_shared_bases": len(on_both.__abstractmethods__)}
    assert _guide_counts() == have, f"docs/vendor-guide.md counts differ from Backend: {parts}"


def test_vendor_guide_names_every_method_in_its_part():
    """The guide's table lists each method under the part the class puts it in."""
    text = (ROOT / "docs" / "vendor-guide.md").read_text()
    for part, names in contract_parts().items():
        m = re.search(rf"<!-- contract:{part} -->(.*?)<!-- /contract:{part} -->", text, re.S)
        assert m, f"docs/vendor-guide.md has no <!-- contract:{part} --> block"
        listed = set(re.findall(r"`(\w+)", m.group(1)))
        assert set(names) <= listed, f"docs/vendor-guide.md {part} block misses {sorted(set(names) - listed)}"
        others = {n for p, ns in contract_parts().items() if p != part for n in ns}
        assert not (listed & others), f"docs/vendor-guide.md {part} block lists {sorted(listed & others)} of another part"


# ------------------------------------------------------------------ every method has a caller
def attribute_uses(roots: list[pathlib.Path], names: set[str]) -> dict[str, list[str]]:
    """``name -> ["path:line", ...]`` of every attribute read or call ``x.name`` under ``roots``
    (``*.py``), ignoring uses inside a function of the same name (a driver's
    ``copy_to_device`` delegating to a base's ``copy_to_device`` is not a caller)."""
    uses: dict[str, list[str]] = {n: [] for n in names}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))

            def visit(node: ast.AST, inside: str | None) -> None:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inside = node.name
                if isinstance(node, ast.Attribute) and node.attr in names and node.attr != inside:
                    uses[node.attr].append(f"{path.relative_to(root.parent)}:{node.lineno}")
                for child in ast.iter_child_nodes(node):
                    visit(child, inside)

            visit(tree, None)
    return uses


def uncalled(roots: list[pathlib.Path], names: set[str]) -> list[str]:
    return sorted(n for n, where in attribute_uses(roots, names).items() if not where)


def test_every_backend_method_has_a_caller_outside_tests():
    names = set(public_methods())
    missing = uncalled([ROOT / r for r in CALLER_ROOTS], names)
    assert missing == [], (f"Backend method(s) {missing} have no caller in {', '.join(CALLER_ROOTS)}/ (tests do not "
                           "count): delete them, or call them from the core, the selection or the kit")


def test_the_caller_scan_names_a_method_nobody_calls(tmp_path):
    """Negative control for the scan above: a caller inside a same-named method does not count."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "uses.py").write_text(textwrap.dedent("""
        def run(backend):
            backend.device()
            return backend.to_host

        class Driver:
            def clear_graphs(self):
                return Base.clear_graphs(self)
    """))
    assert uncalled([pkg], {"device", "to_host", "clear_graphs"}) == ["clear_graphs"]


def test_kit_operations_are_used_by_the_kit_and_the_required_ones_by_the_core_or_selection():
    """The parts mean what they say: a required method is called from core/ or from this
    package outside its kit; every kit operation is exercised by the kit's suite."""
    parts = contract_parts()
    core_and_selection = attribute_uses([ROOT / "core", ROOT / "omni_backends"], set(parts["required"]))
    for name, where in core_and_selection.items():
        assert [w for w in where if not w.startswith("omni_backends/testing/")], f"required {name} has only kit callers"
    kit = attribute_uses([ROOT / "omni_backends" / "testing"], set(parts["kit"]))
    assert [n for n, where in kit.items() if not where] == []


# ------------------------------------------------------------------ one forward_context signature
def _drivers() -> list[type]:
    from omni_backends.ascend.driver import AscendBackend
    from omni_backends.cpu.driver import CpuBackend
    from omni_backends.cuda.driver import CudaBackend
    from omni_backends.xpu.driver import XpuBackend

    out = [CpuBackend, CudaBackend, XpuBackend, AscendBackend, VllmUpstreamBackend]
    try:
        from omni_simdev.driver import SimDevBackend
    except ImportError:  # the example driver is not installed in this environment
        pass
    else:
        out.append(SimDevBackend)
    return out


def _shape(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", _drivers(), ids=lambda c: c.__name__)
def test_every_driver_keeps_the_spec_forward_context_signature(cls):
    assert _shape(cls.forward_context) == _shape(Backend.forward_context), (
        f"{cls.__qualname__}.forward_context{inspect.signature(cls.forward_context)} differs from the spec "
        f"Backend.forward_context{inspect.signature(Backend.forward_context)}")


def test_the_spec_takes_every_argument_of_vllm_set_forward_context():
    from omni_backends.vllm_upstream import SET_FORWARD_CONTEXT

    spec = set(inspect.signature(Backend.forward_context).parameters)
    assert set(SET_FORWARD_CONTEXT.params) <= spec


def test_the_core_call_shape_binds_to_the_spec():
    """``core`` calls ``forward_context(None, cfg, num_tokens=, cudagraph_runtime_mode=, batch_descriptor=)``."""
    calls = []
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "forward_context":
                calls.append(node)
    assert calls, "the core no longer calls Backend.forward_context"
    sig = inspect.signature(Backend.forward_context)
    for call in calls:
        sig.bind(None, *[None] * len(call.args), **{k.arg: None for k in call.keywords if k.arg})


# ------------------------------------------------------------------ the shared bases are Backends
@pytest.mark.parametrize("base", [TorchAcceleratorBackend, VllmUpstreamBackend])
def test_shared_bases_are_backend_subclasses(base):
    assert issubclass(base, Backend)
    assert inspect.isabstract(base)  # a driver still writes probe() and the rest


def test_no_type_ignore_left_for_the_shared_bases():
    for module in ("torch_device.py", "vllm_upstream.py", "ascend/driver.py", "cuda/driver.py", "xpu/driver.py",
                   "cpu/driver.py"):
        text = (ROOT / "omni_backends" / module).read_text()
        assert "type: ignore" not in text, module


def test_old_mixin_names_are_deprecated_aliases():
    import omni_backends.torch_device as torch_device
    import omni_backends.vllm_upstream as vllm_upstream

    with pytest.deprecated_call():
        assert torch_device.TorchAcceleratorOps is TorchAcceleratorBackend
    with pytest.deprecated_call():
        assert vllm_upstream.VllmUpstreamBindings is VllmUpstreamBackend


def test_a_driver_that_writes_only_the_required_part_runs_the_core_contract():
    """Kit operations are optional: a class with the required methods instantiates;
    a kit operation it lacks raises NotImplementedError naming itself."""
    namespace = {n: (classmethod(lambda cls: None) if n == "probe" else (lambda self, *a, **k: None))
                 for n in contract_parts()["required"]}
    namespace.update(name="bare", device_type="cpu", dist_backend="gloo", visible_devices_env=None, priority=0,
                     vllm_device_type="cpu")
    bare = type("Bare", (Backend,), namespace)()
    with pytest.raises(NotImplementedError, match=r"driver 'bare' does not implement Backend\.new_event, an optional "
                                                  r"kit operation"):
        bare.new_event()
    assert bare.is_device_tensor(__import__("torch").zeros(1))  # a kit operation with a generic default


def test_deprecated_capability_is_accepted_and_ignored():
    from omni_backends.backend import Capabilities

    with pytest.deprecated_call():
        caps = Capabilities(device_sync_after_replay_safe=False)
    assert "device_sync_after_replay_safe" not in caps.to_json()
    assert caps == Capabilities()
