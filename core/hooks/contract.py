"""The model contract: vLLM-Omni's (RFC-005's hooks), read once per model.

:func:`read_contract` reads the attributes vLLM-Omni's runners read
(vllm-omni 0.30.0, ``vllm_omni/worker/gpu_model_runner.py``, ``gpu_ar_model_runner.py``,
``gpu_generation_model_runner.py``) and checks the signature of every hook the
model declares, so a wrong one fails when the model is bound, naming the hook,
instead of in the first step. Attributes the core does not read are ignored.

=================================  ==================================================
model attribute                    meaning (vLLM-Omni semantics)
=================================  ==================================================
``has_preprocess`` + ``preprocess(input_ids=, input_embeds=, **req_infos)
-> (ids, embeds, update)``         every step, every scheduled request, on its rows;
                                   ``embeds`` replace those rows of the forward's
                                   ``inputs_embeds``; ``update`` is merged into the
                                   request's state; on a decode row of a talker-MTP
                                   model ``update["mtp_inputs"] = (last_talker_hidden,
                                   text_step)``
``has_postprocess`` + ``postprocess(hidden_slice, multimodal_outputs=, **req_infos)
-> update``                        after the forward, per request, on its rows;
                                   merged into the request's state
``have_multimodal_outputs``        the forward may return an ``OmniOutput``
``make_omni_output(out, **kwargs)``  turns a bare forward result into an ``OmniOutput``
``gpu_resident_buffer_keys``       ``(category, qualifier)`` pairs kept on the device
``talker_mtp(input_ids, input_embeds, last_talker_hidden, text_step, ...)
-> (embeds [n, H], codes [n, Q])``  before the forward, on decode rows; ``embeds``
                                   become those rows' inputs; ``codes`` go to the
                                   request's state under ``talker_mtp_output_key``
``talker_mtp_output_key``          ``(category, qualifier)``, default ``("codes", "audio")``
``talker_mtp_validity_key``        ``(category, qualifier)`` set to ``True`` with the codes
``mtp_hidden_size``                width of the MTP's persistent input buffers
``talker_mtp_graph_safe``          the MTP may be captured in a FULL graph
``mtp_sample_uniforms`` + ``mtp_sample_steps`` / ``mtp_sample_vocab_size``: ``talker_mtp`` takes its
                                   sampling noise as ``sample_uniforms=`` ``[n, steps, vocab]``
                                   float32 (seeded rows stay on the graph: ``core.hooks.talker_mtp``)
``compute_logits(h, sampling_metadata=)``  called by vLLM; a generation model may return
                                   ``None`` (the core then samples from zero logits)
``on_requests_finished(ids)``      told which requests finished or were aborted
``get_dummy_runtime_additional_information(n)``  the per-request state of a dummy run's
                                   ``n`` requests (vLLM's profile / warm-up / capture runs)
``set_batch_req_ids(ids)``         told the batch's request order before ``compute_logits``
``requires_exact_input_shape``     its forward gets a real step's scheduled tokens only (no
                                   CUDA-graph padding rows: ``core.model_io.exact_token_kwargs``)
``postprocess_uses_hidden_states`` / ``_multimodal_outputs`` / ``_req_infos``: what
                                   ``postprocess`` receives (default all)
=================================  ==================================================
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

DEFAULT_MTP_OUTPUT_KEY = ("codes", "audio")


class ModelContractError(TypeError):
    """A model declares an omni hook with a signature the core cannot call."""


def _params(fn: Callable[..., Any]) -> tuple[list[inspect.Parameter], bool]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [], True  # a builtin or C callable: cannot check, accept
    params = list(sig.parameters.values())
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    return params, var_kw


def _check(model: Any, hook: str, *, positional: int = 0, keywords: tuple[str, ...] = (),
           var_keyword: bool = False) -> None:
    """Raise :class:`ModelContractError` naming ``hook`` unless ``model.<hook>``
    accepts ``positional`` positional arguments, the ``keywords`` and (with
    ``var_keyword``) arbitrary keyword arguments."""
    fn = getattr(model, hook)
    if not callable(fn):
        raise ModelContractError(f"{type(model).__name__}.{hook} must be callable, got {type(fn).__name__}")
    params, var_kw = _params(fn)
    if not params and var_kw:
        return
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    problems = []
    if len(pos) < positional and not var_pos:
        problems.append(f"takes {len(pos)} positional arguments, the core passes {positional}")
    required = [p.name for p in pos[positional:] if p.default is p.empty and p.name not in keywords]
    required += [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty
                 and p.name not in keywords]
    if required:
        problems.append(f"requires {required}, which the core does not pass")
    missing = [k for k in keywords if k not in names and not var_kw]
    if missing:
        problems.append(f"does not accept keyword(s) {missing}")
    if var_keyword and not var_kw:
        problems.append("must accept **kwargs (the request's state is passed as keywords)")
    if problems:
        raise ModelContractError(
            f"{type(model).__name__}.{hook}{inspect.signature(fn)} does not match vLLM-Omni's contract: "
            + "; ".join(problems)
        )


def _pair(model: Any, name: str, default: Any) -> Any:
    value = getattr(model, name, default)
    if value is None:
        return None
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise ModelContractError(f"{type(model).__name__}.{name} must be a (category, qualifier) pair of "
                                 f"strings, got {value!r}")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class ModelContract:
    """What a model declares, read once (an attribute miss on an ``nn.Module``
    costs a ``__getattr__`` call and an exception per step otherwise)."""

    preprocess: Callable[..., Any] | None = None
    postprocess: Callable[..., Any] | None = None
    postprocess_uses_hidden_states: bool = True
    postprocess_uses_multimodal_outputs: bool = True
    postprocess_uses_req_infos: bool = True
    make_omni_output: Callable[..., Any] | None = None
    have_multimodal_outputs: bool = False
    gpu_resident_buffer_keys: frozenset = frozenset()
    talker_mtp: Callable[..., Any] | None = None
    talker_mtp_output_key: tuple[str, str] = DEFAULT_MTP_OUTPUT_KEY
    talker_mtp_validity_key: tuple[str, str] | None = None
    talker_mtp_graph_safe: bool = False
    mtp_hidden_size: int | None = None
    #: ``(steps, vocab)`` of the noise ``talker_mtp`` takes as ``sample_uniforms=``; None: it draws its own
    mtp_sample_shape: tuple[int, int] | None = None
    on_requests_finished: Callable[..., Any] | None = None
    set_batch_req_ids: Callable[..., Any] | None = None
    dummy_request_state: Callable[..., Any] | None = None
    requires_exact_input_shape: bool = False
    forward_params: frozenset | None = None  # None: the forward takes **kwargs

    def forward_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` restricted to what the model's ``forward`` accepts."""
        if self.forward_params is None:
            return kwargs
        return {k: v for k, v in kwargs.items() if k in self.forward_params}


def read_contract(model: Any) -> ModelContract:
    """Read ``model``'s omni contract (see the module docstring).

    Raises :class:`ModelContractError` naming the hook when a declared hook has
    a signature the core cannot call, or a key attribute is not a
    ``(category, qualifier)`` pair. ``model=None`` gives the empty contract."""
    if model is None:
        return ModelContract()
    c: dict[str, Any] = {}
    if getattr(model, "has_preprocess", False):
        _check(model, "preprocess", keywords=("input_ids", "input_embeds"), var_keyword=True)
        c["preprocess"] = model.preprocess
    if getattr(model, "has_postprocess", False):
        _check(model, "postprocess", positional=1, keywords=("multimodal_outputs",), var_keyword=True)
        c["postprocess"] = model.postprocess
        for flag in ("postprocess_uses_hidden_states", "postprocess_uses_multimodal_outputs",
                     "postprocess_uses_req_infos"):
            c[flag] = bool(getattr(model, flag, True))
    if callable(getattr(model, "make_omni_output", None)):
        _check(model, "make_omni_output", positional=1, var_keyword=True)
        c["make_omni_output"] = model.make_omni_output
    c["have_multimodal_outputs"] = bool(getattr(model, "have_multimodal_outputs", False))
    c["requires_exact_input_shape"] = bool(getattr(model, "requires_exact_input_shape", False))
    keys = getattr(model, "gpu_resident_buffer_keys", ()) or ()
    for k in keys:
        if not (isinstance(k, tuple) and len(k) == 2):
            raise ModelContractError(f"{type(model).__name__}.gpu_resident_buffer_keys must hold (category, "
                                     f"qualifier) pairs, got {k!r}")
    c["gpu_resident_buffer_keys"] = frozenset(keys)
    if getattr(model, "talker_mtp", None) is not None:
        _check(model, "talker_mtp", positional=4)
        c["talker_mtp"] = model.talker_mtp
        c["talker_mtp_output_key"] = _pair(model, "talker_mtp_output_key", DEFAULT_MTP_OUTPUT_KEY)
        c["talker_mtp_validity_key"] = _pair(model, "talker_mtp_validity_key", None)
        c["talker_mtp_graph_safe"] = bool(getattr(model, "talker_mtp_graph_safe", False))
        size = getattr(model, "mtp_hidden_size", None)
        if size is not None and (not isinstance(size, int) or size <= 0):
            raise ModelContractError(f"{type(model).__name__}.mtp_hidden_size must be a positive int, got {size!r}")
        c["mtp_hidden_size"] = size
        steps = int(getattr(model, "mtp_sample_steps", 0) or 0)
        vocab = int(getattr(model, "mtp_sample_vocab_size", 0) or 0)
        if getattr(model, "mtp_sample_uniforms", False) and steps > 0 and vocab > 0:  # vLLM-Omni's own condition
            _check(model, "talker_mtp", positional=4, keywords=("sample_uniforms",))
            c["mtp_sample_shape"] = (steps, vocab)
    for hook, pos in (("on_requests_finished", 1), ("set_batch_req_ids", 1)):
        if callable(getattr(model, hook, None)):
            _check(model, hook, positional=pos)
            c[hook] = getattr(model, hook)
    from core.model_io import DUMMY_REQUEST_STATE_HOOK

    if callable(getattr(model, DUMMY_REQUEST_STATE_HOOK, None)):
        _check(model, DUMMY_REQUEST_STATE_HOOK, positional=1)
        c["dummy_request_state"] = getattr(model, DUMMY_REQUEST_STATE_HOOK)
    forward = getattr(model, "forward", None)
    if forward is not None:
        params, var_kw = _params(forward)
        if not var_kw:
            c["forward_params"] = frozenset(p.name for p in params)
    return ModelContract(**c)


def needs_omni_hooks(model: Any, kind: str) -> bool:
    """Whether the omni hooks have anything to do on ``model`` (V1 and V2 runners alike): a generation
    kind always (its multimodal outputs are the stage's product), an AR model when it declares any part of
    vLLM-Omni's contract, its payloads may bring prompt embeddings, its forward names vLLM-Omni's
    per-request kwargs, or its ``forward`` is not vLLM's own (it may return an ``OmniOutput``). False for
    a stock vLLM class: the runner then runs vLLM's steps untouched. Raises :class:`ModelContractError`
    for a hook with a wrong signature."""
    from core.kinds import GENERATION

    if kind == GENERATION:
        return True
    c = read_contract(model)
    if any((c.preprocess, c.postprocess, c.make_omni_output, c.talker_mtp, c.on_requests_finished,
            c.set_batch_req_ids, c.have_multimodal_outputs, c.gpu_resident_buffer_keys)):
        return True
    from core.model_io import feeds_prompt_embeds, takes_per_request_kwargs

    if feeds_prompt_embeds(model) or takes_per_request_kwargs(model):
        return True
    forward = getattr(type(model), "forward", None)
    return not str(getattr(forward, "__module__", "") or "").startswith("vllm.")
