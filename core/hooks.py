"""The omni hooks, written once (RFC-005's protocol).

:class:`OmniHooks` holds every piece of omni logic: payload lifecycle,
model preprocess, prompt-embeds overlay on prefill positions, model kwargs
extra, multimodal-output extraction, talker MTP, and the omni runner output.
It sees the batch only through :class:`BatchView` and the device only through
the :class:`~omni_backends.backend.Backend`, so the same code serves vLLM's
V1 runner (``core.runner``) and the V2 ``ModelState`` (``core.model_state``).

Model contract (all optional; read once at ``bind_model``):

- ``omni_preprocess(payload: dict) -> dict``: per request, once, on arrival;
  the returned keys are merged into the payload (e.g. ``prompt_embeds``
  ``[prompt_len, hidden]`` computed from a thinker's hidden states).
- ``device_resident_payload_keys: tuple[str, ...]``: payload keys kept on the
  device; everything else is stored on the CPU.
- ``accepts_omni_kwargs = True``: the forward receives
  ``runtime_additional_information`` (list of payload dicts, batch order) and
  ``request_token_spans`` (list of ``(start, end)`` token offsets).
- forward returning :class:`~core.outputs.OmniOutput`.
- ``talker_mtp(hidden [n, H], code0 [n] int64) -> [n, K-1] int64`` with
  ``talker_mtp_output_key`` (default ``"residual_codes"``) and
  ``talker_mtp_graph_safe``: run once per sampled token.
- ``omni_postprocess_request(hidden [t, H], payload) -> dict``: per request
  per step, on the rows it had this step; returns multimodal outputs
  (e.g. code2wav's waveform samples for those rows).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Iterable

import numpy as np
import torch

from core.kinds import AR, GENERATION, KINDS
from core.outputs import OmniModelRunnerOutput, OmniOutput
from core.payloads import EXTRA_ARGS_KEY, PayloadStore, unpack
from omni_backends.backend import Backend

log = logging.getLogger(__name__)



@dataclasses.dataclass
class BatchView:
    """The scheduled batch, in the runner's row order.

    - ``req_ids``: ``num_reqs`` request ids.
    - ``query_start_loc``: int ``[num_reqs + 1]`` token offsets of each
      request's scheduled tokens in the flattened batch.
    - ``num_computed``: int ``[num_reqs]`` tokens already in the KV cache
      before this step (so a request's tokens this step are positions
      ``num_computed .. num_computed + n``).
    - ``num_prompt``: int ``[num_reqs]`` prompt lengths.
    """

    req_ids: list[str]
    query_start_loc: np.ndarray
    num_computed: np.ndarray
    num_prompt: np.ndarray

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @functools.cached_property
    def _spans(self) -> list[tuple[int, int]]:
        qsl = np.asarray(self.query_start_loc)[: self.num_reqs + 1].tolist()
        return list(zip(qsl[:-1], qsl[1:]))

    def span(self, i: int) -> tuple[int, int]:
        """(start, end) offsets of request i's scheduled tokens in the flattened batch."""
        return self._spans[i]

    def prefill_rows(self, i: int) -> tuple[int, int, int]:
        """(batch_start, prompt_offset, count) of request i's prompt tokens this step."""
        start, end = self.span(i)
        first = int(self.num_computed[i])
        count = max(0, min(end - start, int(self.num_prompt[i]) - first))
        return start, first, count

    def samples(self, i: int) -> bool:
        """True if request i's last scheduled token is past its prompt (a token is sampled)."""
        start, end = self.span(i)
        return int(self.num_computed[i]) + (end - start) >= int(self.num_prompt[i])

    def completes_prefill(self, i: int) -> bool:
        start, end = self.span(i)
        return int(self.num_computed[i]) < int(self.num_prompt[i]) <= int(self.num_computed[i]) + (end - start)


class OmniHooks:
    """RFC-005 hook protocol; one instance per runner."""

    def __init__(self, backend: Backend, kind: str = AR):
        if kind not in KINDS:
            raise ValueError(f"runner kind must be one of {KINDS}, got {kind!r}")
        self.backend = backend
        self.kind = kind
        self.model: Any = None
        self.payloads = PayloadStore((), self._to_device)
        self._step_outputs: dict[str, dict[str, torch.Tensor]] = {}
        #: req_id -> number of token positions whose outputs were already emitted
        #: (a request recomputed after preemption must not emit them twice)
        self._emitted: dict[str, int] = {}
        self._mtp: Any = None
        self.mtp_calls: dict[str, int] = {}
        self.mtp_mode = "none"
        self._read_contract(None)

    def _read_contract(self, model: Any) -> None:
        # read once: a missing attribute on an nn.Module costs a __getattr__ miss + AttributeError per step
        self._model_preprocess = getattr(model, "omni_preprocess", None)
        self._model_postprocess = getattr(model, "omni_postprocess_request", None)
        self._accepts_kwargs = bool(getattr(model, "accepts_omni_kwargs", False))
        self._mtp_key = getattr(model, "talker_mtp_output_key", "residual_codes")

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.backend.device())

    # ------------------------------------------------------------- binding
    def bind_model(self, model: Any, vllm_config: Any = None, mtp_runner: Any = None) -> None:
        """Read the model's omni contract; wrap the talker MTP head for graphs
        through the Backend when ``capabilities().talker_mtp_graph`` allows.
        ``mtp_runner(head) -> callable`` (optional) wraps the head once more,
        after ``mtp_mode`` is set (V2: persistent buffers, ``core.model_state``)."""
        self.model = model
        self._read_contract(model)
        if vllm_config is not None and self._accepts_kwargs:
            no_full_graphs(vllm_config, f"{type(model).__name__} takes per-request omni kwargs")
        if vllm_config is not None:
            from core.model_io import copy_graph_inputs

            copy_graph_inputs(vllm_config, model)  # its compiled decoder reads embeddings it builds itself
        self.payloads.device_resident_keys = frozenset(getattr(model, "device_resident_payload_keys", ()))
        mtp = getattr(model, "talker_mtp", None)
        if mtp is None:
            self._mtp, self.mtp_mode = None, "none"
            return
        caps = self.backend.capabilities()
        graphs_on = vllm_config is not None and _graphs_enabled(vllm_config)
        if caps.talker_mtp_graph and getattr(model, "talker_mtp_graph_safe", False) and graphs_on:
            from vllm.config import CUDAGraphMode

            self._mtp = self.backend.wrap_graph(mtp, vllm_config, CUDAGraphMode.FULL)
            self.mtp_mode = "graph"
        else:
            self._mtp = mtp
            self.mtp_mode = "eager"
            log.info("talker MTP runs eager: driver %s has talker_mtp_graph=%s, engine graphs %s", self.backend.name,
                     caps.talker_mtp_graph, "on" if graphs_on else "off (enforce_eager / cudagraph_mode NONE)")
        if mtp_runner is not None:
            self._mtp = mtp_runner(self._mtp)

    # ------------------------------------------------------ on_new_requests
    def on_new_requests(self, new_requests: Iterable[tuple[str, Any]]) -> None:
        """Store each new request's payload (from ``sampling_params.extra_args``)
        and run the model's ``omni_preprocess`` on it once. A request that
        carries no payload (vLLM's own warm-up requests) is stored with an
        empty one and not preprocessed."""
        pre = self._model_preprocess
        for req_id, sampling_params in new_requests:
            extra = getattr(sampling_params, "extra_args", None) or {}
            packed = extra.get(EXTRA_ARGS_KEY)
            # a request without an omni payload is vLLM's own (its warm-up sends real requests:
            # ``_warmup_0_`` with max_tokens=16, V2's ``_v2_mixed_warmup_*``): nothing to preprocess and no
            # generation-kind rule to apply. The front end refuses user requests the omni engine would fail on
            # (``OmniOutputProcessor.add_request``), so none arrives here without a payload.
            if packed is not None and self.kind == GENERATION and getattr(sampling_params, "max_tokens", 1) != 1:
                raise ValueError(
                    f"request {req_id}: a generation-kind runner produces its whole output in the prefill forward; "
                    f"submit it with SamplingParams(max_tokens=1), not max_tokens={sampling_params.max_tokens}"
                )
            payload = unpack(packed)
            if pre is not None and packed is not None:
                payload.update(pre(payload))
            self.payloads.put(req_id, payload)

    def on_finished_requests(self, req_ids: Iterable[str]) -> None:
        """Free the payloads (and MTP counters) of finished or aborted requests."""
        req_ids = list(req_ids)
        self.payloads.free(req_ids)
        for r in req_ids:
            self._step_outputs.pop(r, None)
            self._emitted.pop(r, None)
            self.mtp_calls.pop(r, None)

    # ------------------------------------------------ prepare_prefill_embeds
    def needs_embeds(self, batch: BatchView) -> bool:
        """True if a request with ``prompt_embeds`` has prompt rows in this batch."""
        if not len(self.payloads) or not (batch.num_computed < batch.num_prompt).any():  # e.g. decode-only steps
            return False
        return any(
            "prompt_embeds" in self.payloads.get(r) and batch.prefill_rows(i)[2] > 0
            for i, r in enumerate(batch.req_ids)
        )

    def prepare_prefill_embeds(self, batch: BatchView, inputs_embeds: torch.Tensor) -> None:
        """Overlay each request's ``prompt_embeds`` ``[prompt_len, H]`` onto the
        rows of ``inputs_embeds`` ``[num_tokens, H]`` that hold its *prompt*
        positions this step (chunked prefill aware); decode rows are untouched."""
        for i, req_id in enumerate(batch.req_ids):
            emb = self.payloads.get(req_id).get("prompt_embeds")
            if emb is None:
                continue
            start, first, count = batch.prefill_rows(i)
            if count <= 0:
                continue
            if emb.shape[0] < first + count:
                raise ValueError(
                    f"request {req_id}: prompt_embeds has {emb.shape[0]} rows but the prompt has "
                    f"{int(batch.num_prompt[i])} tokens; pass one embedding row per prompt token"
                )
            inputs_embeds[start : start + count].copy_(emb[first : first + count].to(inputs_embeds.dtype), non_blocking=True)

    # ---------------------------------------------------- build_extra_kwargs
    def build_extra_kwargs(self, batch: BatchView) -> dict[str, Any]:
        """Model kwargs extra for models with ``accepts_omni_kwargs``."""
        if not self._accepts_kwargs:
            return {}
        return {
            "runtime_additional_information": [self.payloads.get(r) for r in batch.req_ids],
            "request_token_spans": [batch.span(i) for i in range(batch.num_reqs)],
        }

    # --------------------------------------------------- process_model_output
    def process_model_output(self, output: Any, batch: BatchView) -> Any:
        """Unwrap an :class:`OmniOutput` and collect this step's multimodal outputs.

        Per-token outputs (first dim = num_tokens) are sliced per request; the
        model's ``omni_postprocess_request(hidden [t, H], payload) -> dict`` runs
        for every request in the batch. Only positions not emitted before are
        used, so a request recomputed after preemption never emits a position twice. Outputs are copied to the CPU through
        ``Backend.to_host``. Returns the text hidden states ``[num_tokens, H]``
        that vLLM's logits and sampler path expects.
        """
        hidden = output.text_hidden_states if isinstance(output, OmniOutput) else output
        mm = output.multimodal_outputs if isinstance(output, OmniOutput) else None
        post = self._model_postprocess
        if not mm and post is None:
            return hidden
        # rows of each request not emitted before (after a preemption, vLLM recomputes
        # positions whose outputs the caller already has)
        rows = []
        for i, req_id in enumerate(batch.req_ids):
            start, end = batch.span(i)
            first = int(batch.num_computed[i])
            done = self._emitted.get(req_id, 0)
            skip = min(max(0, done - first), end - start)
            self._emitted[req_id] = max(done, first + end - start)
            rows.append((req_id, start + skip, end))
        if mm:
            num_tokens = int(batch.query_start_loc[batch.num_reqs])
            for key, value in mm.items():
                host = _owned(self.backend.to_host(value[:num_tokens]), value)
                for req_id, start, end in rows:
                    if end > start:
                        self._add(req_id, key, host[start:end])
        if post is not None:
            for req_id, start, end in rows:
                if end > start:
                    for key, value in post(hidden[start:end], self.payloads.get(req_id)).items():
                        self._add(req_id, key, self.backend.to_host(value))
        return hidden

    def _add(self, req_id: str, key: str, value: torch.Tensor) -> None:
        step = self._step_outputs.setdefault(req_id, {})
        step[key] = torch.cat([step[key], value]) if key in step else value

    # --------------------------------------------------------- talker MTP
    def run_talker_mtp(self, hidden_states: torch.Tensor, sampled: torch.Tensor, batch: BatchView) -> None:
        """Once per sampled token: residual codebooks from the MTP head.

        ``hidden_states`` ``[num_tokens, H]`` of this step; ``sampled`` int
        ``[num_reqs, 1]`` codebook-0 tokens. Rows used: each request's last
        scheduled token. Stores ``[1, K-1]`` per request under
        ``model.talker_mtp_output_key``."""
        if self._mtp is None:
            return
        sample_ids = [i for i in range(batch.num_reqs) if batch.samples(i)]
        if not sample_ids:
            return
        idx = torch.tensor([batch.span(i)[1] - 1 for i in sample_ids], device=hidden_states.device)
        code0 = sampled[sample_ids, 0].to(torch.int64)
        residual = self._mtp(hidden_states.index_select(0, idx), code0)
        host = self.backend.to_host(residual)
        key = self._mtp_key
        for j, i in enumerate(sample_ids):
            req_id = batch.req_ids[i]
            self._add(req_id, key, host[j : j + 1])
            self.mtp_calls[req_id] = self.mtp_calls.get(req_id, 0) + 1

    # ------------------------------------------------ get_model_runner_output
    def take_step_outputs(self) -> dict[str, dict[str, torch.Tensor]]:
        """This step's multimodal outputs (req_id -> name -> CPU tensor), handed over once."""
        step, self._step_outputs = self._step_outputs, {}
        return step

    def get_model_runner_output(self, base: Any, step: dict[str, dict[str, torch.Tensor]] | None = None) -> Any:
        """Wrap vLLM's ``ModelRunnerOutput`` into an :class:`OmniModelRunnerOutput`
        carrying this step's multimodal outputs for the requests in it
        (``step``: outputs taken earlier with :meth:`take_step_outputs`)."""
        if step is None:
            step = self.take_step_outputs()
        if not step or not hasattr(base, "req_ids"):
            return base
        fields = {name: getattr(base, name) for name in _field_names(type(base))}
        mm = {r: v for r, v in step.items() if r in base.req_id_to_index}
        return OmniModelRunnerOutput(**fields, multimodal_outputs=mm)


def _owned(host: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``host``, cloned if it still shares memory with ``source`` (a CPU
    device's ``to_host`` returns its input; the model's outputs live in
    persistent buffers the next forward overwrites, ``core.model_io``)."""
    if host.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
        return host.clone()
    return host


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _graphs_enabled(vllm_config: Any) -> bool:
    """False when the engine runs without graphs (``enforce_eager`` or ``cudagraph_mode`` NONE): the talker MTP
    then runs eager too, so ``--enforce-eager`` compares a wholly eager run."""
    model_config = getattr(vllm_config, "model_config", None)
    if getattr(model_config, "enforce_eager", False):
        return False
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    return mode is None or getattr(mode, "name", str(mode)) != "NONE"


#: FULL CUDA-graph modes and what is left of each without its FULL part (vLLM's ``CUDAGraphMode`` names)
_WITHOUT_FULL = {"FULL_AND_PIECEWISE": "PIECEWISE", "FULL": "NONE", "FULL_DECODE_ONLY": "NONE"}


def no_full_graphs(vllm_config: Any, why: str) -> str | None:
    """Lower ``vllm_config.compilation_config.cudagraph_mode`` to its non-FULL part
    (``FULL_AND_PIECEWISE`` -> ``PIECEWISE``; ``FULL`` / ``FULL_DECODE_ONLY`` -> ``NONE``).

    A model that takes per-request Python objects as forward kwargs
    (``accepts_omni_kwargs``: payloads, token spans) cannot run in a FULL graph:
    the capture freezes the dummy batch's kwargs and every replay reuses them.
    PIECEWISE graphs leave the model's own code eager and keep working. Called
    from ``bind_model`` (V1 ``load_model``, the V2 model state's ``__init__``),
    before vLLM resolves its graph mode and captures (``initialize_kv_cache``,
    ``capture_model``): the same on every vLLM version of the window (vLLM
    0.27+'s ``ModelState.get_additional_cg_support`` would do this on V2 only,
    and 0.26 has no such hook). Returns the new mode's name, or None if unchanged.
    """
    cc = getattr(vllm_config, "compilation_config", None)
    mode = getattr(cc, "cudagraph_mode", None)
    name = getattr(mode, "name", None)
    if name not in _WITHOUT_FULL:
        return None
    lowered = _WITHOUT_FULL[name]
    cc.cudagraph_mode = type(mode)[lowered]
    log.warning("cudagraph_mode %s -> %s: %s (a FULL graph would freeze them at capture)", name, lowered, why)
    return lowered

