"""Patch: writes into the engine's ``vllm_config.compilation_config``, after vLLM built it.

- What: :func:`lower_cudagraph_mode` sets ``compilation_config.cudagraph_mode`` to a mode without FULL graphs
  (``FULL_AND_PIECEWISE`` -> ``PIECEWISE``, ``FULL`` / ``FULL_DECODE_ONLY`` -> ``NONE``);
  :func:`enable_copy_inputs` sets ``compilation_config.cudagraph_copy_inputs = True``. Both from
  ``OmniHooks.bind_model`` when the model is loaded, before vLLM compiles the model and captures graphs.
- Why: a model that takes per-request keyword arguments cannot run in a FULL graph (the capture freezes the
  dummy batch's kwargs), and a model whose forward builds the embeddings its compiled decoder reads needs vLLM
  to copy them into the graph's static inputs; both depend on the model class, which is known only once the
  model is loaded, after the engine's config is final.
- Versions: vLLM 0.26 through 0.33 (``CompilationConfig`` fields; ``cudagraph_copy_inputs`` read when
  ``VllmBackend`` compiles, at the first forward).
- Until: a model-class hook vLLM asks for its graph modes and input copying before it freezes the config.
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol

CUDAGRAPH_MODE_FIELD = VendorSymbol("vllm.config.compilation", "CompilationConfig.cudagraph_mode", kind="attribute")
#: vLLM copies a compiled graph's inputs into its static buffers (``core.model_io.copy_graph_inputs``)
COPY_INPUTS = VendorSymbol("vllm.config.compilation", "CompilationConfig.cudagraph_copy_inputs", kind="attribute")
#: read when the model is compiled (after ``load_model``), so a write at load time takes effect
COPY_INPUTS_READ = VendorSymbol("vllm.compilation.backends", "VllmBackend.__call__",
                                mentions=("cudagraph_copy_inputs",))

PATCH = Patch.declare(__name__, __doc__, (CUDAGRAPH_MODE_FIELD, COPY_INPUTS, COPY_INPUTS_READ))


def lower_cudagraph_mode(compilation_config: Any, mode: Any) -> None:
    """Set ``compilation_config.cudagraph_mode`` to ``mode`` (a ``CUDAGraphMode``)."""
    compilation_config.cudagraph_mode = mode


def enable_copy_inputs(compilation_config: Any) -> None:
    """Set ``compilation_config.cudagraph_copy_inputs`` to True."""
    setattr(compilation_config, COPY_INPUTS.attr_name, True)
