"""Where the core meets vLLM's calls of the model and vLLM's view of the runner's output.

Two facts about vLLM's runners (V1 ``GPUModelRunner`` and the CPU / XPU /
Ascend runners built on it; the V2 runner) that the core must not assume away:

1. **The model is called from many places**, not only ``_model_forward``:
   ``_dummy_run`` (reached from ``profile_run``, warm-up and CUDA-graph capture)
   calls ``self.model(...)`` directly, ``CUDAGraphWrapper`` captures the call and
   later *replays* it without running any Python, and torch.compile'd
   (PIECEWISE) models run their outer ``forward`` eagerly around captured
   pieces. Each of those expects a tensor back (``CUDAGraphWrapper`` even
   weak-refs it). :class:`ModelOutputAdapter` therefore sits **at the model**
   (the model instance's ``forward``, wrapped once by the runner's
   ``load_model`` on V1 and by the model state on V2; no module hook, so
   ``nn.Module.__call__`` keeps its hook-free fast path on every step): every
   call returns the text hidden states ``[num_tokens, H]``; the multimodal
   outputs are kept aside, token-aligned tensors in persistent buffers, so
   that a FULL-graph replay (no Python) refreshes them exactly as an eager
   step does.
2. **Async outputs are recognised by class**: vLLM's executors and engine
   core unwrap an output only if it is an instance of
   ``vllm.v1.outputs.AsyncModelRunnerOutput`` (``isinstance``), whose abstract
   methods differ by version (0.26: ``get_output``; 0.33 adds
   ``get_kv_connector_output``). :func:`omni_runner_output` wraps an async
   output into a real subclass built from the installed base class, delegating
   every abstract method it declares, and takes this step's multimodal outputs
   at once (an async output is read after the next step has started).

The vLLM symbols used here are declared in :mod:`core.seams`; the changes of vLLM objects
(the model's instance ``forward``, the compilation config) are the patches
:mod:`core.patches.model_forward` and :mod:`core.patches.compilation_config`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch

from core.outputs import OmniModelRunnerOutput, OmniOutput
from core.patches.compilation_config import COPY_INPUTS, enable_copy_inputs
from core.patches.model_forward import ABSENT, install_forward, restore_forward
from core.seams import ASYNC_MODEL_RUNNER_OUTPUT

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ model outputs
def split_output(output: Any) -> tuple[Any, dict[str, Any]]:
    """``(text_hidden_states, multimodal_outputs)`` of whatever the model returned.

    Recognises :class:`core.outputs.OmniOutput` and anything with the two
    attributes ``text_hidden_states`` / ``multimodal_outputs`` (vLLM-Omni's
    ``OmniOutput`` NamedTuple included); a bare tensor is its own hidden
    states. ``multimodal_outputs`` may be ``None`` (then ``{}``); the model's
    own dict is returned, not a copy. Nested ``{category: {qualifier: value}}``
    dicts are kept as they are.
    """
    if type(output) is OmniOutput:  # the core's own, every step of an omni model: read without attribute probes
        return output[0], output[1] or {}
    if isinstance(output, torch.Tensor):
        return output, {}
    if hasattr(output, "text_hidden_states") and hasattr(output, "multimodal_outputs"):
        return output.text_hidden_states, output.multimodal_outputs or {}
    raise TypeError(
        f"the omni model returned {type(output).__name__}; return a tensor [num_tokens, hidden] or an OmniOutput "
        "(text_hidden_states, multimodal_outputs)"
    )


class ModelOutputAdapter:
    """The model instance's ``forward``, wrapped once: vLLM always gets a tensor back.

    - ``model``: the ``nn.Module`` vLLM calls (the runner's ``get_model()``,
      i.e. below any ``CUDAGraphWrapper``, which calls it through
      ``nn.Module.__call__`` at capture and on eager / PIECEWISE steps).
    - ``max_num_tokens``: rows of the persistent buffers (the scheduler's
      ``max_num_batched_tokens``, the most any call can carry).
    - ``hidden_size`` / ``dtype``: of the placeholder returned for models
      whose output has ``text_hidden_states=None`` (generation kinds such as
      code2wav): zeros ``[num_tokens, hidden_size]`` on the device of the
      call's inputs (``inputs_embeds`` / ``input_ids`` / ``positions``), which
      vLLM's logits path then indexes with device indices.

    How: ``model.forward`` becomes an instance attribute (``functools.wraps``
    of the bound forward: the same signature for ``inspect``) that calls the
    model's own forward and then the adapter. No forward hook is registered,
    so ``nn.Module.__call__`` stays on its fast path (a registered hook sends
    every call through ``_call_impl``'s hook loop); every way of calling the
    model -- ``model(...)``, ``model.forward(...)``, a ``CUDAGraphWrapper``
    around it, a torch.compile'd ``__call__`` -- reaches the wrapper.
    ``type(model).forward(model, ...)`` is the model's own forward.
    :meth:`remove` restores the instance; a second adapter on the same model
    replaces the first (one per model).

    Every call: text hidden states ``[num_tokens, H]`` are returned; each
    multimodal output that is a tensor with first dim ``num_tokens`` is copied
    into a persistent buffer ``[max_num_tokens, ...]`` (allocated on the first
    call with that shape — vLLM's ``profile_run``, before any capture — so a
    captured graph writes the same memory on every replay); other values
    (per-request lists, nested dicts) are kept as this call's Python objects.

    ``persistent=False`` (an engine without graphs: nothing replays a capture)
    keeps each call's own tensors instead of copying them into the buffers.

    ``exact_tokens=True`` (``OmniHooks.exact_tokens``: a generation-kind model, or one declaring vLLM-Omni's
    ``requires_exact_input_shape``): a real step's call gets its token tensors cut to the scheduled tokens
    (:func:`exact_token_kwargs`), its hidden states padded back with zero rows to the call's length.

    The runner brackets a real step with :meth:`begin_step` and, after the
    forward, reads :meth:`take`. Raises ``RuntimeError`` from :meth:`take` when
    a step replayed a graph (no Python ran) but the model's outputs include
    values only Python can produce.

    One call signature per engine: the first call fixes which of ``input_ids``
    and ``inputs_embeds`` are tensors (vLLM's first call is its profile run);
    a later call that differs raises :class:`ModelCallSignatureError` (vLLM
    compiles the model on its first call and drops Dynamo's guards, so a call
    with other inputs would run the first call's graph: wrong outputs, or a
    device fault when the graph comes from vLLM's AOT compile cache).
    """

    def __init__(self, model: Any, max_num_tokens: int, hidden_size: int | None = None, dtype: Any = None,
                 *, keep_hidden: bool = False, persistent: bool = True, exact_tokens: bool = False) -> None:
        self.max_num_tokens = int(max_num_tokens)
        #: a real step's token tensors cut to its scheduled tokens (:func:`scheduled_tokens`) before the model
        self.exact_tokens = exact_tokens
        self.keep_hidden = keep_hidden
        self.persistent = persistent
        self._hidden: torch.Tensor | None = None
        self.hidden_size, self.dtype = hidden_size, dtype
        self._buffers: dict[str, torch.Tensor] = {}
        self._placeholder: torch.Tensor | None = None
        self._tensor_keys: tuple[str, ...] = ()
        self._objects: dict[str, Any] = {}
        self._object_keys: tuple[str, ...] = ()
        #: the last call's multimodal outputs as the model returned them (``_ABSENT``: copied into the buffers)
        self._mm: Any = _ABSENT
        self._called = False
        self.calls = 0
        self._signature: tuple[bool, bool] | None = None
        self._model = model
        self._embeds_for_ids: Callable[[torch.Tensor], torch.Tensor] | None = None
        #: vLLM-Omni's ``get_dummy_runtime_additional_information(num_reqs)``: the per-request state a model
        #: that keeps request state needs in a call without any (vLLM's dummy runs), else ``None``
        dummy = getattr(model, DUMMY_REQUEST_STATE_HOOK, None)
        self._dummy_request_state: Callable[[int], Any] | None = dummy if callable(dummy) else None
        previous = getattr(model.__dict__.get("forward"), ADAPTER_ATTR, None)
        if previous is not None:  # one adapter per model
            previous.remove()
        #: what ``model.__dict__["forward"]`` held before (``ABSENT``: nothing, the class's forward)
        self._saved = model.__dict__.get("forward", ABSENT)
        self._forward = self._wrap(model)
        install_forward(model, self._forward)  # the patch core.patches.model_forward

    def _wrap(self, model: Any) -> Callable[..., Any]:
        """The instance ``forward``: the model's own (an instance ``forward`` set before, else its class's,
        looked up at every call, as ``nn.Module.__call__`` does), then :meth:`_on_output`."""
        on_output = self._on_output
        saved = self._saved if self._saved is not ABSENT else None

        @functools.wraps(model.forward)  # the same name, doc and signature (``inspect`` follows __wrapped__)
        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            if self._embeds_for_ids is not None:
                kwargs = self._with_embeds(args, kwargs)
            if self._dummy_request_state is not None and not any(k in kwargs for k in REQUEST_STATE_KWARGS):
                kwargs = self._with_dummy_request_state(kwargs)
            given = exact_token_kwargs(kwargs) if self.exact_tokens and not args else kwargs
            own = type(model).forward(model, *args, **given) if saved is None else saved(*args, **given)
            return on_output(args, kwargs, own)

        setattr(forward, ADAPTER_ATTR, self)
        return forward

    def remove(self) -> None:
        """Give the model its own ``forward`` back (it then returns its own outputs again)."""
        restore_forward(self._model, self._forward, self._saved)
        self._embeds_for_ids = None

    def feed_embeddings(self, embeds_for_ids: Any) -> None:
        """Make every call of the model carry ``inputs_embeds``: a call that
        passes ``input_ids`` and ``inputs_embeds=None`` (vLLM's ``_dummy_run``:
        profile, warm-up, graph capture) gets ``embeds_for_ids(input_ids)``
        (``[num_tokens, H]``, the runner's persistent ``inputs_embeds`` buffer,
        which a captured graph then reads at every replay) instead;
        ``input_ids`` stays.

        For a model whose real steps always take embeddings (vLLM-Omni's
        ``preprocess`` models such as the Qwen3-TTS talker): vLLM compiles the
        decoder on its first call and drops Dynamo's guards, so a decoder
        traced on the ``input_ids`` path of a dummy run ignores the
        ``inputs_embeds`` of every real step (wrong codes under compilation,
        right ones eager; ``docs/core-runner.md``). Only keyword calls are
        changed (vLLM calls the model with keywords). Done in the wrapped
        ``forward`` (no pre-hook)."""
        self._embeds_for_ids = embeds_for_ids

    def _with_dummy_request_state(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A call that carries no per-request state (vLLM's ``_dummy_run``: profile, warm-up, graph capture; a
        real step always passes it, ``OmniHooks.build_extra_kwargs``) gets the model's own dummy state for its
        one request (``runtime_additional_information=model.get_dummy_runtime_additional_information(1)``, as
        vLLM-Omni's ``GPUGenerationModelRunner._dummy_run`` passes it): a model that keeps per-request state (Qwen3-TTS code2wav under ``async_chunk``) then
        knows the call is a dummy one, where it would otherwise refuse a request without an id."""
        return dict(kwargs, runtime_additional_information=self._dummy_request_state(1))  # type: ignore[misc]

    def _with_embeds(self, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        ids = kwargs.get("input_ids")
        if kwargs.get("inputs_embeds") is None and isinstance(ids, torch.Tensor) and len(args) < 4:
            return dict(kwargs, inputs_embeds=self._embeds_for_ids(ids))  # type: ignore[misc]
        return kwargs

    # ---------------------------------------------------------------- every call
    def _on_output(self, args: Any, kwargs: dict[str, Any], output: Any) -> torch.Tensor:
        self.calls += 1
        signature = call_signature(args, kwargs)
        if signature != self._signature:
            if self._signature is not None:
                raise ModelCallSignatureError(type(self._model).__name__, self._signature, signature)
            self._signature = signature
        hidden, mm = split_output(output)
        if hidden is None:
            hidden = self._zeros(*_num_tokens(args, kwargs))
        elif self.exact_tokens and hidden.shape[0] < (n := _num_tokens(args, kwargs)[0]):  # the padded rows back
            hidden = torch.cat([hidden, hidden.new_zeros((n - hidden.shape[0], *hidden.shape[1:]))])
        persistent = self.persistent
        if self.keep_hidden:
            self._hidden = _persistent(self._hidden, hidden, self.max_num_tokens) if persistent else hidden
        if not persistent or not mm:  # nothing replays this call: the outputs are read as they are
            self._mm, self._called = mm, True
            return hidden
        n = hidden.shape[0]
        buffers = self._buffers
        tensor_keys, objects = [], {}
        for key, value in mm.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
                buffers[key] = _persistent(buffers.get(key), value, self.max_num_tokens)
                tensor_keys.append(key)
            else:
                objects[key] = value
        self._tensor_keys, self._objects, self._called = tuple(tensor_keys), objects, True
        self._object_keys, self._mm = tuple(objects), _ABSENT
        return hidden

    def _zeros(self, n: int, device: torch.device) -> torch.Tensor:
        if self.hidden_size is None:
            raise TypeError("the omni model returned text_hidden_states=None but the runner gave no hidden_size")
        if self._placeholder is None or self._placeholder.shape[0] < n or self._placeholder.device != device:
            self._placeholder = torch.zeros(max(n, self.max_num_tokens), self.hidden_size, dtype=self.dtype,
                                            device=device)
        return self._placeholder[:n]

    # ---------------------------------------------------------------- the step
    def begin_step(self) -> None:
        """Before a real step's forward: forget the previous call's Python objects."""
        self._called, self._objects = False, {}

    def take(self, hidden: torch.Tensor | int) -> Any:
        """This step's output as an :class:`~core.outputs.OmniOutput`:
        ``hidden`` (what the forward returned, ``[num_tokens, H]``; or the
        number of tokens, read from the persistent copy made with
        ``keep_hidden=True``) and the multimodal outputs (token-aligned ones as
        views ``[:num_tokens]`` of the persistent buffers, valid until the next
        forward; with ``persistent=False`` the forward's own tensors)."""
        if isinstance(hidden, int):
            if self._hidden is None:
                raise RuntimeError("no forward of the model was seen (neither eager nor a captured graph)")
            hidden = self._hidden[:hidden]
        mm = self.outputs()
        if self._mm is _ABSENT:  # the persistent buffers: this step's rows
            n = hidden.shape[0]
            for k in self._tensor_keys:
                if (b := mm[k]).shape[0] != n:
                    mm[k] = b[:n]
        return OmniOutput(hidden, mm)

    def outputs(self) -> dict[str, Any]:
        """This step's multimodal outputs as the model returned them (``persistent=False``), or its
        token-aligned ones as the whole persistent buffers ``[max_num_tokens, ...]`` (a step's rows are the
        first ``num_tokens``; :meth:`~core.hooks.step_rows.StepRowsCollector.collect` reads only those) and the
        call's Python objects. Raises ``RuntimeError`` as :meth:`take` does."""
        if not self._called and self._object_keys:
            raise RuntimeError(
                "the model's forward was replayed from a captured graph, but its multimodal outputs include "
                "Python objects (per-request lists / dicts) a graph cannot produce; run this model without FULL "
                "graphs (set compilation_config cudagraph_mode=PIECEWISE or enforce_eager=True)"
            )
        mm = self._mm
        if mm is not _ABSENT:  # the forward's own outputs (no persistent copy made, or none to make)
            return mm
        buffers = self._buffers
        mm = {k: buffers[k] for k in self._tensor_keys}
        if self._objects:
            mm.update(self._objects)
        return mm


#: the attribute of an adapter's wrapped ``forward`` naming its :class:`ModelOutputAdapter`
ADAPTER_ATTR = "__omni_output_adapter__"
_ABSENT = object()


def adapter_of(model: Any) -> ModelOutputAdapter | None:
    """The :class:`ModelOutputAdapter` wrapping ``model``'s ``forward``, or ``None``."""
    return getattr(getattr(model, "__dict__", {}).get("forward"), ADAPTER_ATTR, None)



#: the model-call arguments whose presence (a tensor or ``None``) vLLM's compiled graph fixes on its first call
SIGNATURE_ARGS = ("input_ids", "inputs_embeds")
_POSITIONAL = ("input_ids", "positions", "intermediate_tensors", "inputs_embeds")


def call_signature(args: Any, kwargs: dict[str, Any]) -> tuple[bool, bool]:
    """``(input_ids is a tensor, inputs_embeds is a tensor)`` of one model call (keywords, or vLLM's positional
    order ``input_ids, positions, intermediate_tensors, inputs_embeds``)."""
    if args:
        kwargs = {**dict(zip(_POSITIONAL, args)), **kwargs}
    return (isinstance(kwargs.get("input_ids"), torch.Tensor), isinstance(kwargs.get("inputs_embeds"), torch.Tensor))


class ModelCallSignatureError(RuntimeError):
    """A model was called with other inputs than on its first call (:class:`ModelOutputAdapter`)."""

    def __init__(self, model: str, first: tuple[bool, bool], now: tuple[bool, bool]) -> None:
        def show(sig: tuple[bool, bool]) -> str:
            return ", ".join(f"{n}={'tensor' if t else 'None'}" for n, t in zip(SIGNATURE_ARGS, sig))

        super().__init__(
            f"{model} was called with {show(now)} after a first call with {show(first)}: vLLM compiles the model on "
            "its first call and drops Dynamo's guards, so this call would run the first call's graph (wrong outputs, "
            "or a device fault with a graph from vLLM's AOT compile cache). Every call of one engine must pass the "
            "same inputs: the runner's real steps, dummy runs and graph captures (core/runner/) decide them "
            "together; a model that needs embeddings on some steps takes them on every step (a preprocess hook)")


#: vLLM-Omni's per-request forward kwargs (Python objects: a FULL graph would freeze the capture batch's)
PER_REQUEST_KWARGS = ("model_intermediate_buffer", "runtime_additional_information", "request_token_spans",
                      "seq_token_counts", "request_ids")
#: the per-request state kwargs (one of them in a call: a real step's, ``OmniHooks.build_extra_kwargs``)
REQUEST_STATE_KWARGS = ("model_intermediate_buffer", "runtime_additional_information")
#: vLLM-Omni's model hook giving the per-request state of a dummy run (``num_reqs`` -> a list of state dicts)
DUMMY_REQUEST_STATE_HOOK = "get_dummy_runtime_additional_information"


def scheduled_tokens(kwargs: dict[str, Any]) -> int | None:
    """The tokens a real step scheduled, from its per-request kwargs (``OmniHooks.build_extra_kwargs``): the sum of
    ``seq_token_counts``, else the end of the last ``request_token_spans``; ``None`` without them (vLLM's dummy
    runs)."""
    counts = kwargs.get("seq_token_counts")
    if counts is not None:
        return int(sum(counts))
    spans = kwargs.get("request_token_spans")
    return int(spans[-1][1]) if spans else None


def exact_token_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of a model call with ``input_ids`` / ``inputs_embeds`` ``[:n]`` and ``positions`` ``[..., :n]``
    for the ``n`` scheduled tokens (:func:`scheduled_tokens`): the rows vLLM pads a step with up to a CUDA-graph
    size cut off. For a model that splits the flat tokens by its per-request counts and gives the last (or only)
    request the rest (vLLM-Omni's ``Qwen3TTSCode2Wav._split_request_ids``: a padded single chunk of 7 frames
    decoded as 8, ``RuntimeError: shape '[7, -1]' is invalid``); vLLM-Omni trims ``input_ids`` the same way for
    models declaring ``requires_exact_input_shape`` (its ``maybe_unpad_input_ids``). Unchanged when the call
    carries no per-request counts or nothing is padded."""
    n = scheduled_tokens(kwargs)
    if n is None:
        return kwargs
    out = dict(kwargs)
    for key in ("input_ids", "inputs_embeds"):
        t = out.get(key)
        if isinstance(t, torch.Tensor) and t.shape[0] > n:
            out[key] = t[:n]
    pos = out.get("positions")
    if isinstance(pos, torch.Tensor) and pos.shape[-1] > n:
        out["positions"] = pos[..., :n]
    return out


def _num_tokens(args: Any, kwargs: dict[str, Any]) -> tuple[int, torch.device]:
    """Tokens of a model call and the device its inputs are on: ``inputs_embeds`` /
    ``input_ids`` rows, else ``positions``' last dim (``[num_tokens]`` or M-RoPE's
    ``[3, num_tokens]``)."""
    named = dict(zip(_POSITIONAL, args))
    named.update(kwargs)
    for key in ("inputs_embeds", "input_ids"):
        if isinstance(named.get(key), torch.Tensor):
            return int(named[key].shape[0]), named[key].device
    if isinstance(named.get("positions"), torch.Tensor):
        return int(named["positions"].shape[-1]), named["positions"].device
    raise TypeError("cannot tell the number of tokens of a model call with text_hidden_states=None")


def _persistent(buf: torch.Tensor | None, value: torch.Tensor, rows: int) -> torch.Tensor:
    """``value`` copied into ``buf[:n]``; ``buf`` ``[max(rows, n), ...]`` is
    (re)allocated only when absent or of another trailing shape / dtype /
    device (on vLLM's first, eager, call: ``profile_run``)."""
    n = int(value.shape[0])
    if (buf is None or buf.shape[1:] != value.shape[1:] or buf.dtype != value.dtype or buf.device != value.device
            or buf.shape[0] < n):
        buf = value.new_empty((max(rows, n), *value.shape[1:]))
    buf[:n].copy_(value)
    return buf


# ------------------------------------------------------------------ model inputs
def feeds_prompt_embeds(model: Any) -> bool:
    """True if the model's payloads may bring prompt embeddings (it has a
    preprocess hook: vLLM-Omni's ``has_preprocess``), so
    its forward takes ``inputs_embeds``; other models keep vLLM's
    ``input_ids`` path, and with it the same compiled graphs as stock vLLM."""
    return bool(getattr(model, "has_preprocess", False))


def prompt_embeds_without_embeds_path(model: Any) -> ValueError:
    """The error for requests bringing ``prompt_embeds`` to a model whose engine passes no ``inputs_embeds``
    (no preprocess hook, and vLLM builds none: not multimodal, no ``enable_prompt_embeds``): taking embeddings
    on their prefill steps only would change the model's call signature (:class:`ModelCallSignatureError`)."""
    return ValueError(
        f"a request brings prompt_embeds to {type(model).__name__}, whose engine calls it with input_ids only: "
        "give the model a preprocess hook (vLLM-Omni's has_preprocess; its forward then takes inputs_embeds on "
        "every step) or start its engine with enable_prompt_embeds=True")




def takes_per_request_kwargs(model: Any) -> bool:
    """True if the model's forward names one of vLLM-Omni's per-request kwargs
    (:data:`PER_REQUEST_KWARGS`, e.g. ``model_intermediate_buffer``), which a
    FULL graph would freeze at capture. A forward that only has ``**kwargs``
    (vLLM-Omni's talker) is taken not to read them."""
    import inspect

    forward = getattr(model, "forward", None)
    try:
        params = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):
        return False
    return any(name in params for name in PER_REQUEST_KWARGS)




def copy_graph_inputs(vllm_config: Any, model: Any) -> bool:
    """Make vLLM copy the compiled region's inputs into its own buffers for a
    model that :func:`feeds_prompt_embeds`.

    vLLM's PIECEWISE graphs replay reading their inputs at the addresses seen
    at capture; stock models pass vLLM's persistent ``input_ids`` /
    ``inputs_embeds`` buffers, but an omni model that builds the embeddings
    its compiled decoder reads (payload rows, a voice added) hands new tensors
    every step, which a replay would ignore. vLLM's own switch for that,
    ``compilation_config.cudagraph_copy_inputs`` (read when the model is
    compiled, i.e. at the first forward, after ``load_model``), copies them.
    Called from ``OmniHooks.bind_model`` (V1 ``load_model``, V2 model state).
    Returns True when it turned the switch on."""
    comp = getattr(vllm_config, "compilation_config", None)
    if comp is None or not feeds_prompt_embeds(model) or getattr(comp, COPY_INPUTS.attr_name, True):
        return False
    enable_copy_inputs(comp)  # the patch core.patches.compilation_config
    log.info("cudagraph_copy_inputs on for %s: its forward builds the embeddings its compiled decoder reads",
             type(model).__name__)
    return True


# ------------------------------------------------------------------ runner output
@functools.lru_cache(maxsize=None)
def omni_async_output_cls(base: type | None = None) -> type:
    """A subclass of ``base`` (default: the installed
    ``vllm.v1.outputs.AsyncModelRunnerOutput``) wrapping vLLM's own async
    output: ``OmniAsyncModelRunnerOutput(inner, convert)``; ``get_output()``
    returns ``convert(inner.get_output())``; every other abstract method of
    ``base`` (e.g. 0.33's ``get_kv_connector_output``) and every other
    attribute delegates to ``inner``."""
    if base is None:
        base = ASYNC_MODEL_RUNNER_OUTPUT.resolve()

    def __init__(self: Any, inner: Any, convert: Callable[[Any], Any]) -> None:
        self._inner, self._convert = inner, convert

    def get_output(self: Any) -> Any:
        return self._convert(self._inner.get_output())

    def __getattr__(self: Any, name: str) -> Any:
        if name in ("_inner", "_convert"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    ns: dict[str, Any] = {"__init__": __init__, "get_output": get_output, "__getattr__": __getattr__,
                          "__module__": __name__, "__doc__": omni_async_output_cls.__doc__}
    for name in getattr(base, "__abstractmethods__", ()):
        ns.setdefault(name, _delegate(name))
    return type("OmniAsyncModelRunnerOutput", (base,), ns)


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


def omni_runner_output(out: Any, hooks: Any) -> Any:
    """What the omni runner's ``sample_tokens`` returns for vLLM's ``out``.

    This step's multimodal outputs are taken from ``hooks`` now; a
    ``ModelRunnerOutput`` becomes an ``OmniModelRunnerOutput`` at once, an
    ``AsyncModelRunnerOutput`` an :func:`omni_async_output_cls` instance that
    converts on ``get_output()``; ``None`` stays ``None``."""
    if out is None:
        return None
    step = hooks.take_step_outputs()
    if type(out) is not _MODEL_RUNNER_OUTPUT:  # vLLM's plain output needs no class lookup
        base = ASYNC_MODEL_RUNNER_OUTPUT.resolve()
        if isinstance(out, base):
            return omni_async_output_cls(base)(out, functools.partial(hooks.get_model_runner_output, step=step))
    return hooks.get_model_runner_output(out, step)


_MODEL_RUNNER_OUTPUT = OmniModelRunnerOutput.__base__  # vLLM's ModelRunnerOutput
