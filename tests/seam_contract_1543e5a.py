"""The core's seam contract as the code was at commit 1543e5a (before issue 14's fix).

Two differences from :data:`core.seams.CONTRACT`, both read from ``core/runner.py``
at 1543e5a: the V1 mixin saw the model's output only inside ``_model_forward``
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
from omni_backends.binding import ModelCallCoverage

#: ``OmniV1RunnerMixin._model_forward`` converted the model output; no other call was seen.
MODEL_CALLS = ModelCallCoverage(in_methods=("_model_forward",), by="OmniV1RunnerMixin._model_forward",
                                ours="core/runner.py:OmniV1RunnerMixin._model_forward")
#: ``_OmniAsyncOutput``: a plain class; the executor was assumed to unwrap anything with ``get_output``.
ASYNC_OUTPUT = dataclasses.replace(NOW.v1.async_output, recognised_by="get_output", implements=("get_output",),
                                   ours="core/runner.py:OmniV1RunnerMixin.sample_tokens")

CONTRACT = dataclasses.replace(
    NOW, name="core@1543e5a",
    v1=dataclasses.replace(NOW.v1, model_calls=MODEL_CALLS, async_output=ASYNC_OUTPUT),
    v2=dataclasses.replace(NOW.v2, async_output=ASYNC_OUTPUT),
)
