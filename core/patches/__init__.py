"""Every in-place change the project makes to a live vLLM object (and to vLLM-Omni's, and to the process's
``sys.modules`` and ``copyreg`` for them), one module per patch.

The omni runner is built on vLLM's extension points (``worker_cls``, ``scheduler_cls``, subclasses of vLLM's
runners); where vLLM offers none, the core changes an object vLLM built, in place. Each such change lives in a
module here and nowhere else (``tests/test_patches.py`` refuses a ``__class__`` swap or an attribute of a vLLM
object assigned anywhere else), and each module says what it changes, why, for which vLLM versions, and what
upstream change would let it go, in its docstring and in its :class:`~omni_backends.binding.Patch` declaration
``PATCH``, whose ``checks`` are what ``omni-backends check-drift`` proves per vLLM version (the attributes the
patch reads or replaces, the call sites that make it take effect, the class layout a swap needs). The report,
``--json`` too, names every patch (``docs/drift.md``).

Importing this package imports neither torch nor vLLM (``check-drift`` reads :data:`PATCHES` through
``core.seams.CONTRACT``). The driver-side patch (the sampler's one-token rule, made by the drivers, which never import ``core``) lives in
:mod:`omni_backends.patches`; :data:`PATCHES` lists it too.

| module | what it changes |
|---|---|
| :mod:`~core.patches.worker_runner` | the worker's ``model_runner``: vLLM's runner replaced by the omni runner |
| :mod:`~core.patches.model_state_class` | the V2 runner's ``model_state``: class swapped to the omni-composed class |
| :mod:`~core.patches.v2_init_model_state` | the V2 runner module's ``init_model_state``: wrapped during ``load_model`` |
| :mod:`~core.patches.model_mrope_interface` | a model without ``SupportsMRoPE``: given the interface (text positions) |
| :mod:`~core.patches.runner_sampler` | the runner's ``sampler``: driver rules (V1) / ``OmniSampler`` (V2) |
| :mod:`~core.patches.model_forward` | the model instance's ``forward``: wrapped by the output adapter |
| :mod:`~core.patches.compute_logits` | a generation model's ``compute_logits``: ``None`` becomes zero logits |
| :mod:`~core.patches.compilation_config` | ``vllm_config.compilation_config``: graph mode lowered, input copies on |
| :mod:`~core.patches.model_config_fields` | ``vllm_config.model_config``: vLLM-Omni's per-stage fields set (``async_chunk``, ...) |
| :mod:`~core.patches.output_processor_class` | the front end's ``OutputProcessor``: class swapped |
| :mod:`~core.patches.request_state_class` | each request's ``RequestState``: class swapped |
| :mod:`~core.patches.request_output_collector_class` | each ``AsyncLLM`` request queue: class swapped |
| :mod:`~core.patches.request_output_field` | vLLM's ``RequestOutput``: ``multimodal_outputs`` attribute set |
| :mod:`~core.patches.engine_core_decoder` | the engine-core client's msgpack decoder: decodes the omni output type |
| :mod:`~core.patches.vllm_omni_bare_package` | ``sys.modules["vllm_omni"]``: a bare package, its ``__init__`` (patches) never run |
| :mod:`~core.patches.vllm_omni_platform` | vLLM-Omni's ``platforms._current_omni_platform``: the selected driver's platform |
| :mod:`~core.patches.vllm_omni_config_pickling` | ``copyreg``: vLLM-Omni's config classes pickle through the bare loader |
| :mod:`~core.patches.torchaudio_stub` | ``sys.modules["torchaudio"]``: a stand-in while vLLM-Omni imports, when missing |
| :mod:`omni_backends.patches` | vLLM's V1 ``Sampler.topk_topp_sampler``: wrapped for the one-token rule |
"""

from __future__ import annotations

from core.patches import (
    compilation_config,
    compute_logits,
    engine_core_decoder,
    model_config_fields,
    model_forward,
    model_mrope_interface,
    model_state_class,
    output_processor_class,
    request_output_collector_class,
    request_output_field,
    request_state_class,
    runner_sampler,
    torchaudio_stub,
    v2_init_model_state,
    vllm_omni_bare_package,
    vllm_omni_config_pickling,
    vllm_omni_platform,
    worker_runner,
)
from omni_backends import patches as driver_patches

PATCHES = (
    worker_runner.PATCH, model_state_class.PATCH, v2_init_model_state.PATCH, model_mrope_interface.PATCH,
    runner_sampler.PATCH, model_forward.PATCH, compute_logits.PATCH,
    compilation_config.PATCH, model_config_fields.PATCH, output_processor_class.PATCH, request_state_class.PATCH,
    request_output_collector_class.PATCH, request_output_field.PATCH, engine_core_decoder.PATCH,
    vllm_omni_bare_package.PATCH, vllm_omni_platform.PATCH, vllm_omni_config_pickling.PATCH, torchaudio_stub.PATCH,
    driver_patches.PATCH,
)
"""Every patch of a live vLLM object, core and driver side (``core.seams.CONTRACT.patches``)."""

__all__ = ["PATCHES"]
