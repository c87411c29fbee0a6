"""Vendor call signatures, recorded from the vendor sources, as recording stand-ins.

Each ``def`` below copies one vendor signature -- parameter names, order,
kinds and defaults, nothing else -- from the source named in
:data:`STANDINS`. Its body is ours: :class:`Recorder` binds every call to the
signature (so an argument the vendor does not take raises ``TypeError``, as it
would on the real stack) and records the bound arguments.

``tests/test_drift_vendor_sources.py`` re-reads each signature from the real
vendor source (wheel or tree) when one is available and fails if they differ.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from typing import Any, Callable


class Src:
    """A default that is a name in the vendor source (``CUDAGraphMode.NONE``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


# --------------------------------------------------- vllm-ascend 0.23.0.post1
def set_ascend_forward_context(
    attn_metadata,
    vllm_config,
    num_tokens: int = 0,
    num_tokens_across_dp=None,
    in_profile_run: bool = False,
    num_actual_tokens=None,
    aclgraph_runtime_mode=Src("CUDAGraphMode.NONE"),
    batch_descriptor=None,
    model_instance=None,
    is_draft_model=False,
    skip_compiled: bool = False,
    max_tokens_across_pcp: int = 0,
    draft_attn_metadatas=None,
    has_sinks=False,
    input_ids=None,
    eplb_heat_collection_status: bool = False,
): ...


def ACLGraphWrapper(runnable, vllm_config, runtime_mode, cudagraph_options=None, *, use_eagle=False, enable_enpu=False): ...


def AscendSampler(logprobs_mode=Src("DEFAULT_LOGPROBS_MODE")): ...


def ascend_graph_capture(device): ...


# ------------------------------------------------------------- vLLM 0.33.0
def set_forward_context(
    attn_metadata,
    vllm_config,
    num_tokens=None,
    num_tokens_across_dp=None,
    cudagraph_runtime_mode=Src("CUDAGraphMode.NONE"),
    batch_descriptor=None,
    ubatch_slices=None,
    slot_mapping=None,
    skip_compiled: bool = False,
    is_padding=None,
): ...


def CUDAGraphWrapper(runnable, vllm_config, runtime_mode, cudagraph_options=None): ...


def Sampler(logprobs_mode="raw_logprobs", use_fp64_gumbel: bool = False): ...


#: (module, attr, kind) -> (stand-in, the source it was recorded from)
STANDINS: dict[tuple[str, str, str], tuple[Callable[..., Any], str]] = {
    ("vllm_ascend.ascend_forward_context", "set_ascend_forward_context", "callable"): (
        set_ascend_forward_context, "vllm-ascend 0.23.0.post1 vllm_ascend/ascend_forward_context.py"),
    ("vllm_ascend.compilation.acl_graph", "ACLGraphWrapper", "class"): (
        ACLGraphWrapper, "vllm-ascend 0.23.0.post1 vllm_ascend/compilation/acl_graph.py"),
    ("vllm_ascend.sample.sampler", "AscendSampler", "class"): (
        AscendSampler, "vllm-ascend 0.23.0.post1 vllm_ascend/sample/sampler.py"),
    ("vllm_ascend.worker.model_runner_v1", "graph_capture", "callable"): (
        ascend_graph_capture, "vllm-ascend 0.23.0.post1 vllm_ascend/worker/model_runner_v1.py"),
    ("vllm.forward_context", "set_forward_context", "callable"): (
        set_forward_context, "vLLM 0.33.0 vllm/forward_context.py"),
    ("vllm.compilation.cuda_graph", "CUDAGraphWrapper", "class"): (
        CUDAGraphWrapper, "vLLM 0.33.0 vllm/compilation/cuda_graph.py"),
    ("vllm.v1.sample.sampler", "Sampler", "class"): (Sampler, "vLLM 0.33.0 vllm/v1/sample/sampler.py"),
}


class Recorder:
    """Callable with ``signature_of``'s exact signature that records each call.

    ``calls`` holds the bound arguments (defaults applied) of every call;
    ``returns(bound_arguments)`` makes the return value (default: a null
    context manager, as the forward-context functions return one).
    """

    def __init__(self, signature_of: Callable[..., Any], returns: Callable[[dict], Any] | None = None) -> None:
        self.__signature__ = inspect.signature(signature_of)
        self.__name__ = signature_of.__name__
        self.calls: list[dict[str, Any]] = []
        self._returns = returns or (lambda _args: contextlib.nullcontext())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.__signature__.bind(*args, **kwargs)  # TypeError on an argument the vendor does not take
        bound.apply_defaults()
        self.calls.append(dict(bound.arguments))
        return self._returns(dict(bound.arguments))


def install_module(monkeypatch: Any, module: str, **attrs: Any) -> types.ModuleType:
    """Put a stand-in module ``module`` with ``attrs`` into ``sys.modules`` for one
    test (``VendorSymbol.resolve`` imports it from there)."""
    mod = types.ModuleType(module)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, module, mod)
    return mod
