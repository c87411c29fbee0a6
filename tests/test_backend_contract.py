"""The Backend contract itself: every method has a caller in the core or the
driver selection, its two parts are what docs/vendor-guide.md counts, backend.py
reads required -> defaults, the kit's extra device operations are the protocol
``omni_backends.testing.kit_ops.KitOps`` (every driver implements it, the kit
exercises and checks it), every driver keeps the one ``forward_context``
signature, and the shared bases are real Backends.

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
from omni_backends.testing.kit import check_kit_ops
from omni_backends.testing.kit_ops import KIT_OPS, KitOps, missing_kit_ops
from omni_backends.torch_device import TorchAcceleratorBackend
from omni_backends.vllm_upstream import VllmUpstreamBackend

ROOT = pathlib.Path(__file__).resolve().parents[1]
KIT = ROOT / "omni_backends" / "testing"


# ------------------------------------------------------------------ the parts, read from the class
def _function(cls: type, name: str):
    attr = inspect.getattr_static(cls, name)
    return getattr(attr, "__func__", attr)


def public_methods(cls: type = Backend) -> list[str]:
    """Public callables ``cls`` defines (class attributes that are data excluded)."""
    return [n for n, v in vars(cls).items()
            if not n.startswith("_") and callable(getattr(v, "__func__", v)) and not isinstance(v, type)]


def contract_parts(cls: type = Backend) -> dict[str, list[str]]:
    """``required`` (abstract) and ``defaults`` of the Backend, in definition order, and the
    kit's ``kit`` operations (:data:`KIT_OPS`)."""
    methods = public_methods(cls)
    required = [n for n in methods if n in cls.__abstractmethods__]
    defaults = [n for n in methods if n not in required]
    return {"required": required, "defaults": defaults, "kit": list(KIT_OPS)}


def test_backend_reads_required_then_defaults():
    parts = contract_parts()
    order = public_methods()
    assert order == parts["required"] + parts["defaults"], (
        "omni_backends/backend.py must define the abstract methods first, then the defaults; "
        f"got {order}")
    assert parts["required"] and parts["defaults"]


def test_kit_operations_are_not_backend_methods():
    """The kit's device operations live in the KitOps protocol, not on the core's contract."""
    assert not set(KIT_OPS) & set(dir(Backend)), sorted(set(KIT_OPS) & set(dir(Backend)))
    assert len(KIT_OPS) == 16


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
def attribute_uses(roots: list[pathlib.Path], names: set[str], skip: pathlib.Path | None = None) -> dict[str, list[str]]:
    """``name -> ["path:line", ...]`` of every attribute read or call ``x.name`` under ``roots``
    (``*.py``, none under ``skip``), ignoring uses inside a function of the same name (a driver's
    ``copy_to_device`` delegating to a base's ``copy_to_device`` is not a caller)."""
    uses: dict[str, list[str]] = {n: [] for n in names}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if skip is not None and skip in path.parents:
                continue
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


def callers_outside_the_kit(names: set[str]) -> dict[str, list[str]]:
    """``name -> ["path:line", ...]`` of uses in ``core/`` and in ``omni_backends/`` outside its kit
    (the driver selection, placement, probing and the drivers' own shared code)."""
    return attribute_uses([ROOT / "core", ROOT / "omni_backends"], names, skip=KIT)


def test_every_backend_method_has_a_caller_in_the_core_or_the_selection():
    names = set(public_methods())
    missing = sorted(n for n, where in callers_outside_the_kit(names).items() if not where)
    assert missing == [], (f"Backend method(s) {missing} have no caller in core/ or in omni_backends/ outside its kit "
                           "(the kit and tests do not count): delete them, move them to the kit's KitOps, or call "
                           "them from the core or the selection")


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


def test_every_kit_operation_is_exercised_by_the_kit_suite():
    uses = attribute_uses([KIT / "suite"], set(KIT_OPS))
    assert [n for n, where in uses.items() if not where] == []


def test_the_kit_checks_the_protocol():
    """``check_interface`` (the kit's first test) fails a complete Backend that lacks a KitOps operation,
    naming the contract and the operation."""
    from omni_backends.cpu.driver import CpuBackend
    from omni_backends.testing.kit import ContractViolation, check_interface

    lacking = type("NoBuffers", (CpuBackend,), {"make_buffer": None})
    assert missing_kit_ops(lacking) == ["make_buffer"]
    with pytest.raises(ContractViolation, match=r"conformance contract 'kit-ops' broken: .*make_buffer"):
        check_interface(lacking)
    check_interface(CpuBackend)


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


@pytest.mark.parametrize("cls", [c for c in _drivers() if c is not VllmUpstreamBackend], ids=lambda c: c.__name__)
def test_every_driver_implements_the_kit_protocol(cls):
    assert missing_kit_ops(cls) == []
    check_kit_ops(cls)
    assert cls.new_event is not Backend.new_event, f"{cls.__qualname__} declares no new_event of its own"


@pytest.mark.parametrize("cls", _drivers(), ids=lambda c: c.__name__)
def test_every_driver_keeps_the_spec_forward_context_signature(cls):
    """One home for the keywords: every driver takes ``**kwargs: Unpack[ForwardContextArgs]``."""
    assert _shape(cls.forward_context) == _shape(Backend.forward_context), (
        f"{cls.__qualname__}.forward_context{inspect.signature(cls.forward_context)} differs from the spec "
        f"Backend.forward_context{inspect.signature(Backend.forward_context)}")
    assert inspect.get_annotations(cls.forward_context)["kwargs"] == "Unpack[ForwardContextArgs]"


def test_the_spec_takes_every_argument_of_vllm_set_forward_context():
    from omni_backends.backend import FORWARD_CONTEXT_EXTRAS, FORWARD_CONTEXT_KEYWORDS
    from omni_backends.vllm_upstream import SET_FORWARD_CONTEXT

    spec = ["attn_metadata", "vllm_config", *(k for k in FORWARD_CONTEXT_KEYWORDS if k not in FORWARD_CONTEXT_EXTRAS)]
    assert set(SET_FORWARD_CONTEXT.params) == set(spec)


def test_a_keyword_the_spec_lacks_fails_at_the_call():
    from omni_backends.cpu.driver import CpuBackend

    with pytest.raises(TypeError, match="cudagraph_mode"):
        CpuBackend().forward_context(None, None, cudagraph_mode=None)


def test_the_core_call_shape_binds_to_the_spec():
    """``core`` calls ``forward_context(None, cfg, num_tokens=, cudagraph_runtime_mode=, batch_descriptor=)``."""
    calls = []
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "forward_context":
                calls.append(node)
    assert calls, "the core no longer calls Backend.forward_context"
    from omni_backends.backend import FORWARD_CONTEXT_KEYWORDS

    for call in calls:
        assert len(call.args) == 2 and {k.arg for k in call.keywords} <= FORWARD_CONTEXT_KEYWORDS, ast.unparse(call)


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


def test_a_driver_that_writes_only_the_required_part_runs_the_core_contract():
    """The kit's operations are not the core's: a class with the required methods instantiates, is no
    KitOps, and declares no events, so the core synchronizes instead of calling ``new_event``."""
    from omni_backends.backend import Capabilities
    from omni_backends.errors import OmniBackendError

    namespace = {n: (classmethod(lambda cls: None) if n == "probe" else (lambda self, *a, **k: None))
                 for n in contract_parts()["required"]}
    namespace.update(name="bare", device_type="cpu", dist_backend="gloo", visible_devices_env=None, priority=0,
                     vllm_device_type="cpu")
    bare = type("Bare", (Backend,), namespace)()
    assert not isinstance(bare, KitOps)
    assert missing_kit_ops(type(bare)) == list(KIT_OPS)
    assert Capabilities().events is False
    with pytest.raises(OmniBackendError, match=r"driver 'bare' has no device events"):
        bare.new_event()
