"""The core's seam contract as the code was at commit 1543e5a (before issue 14's fix).

The differences from :data:`core.seams.CONTRACT`, read from ``core/runner.py`` and
``core/model_state.py`` at 1543e5a (besides: the V2 runner mixin had no ``capture_model``
and no fallback for state seams the runner never calls): the V1 mixin saw the model's output only inside ``_model_forward``
(``OmniV1RunnerMixin._model_forward`` unwrapped the ``OmniOutput``; the base
runner's other calls of the model got the ``OmniOutput``), and the V1 and V2
async wrapper ``_OmniAsyncOutput`` was a plain class with ``get_output``
(``sample_tokens`` tested ``hasattr(out, "get_output")``). Checked against vLLM
0.26.0 it names the two faults seen on the H200 (``tests/test_drift_vendor_sources.py``,
``docs/drift.md``):

    omni-backends check-drift --driver cuda --contract seam_contract_1543e5a:CONTRACT --source vllm-0.26.0-*.whl

(with ``tests/`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import dataclasses

from core.seams import CONTRACT as NOW
from omni_backends.binding import ModelCallCoverage, Seam

#: ``OmniV1RunnerMixin._model_forward`` converted the model output; no other call was seen.
MODEL_CALLS = ModelCallCoverage(in_methods=("_model_forward",), by="OmniV1RunnerMixin._model_forward",
                                ours="core/runner.py:OmniV1RunnerMixin._model_forward")
#: ``_OmniAsyncOutput``: a plain class; the executor was assumed to unwrap anything with ``get_output``.
ASYNC_OUTPUT = dataclasses.replace(NOW.v1.async_output, recognised_by="get_output", implements=("get_output",),
                                   ours="core/runner.py:OmniV1RunnerMixin.sample_tokens")

#: at 1543e5a the V2 runner mixin had no ``capture_model``; the omni state overrode
#: ``prepare_inputs_embeds`` under that name only (no 0.26 spelling) and also
#: ``capture_inner_cudagraphs`` / ``get_additional_cg_support`` (since removed: ``ours`` left empty).
RUNNER_SEAMS = tuple(s for s in NOW.v2.runner_seams if s.name != "capture_model")
STATE_SEAMS = tuple(dataclasses.replace(s, fallback="", alternatives=()) for s in NOW.v2.state_seams) + (
    Seam("capture_inner_cudagraphs", params=("input_buffers", "block_tables", "attn_groups", "kv_cache_config"),
         required=("input_buffers", "block_tables", "attn_groups", "kv_cache_config")),
    Seam("get_additional_cg_support", required=()),
)

CONTRACT = dataclasses.replace(
    NOW, name="core@1543e5a",
    v1=dataclasses.replace(NOW.v1, model_calls=MODEL_CALLS, async_output=ASYNC_OUTPUT),
    v2=dataclasses.replace(NOW.v2, async_output=ASYNC_OUTPUT, runner_seams=RUNNER_SEAMS, state_seams=STATE_SEAMS),
)
