"""Patch: writes into the engine's ``vllm_config.compilation_config``, after vLLM built it.

- What: :func:`lower_cudagraph_mode` sets ``compilation_config.cudagraph_mode`` to a mode without FULL graphs
  (``FULL_AND_PIECEWISE`` -> ``PIECEWISE``, ``FULL`` / ``FULL_DECODE_ONLY`` -> ``NONE``);
  :func:`enable_copy_inputs` sets ``compilation_config.cudagraph_copy_inputs = True`` and replaces
  ``vllm.compilation.backends.make_copy_and_call`` (the module attribute ``VllmBackend.__call__`` calls when it
  compiles) with :func:`copy_leading_dim_inputs` over vLLM's own. Both from ``OmniHooks.bind_model`` when the model
  is loaded, before vLLM compiles the model and captures graphs.
- Why: a model that takes per-request keyword arguments cannot run in a FULL graph (the capture freezes the
  dummy batch's kwargs), and a model whose forward builds the embeddings its compiled decoder reads needs vLLM
  to copy them into the graph's static inputs; both depend on the model class, which is known only once the
  model is loaded, after the engine's config is final. vLLM's copy slices every input with a symbolic size along
  dim 0 (``runtime_tensor.shape[0]``); M-RoPE positions (``[3, num_tokens]``, symbolic in dim 1) then fail at the
  first graph capture ("The size of tensor a (2048) must match the size of tensor b (128)", vLLM-Omni's Qwen3-TTS
  talker on the H200, 2026-12-05). The runner already passes those positions from its persistent buffer (a fixed
  address per size), so an input is copied only where its layout is the buffer's (trailing dims and strides) and
  goes through as given otherwise. Strides count: vLLM's buffer is a contiguous clone of the compile-time example,
  while the runner's positions are a ``[3, n]`` view of ``[3, max_num_tokens + 1]`` (row stride
  ``max_num_tokens + 1``), and the compiled graph reads them with the stride it was given at compile time (a graph
  input beside the tensor). At the profile run, ``n == max_num_tokens``: the trailing dims match, and a copy into
  the clone (row stride ``max_num_tokens``) made the graph read rows 1 and 2 shifted and the last two positions
  past the buffer's end -- garbage that indexed the talker's M-RoPE cos/sin cache out of range on some starts
  (CUDA device-side assert ``index out of bounds ... < 131072``, 4 x max_position_embeddings, V1 and V2, the H100
  2026-12-06, issue 44 item 4: vLLM 0.26 on torch < 2.12 turns inductor's ``size_asserts`` off, which would
  otherwise have failed every such start with ``expected ... stride``).
- Versions: vLLM 0.26 through 0.33 (``CompilationConfig`` fields; ``cudagraph_copy_inputs`` read when
  ``VllmBackend`` compiles, at the first forward).
- Until: a model-class hook vLLM asks for its graph modes and input copying before it freezes the config, and a
  vLLM copy that slices each input along its own symbolic dim.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from omni_backends.binding import Patch, VendorSymbol

CUDAGRAPH_MODE_FIELD = VendorSymbol("vllm.config.compilation", "CompilationConfig.cudagraph_mode", kind="attribute")
#: vLLM copies a compiled graph's inputs into its static buffers (``core.model_io.copy_graph_inputs``)
COPY_INPUTS = VendorSymbol("vllm.config.compilation", "CompilationConfig.cudagraph_copy_inputs", kind="attribute")
#: read when the model is compiled (after ``load_model``), so a write at load time takes effect
COPY_INPUTS_READ = VendorSymbol("vllm.compilation.backends", "VllmBackend.__call__",
                                mentions=("cudagraph_copy_inputs",))

#: vLLM's copy wrapper (slices dim 0), looked up as a module attribute where ``VllmBackend`` compiles
MAKE_COPY_AND_CALL = VendorSymbol("vllm.compilation.backends", "make_copy_and_call",
                                  params=("sym_tensor_indices", "input_buffers", "callable_fn"),
                                  mentions=("runtime_tensor.shape[0]",))
MAKE_COPY_AND_CALL_CALL = VendorSymbol("vllm.compilation.backends", "VllmBackend.__call__",
                                       mentions=("make_copy_and_call(",))

PATCH = Patch.declare(__name__, __doc__, (CUDAGRAPH_MODE_FIELD, COPY_INPUTS, COPY_INPUTS_READ, MAKE_COPY_AND_CALL,
                                          MAKE_COPY_AND_CALL_CALL))


def lower_cudagraph_mode(compilation_config: Any, mode: Any) -> None:
    """Set ``compilation_config.cudagraph_mode`` to ``mode`` (a ``CUDAGraphMode``)."""
    compilation_config.cudagraph_mode = mode


def enable_copy_inputs(compilation_config: Any) -> None:
    """Set ``compilation_config.cudagraph_copy_inputs`` to True and install :func:`copy_leading_dim_inputs` over
    vLLM's ``make_copy_and_call`` (once per process). Imports vLLM."""
    setattr(compilation_config, COPY_INPUTS.attr_name, True)
    import importlib

    backends = importlib.import_module(MAKE_COPY_AND_CALL.module)
    original = MAKE_COPY_AND_CALL.resolve()
    if getattr(original, "__wrapped__", None) is None:
        setattr(backends, MAKE_COPY_AND_CALL.attr_name, copy_leading_dim_inputs(original))


def copy_leading_dim_inputs(make_copy_and_call: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``make_copy_and_call(sym_tensor_indices, input_buffers, callable_fn)`` restricted, per call, to the
    inputs it can copy without changing their layout: those whose dims after the first and whose strides equal
    their buffer's (``inputs_embeds`` ``[num_tokens, hidden]``, ``input_ids``). Any other input (M-RoPE positions
    ``[3, num_tokens]``, a view of the runner's ``[3, max_num_tokens + 1]`` buffer, at every size including
    ``max_num_tokens``) reaches ``callable_fn`` as given, with the strides the graph was compiled for. vLLM's own
    wrapper does every copy; one is built per set of copied inputs. Returns the factory, with ``__wrapped__`` =
    ``make_copy_and_call``."""

    @functools.wraps(make_copy_and_call)
    def factory(sym_tensor_indices: list[int], input_buffers: list[Any], callable_fn: Callable[..., Any]) -> Any:
        wrappers: dict[tuple[int, ...], Callable[..., Any]] = {}

        def copy_and_call(*args: Any) -> Any:
            copied = tuple(k for k, (i, buf) in enumerate(zip(sym_tensor_indices, input_buffers))
                           if buf is None or _same_layout(args[i], buf))
            wrapper = wrappers.get(copied)
            if wrapper is None:
                wrapper = wrappers[copied] = make_copy_and_call(
                    [sym_tensor_indices[k] for k in copied], [input_buffers[k] for k in copied], callable_fn)
            return wrapper(*args)

        return copy_and_call

    return factory


def _same_layout(arg: Any, buf: Any) -> bool:
    """Whether a copy of ``arg`` into ``buf[:arg.shape[0]]`` keeps its layout: the same dims after the first and the
    same strides wherever a dim has more than one element (a slice of ``buf`` along dim 0 has ``buf``'s strides)."""
    return tuple(arg.shape[1:]) == tuple(buf.shape[1:]) and all(
        size < 2 or a == b for size, a, b in zip(arg.shape, arg.stride(), buf.stride()))
