"""The omni hooks, written once: RFC-005's protocol over vLLM-Omni's model contract.

:class:`OmniHooks` holds every piece of omni logic: per-request state
(vLLM-Omni's ``model_intermediate_buffer``), the model's ``preprocess`` every
step, the talker MTP before the forward, ``prompt_embeds`` on prompt rows, the
model kwargs extra, the model's output (``OmniOutput`` / ``make_omni_output``),
``postprocess`` merged into the state, multimodal outputs per request, and the
omni runner output. It sees the batch only through :class:`~core.hooks.batch.BatchView`
and the device only through the :class:`~omni_backends.backend.Backend`, so the
same code serves vLLM's V1 runner (``core.runner.v1``) and the V2 ``ModelState``
(``core.runner.model_state``). Graph policy is :mod:`core.hooks.graphs`. The model contract is :mod:`core.hooks.contract`.

RFC-005 protocol -> methods: ``on_new_requests`` (and ``on_finished_requests``),
``prepare_prefill_embeds`` (and :meth:`OmniHooks.preprocess`, which also runs the
talker MTP), ``build_extra_kwargs``, ``process_model_output``,
``get_model_runner_output``.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Callable, Iterable, NamedTuple

import torch

from core.hooks.batch import BatchView
from core.hooks.contract import ModelContract, read_contract
from core.hooks.graphs import graphs_enabled, no_full_graphs
from core.hooks.step_rows import StepRowsCollector
from core.hooks.talker_mtp import TalkerMTP, request_generator
from core.kinds import AR, GENERATION, KINDS
from core.outputs import OmniOutput, StepOutputs, as_omni_output
from core.patches.compute_logits import install_logits_fallback
from core.payloads import EXTRA_ARGS_KEY, MTP_SEED_KEY, PayloadStore, unpack
from core.seams import CUDAGRAPH_MODE
from omni_backends.backend import Backend

log = logging.getLogger(__name__)


#: finished requests whose talker-MTP call count is kept (oldest dropped first)
FINISHED_MTP_RECORD = 256


def state_key(info: Any, req_id: str) -> str:
    """The id a model keeps a request's state under: the ``meta.request_id`` its state names (vLLM-Omni's
    ``MetaStruct.request_id``: the utterance a code2wav chunk request belongs to, the same for all its chunks),
    else the request's own id."""
    meta = info.get("meta") if isinstance(info, dict) else None
    key = meta.get("request_id") if isinstance(meta, dict) else None
    if isinstance(key, (list, tuple)):
        key = key[0] if key else None
    return req_id if key is None else str(key)


class MtpRow(NamedTuple):
    """One decode row the talker MTP runs on this step (what ``preprocess`` returned for it): the request,
    the row's offset in the batch's flattened tokens, and the MTP's inputs -- the row's ``input_ids`` and
    ``inputs_embeds`` as ``preprocess`` returned them, ``last_hidden`` ``[1, H]`` (the talker's last hidden
    state) and ``text_step`` ``[1, H]`` (from ``update["mtp_inputs"]``)."""

    req_id: str
    start: int
    input_ids: torch.Tensor
    inputs_embeds: torch.Tensor
    last_hidden: Any
    text_step: Any


class OmniHooks:
    """RFC-005 hook protocol over vLLM-Omni's model contract; one instance per runner."""

    def __init__(self, backend: Backend, kind: str = AR):
        if kind not in KINDS:
            raise ValueError(f"runner kind must be one of {KINDS}, got {kind!r}")
        self.backend = backend
        self.kind = kind
        self.model: Any = None
        self.contract: ModelContract = read_contract(None)
        self.payloads = _Payloads((), self._to_device, lambda t: self.backend.to_host(t))
        #: the steps' multimodal outputs on their way to the runner output (:mod:`core.hooks.step_rows`)
        self.rows = StepRowsCollector(backend)
        #: the model's outputs need no hook of its own per step (no ``postprocess``, ``make_omni_output`` nor
        #: ``set_batch_req_ids``): :meth:`process_model_output` is then one call of :attr:`rows` (``bind_model``)
        self.outputs_only = True
        #: the forward takes vLLM-Omni's per-request state kwargs (set by :meth:`bind_model`)
        self.passes_request_state = True
        self._mtp_seeds: dict[str, int | None] = {}
        #: requests that arrived without omni state: vLLM's own (V2's warm-up sends real requests,
        #: ``_v2_mixed_warmup_*``); the model's preprocess / postprocess are not run on them
        self._foreign: set[str] = set()
        self._mtp_generators: dict[str, torch.Generator] = {}
        self.talker_mtp: TalkerMTP | None = None
        self.mtp_calls: dict[str, int] = {}
        #: talker-MTP calls of the last :data:`FINISHED_MTP_RECORD` finished requests (bounded: a long-running
        #: server keeps no per-request state), read through the worker's ``omni_state``
        self.mtp_calls_finished: dict[str, int] = {}
        self.mtp_mode = "none"
        self.mtp_sampling: dict[str, Any] = {}
        self.vocab_size: int | None = None
        #: real forwards by the number of requests in them (``{requests: forwards}``; bounded by
        #: ``max_num_seqs``), read through the worker's ``omni_state``: e.g. how many chunk requests of
        #: concurrent utterances a code2wav forward decoded together
        self.forward_requests: collections.Counter[int] = collections.Counter()

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.backend.device())

    # ------------------------------------------------------------- binding
    def bind_model(self, model: Any, vllm_config: Any = None,
                   mtp_runner: Callable[[Any, Any, int], TalkerMTP] | None = None) -> None:
        """Read the model's contract (:func:`~core.hooks.contract.read_contract`,
        which raises naming a hook declared with a wrong signature) and set up
        the talker MTP: wrapped for FULL graphs through the Backend when
        ``capabilities().talker_mtp_graph`` and the model's
        ``talker_mtp_graph_safe`` allow, on persistent buffers of width
        ``mtp_hidden_size`` built by ``mtp_runner(head, eager_head, hidden_size)``
        (the runner's: it knows ``max_num_reqs``, dtype and capture sizes; by
        default an eager :class:`TalkerMTP` for 256 rows), given the persistent
        ``sample_uniforms`` buffer where the model declares ``mtp_sample_uniforms``
        (:meth:`TalkerMTP.use_sample_uniforms`)."""
        self.model = model
        self.contract = c = read_contract(model)
        self.outputs_only = c.postprocess is None and c.make_omni_output is None and c.set_batch_req_ids is None
        from core.model_io import PER_REQUEST_KWARGS

        self.passes_request_state = c.forward_params is None or any(k in c.forward_params for k in PER_REQUEST_KWARGS)
        if vllm_config is not None:
            from core.model_io import copy_graph_inputs, takes_per_request_kwargs

            if takes_per_request_kwargs(model):
                no_full_graphs(vllm_config, f"{type(model).__name__} takes per-request omni kwargs")
            copy_graph_inputs(vllm_config, model)  # its compiled decoder reads embeddings it builds itself
        self.payloads.device_resident_keys = c.gpu_resident_buffer_keys
        model_config = getattr(vllm_config, "model_config", None)
        if model_config is not None and hasattr(model_config, "get_vocab_size"):
            self.vocab_size = int(model_config.get_vocab_size())
            params = getattr(model_config, "subtalker_sampling_params", None)
            self.mtp_sampling = {k: params.get(k) for k in ("do_sample", "temperature", "top_k", "top_p")
                                 } if isinstance(params, dict) else {}
        if self.kind == GENERATION:
            self._install_logits_fallback(model)
        if c.talker_mtp is None:
            self.talker_mtp, self.mtp_mode = None, "none"
            return
        hidden = c.mtp_hidden_size or int(getattr(model_config, "get_hidden_size", lambda: 0)() or 0)
        if not hidden:
            from core.hooks.contract import ModelContractError

            raise ModelContractError(f"{type(model).__name__} declares talker_mtp but no mtp_hidden_size (the "
                                     "width of its persistent input buffers); set model.mtp_hidden_size")
        head = c.talker_mtp
        caps = self.backend.capabilities()
        graphs_on = vllm_config is not None and graphs_enabled(vllm_config)
        if caps.talker_mtp_graph and c.talker_mtp_graph_safe and graphs_on:
            head = self.backend.wrap_graph(c.talker_mtp, vllm_config, CUDAGRAPH_MODE.resolve().FULL)
            self.mtp_mode = "graph"
        else:
            self.mtp_mode = "eager"
            log.info("talker MTP runs eager: driver %s has talker_mtp_graph=%s, model graph-safe=%s, engine graphs %s",
                     self.backend.name, caps.talker_mtp_graph, c.talker_mtp_graph_safe,
                     "on" if graphs_on else "off (enforce_eager / NONE)")
        if mtp_runner is None:
            dtype = getattr(model_config, "dtype", torch.float32)
            self.talker_mtp = TalkerMTP(head, 256, hidden, dtype, self.backend.device(), eager=c.talker_mtp)
        else:
            self.talker_mtp = mtp_runner(head, c.talker_mtp, hidden)
        if c.mtp_sample_shape is not None:  # seeded rows stay on the graph: noise drawn per row outside it
            self.talker_mtp.use_sample_uniforms(*c.mtp_sample_shape)

    def _install_logits_fallback(self, model: Any) -> None:
        """A generation-kind model's ``compute_logits`` may return ``None`` (it
        produces no text, e.g. vLLM-Omni's ``Qwen3TTSCode2Wav``); vLLM's sampler
        then gets zero logits ``[n, vocab]`` (the request ends after its one
        step, ``max_tokens=1``). Installed on the model instance: the patch
        :mod:`core.patches.compute_logits`."""
        install_logits_fallback(model, self.vocab_size or 1)

    @property
    def exact_tokens(self) -> bool:
        """Whether a real step's forward gets only its scheduled tokens (``core.model_io.exact_token_kwargs``):
        a generation-kind model (it gets ``seq_token_counts`` and decodes whole requests: vLLM-Omni's code2wav
        models split the flat tokens by them and give the last request the rest, CUDA-graph padding included),
        or a model declaring vLLM-Omni's ``requires_exact_input_shape``."""
        return self.kind == GENERATION or self.contract.requires_exact_input_shape

    # ------------------------------------------------------ on_new_requests
    def on_new_requests(self, new_requests: Iterable[tuple[str, Any]]) -> None:
        """Store each new request's initial state (``sampling_params.extra_args``
        packed by :func:`core.payloads.pack`) and its MTP seed
        (``extra_args["tts_local_seed"]``)."""
        for req_id, sampling_params in new_requests:
            extra = getattr(sampling_params, "extra_args", None) or {}
            packed = extra.get(EXTRA_ARGS_KEY)
            # a request without omni state is vLLM's own (its warm-up sends real requests: ``_warmup_0_`` with
            # max_tokens=16, V2's ``_v2_mixed_warmup_*``), or one whose model reads only its tokens (vLLM-Omni's
            # code2wav): no preprocess / postprocess, no generation-kind rule (the front end applies that one)
            if packed is not None and self.kind == GENERATION and getattr(sampling_params, "max_tokens", 1) != 1:
                raise ValueError(
                    f"request {req_id}: a generation-kind runner produces its whole output in the prefill forward; "
                    f"submit it with SamplingParams(max_tokens=1), not max_tokens={sampling_params.max_tokens}"
                )
            if packed is None:
                self._foreign.add(req_id)
            self.payloads.put(req_id, unpack(packed))
            seed = extra.get(MTP_SEED_KEY)
            self._mtp_seeds[req_id] = int(seed) if seed is not None else None

    def on_finished_requests(self, req_ids: Iterable[str]) -> None:
        """Free the state, MTP generators and counters of finished or aborted
        requests; tell the model (``on_requests_finished``)."""
        req_ids = list(req_ids)
        if not req_ids:
            return
        self.payloads.free(req_ids)
        self.rows.drop(req_ids)
        for r in req_ids:
            calls = self.mtp_calls.pop(r, None)
            if calls is not None:
                self.mtp_calls_finished[r] = calls
                if len(self.mtp_calls_finished) > FINISHED_MTP_RECORD:
                    del self.mtp_calls_finished[next(iter(self.mtp_calls_finished))]
            self._mtp_seeds.pop(r, None)
            self._mtp_generators.pop(r, None)
            self._foreign.discard(r)
        if self.contract.on_requests_finished is not None:
            self.contract.on_requests_finished(set(req_ids))

    # ------------------------------------------------ prepare_prefill_embeds
    @property
    def uses_preprocess(self) -> bool:
        """True if the model has ``preprocess`` (the forward then takes ``inputs_embeds``)."""
        return self.contract.preprocess is not None

    def needs_embeds(self, batch: BatchView) -> bool:
        """True if the forward needs ``inputs_embeds`` this step: the model has
        ``preprocess``, or a request with ``prompt_embeds`` has prompt rows."""
        if self.uses_preprocess:
            return batch.num_reqs > 0
        # no live request was given prompt_embeds (the common case: no per-step numpy work), or decode-only steps
        if not self.payloads.with_embeds or not (batch.num_computed < batch.num_prompt).any():
            return False
        return any(
            isinstance(self.payloads.get(r).get("prompt_embeds"), torch.Tensor) and batch.prefill_rows(i)[2] > 0
            for i, r in enumerate(batch.req_ids)
        )

    def prepare_prefill_embeds(self, batch: BatchView, inputs_embeds: torch.Tensor) -> None:
        """Overlay each request's ``prompt_embeds`` ``[prompt_len, H]`` (a
        top-level tensor of its state) onto the rows of ``inputs_embeds``
        ``[num_tokens, H]`` that hold its *prompt* positions this step (chunked
        prefill aware; vLLM-Omni's prompt-embeds overlay); decode rows are untouched."""
        for i, req_id in enumerate(batch.req_ids):
            emb = self.payloads.get(req_id).get("prompt_embeds")
            if not isinstance(emb, torch.Tensor):
                continue
            start, first, count = batch.prefill_rows(i)
            if count <= 0:
                continue
            if emb.shape[0] < first + count:
                raise ValueError(
                    f"request {req_id}: prompt_embeds has {emb.shape[0]} rows but the prompt has "
                    f"{int(batch.num_prompt[i])} tokens; pass one embedding row per prompt token"
                )
            inputs_embeds[start : start + count].copy_(emb[first : first + count].to(inputs_embeds.dtype),
                                                       non_blocking=True)

    def request_infos(self, batch: BatchView, i: int) -> dict[str, Any]:
        """Request i's live state with vLLM-Omni's injected step facts:
        ``request_id``, ``_omni_is_prefill``, ``_omni_num_computed_tokens``,
        ``_omni_prompt_len``, ``_omni_max_tokens``, ``_omni_seed``."""
        req_id = batch.req_ids[i]
        info = self.payloads.put(req_id, None)
        info["request_id"] = req_id
        info["_omni_prompt_len"] = int(batch.num_prompt[i])
        info["_omni_num_computed_tokens"] = int(batch.num_computed[i])
        info["_omni_is_prefill"] = batch.is_prefill(i)
        info["_omni_max_tokens"] = batch.max_tokens[i] if batch.max_tokens is not None else None
        info["_omni_seed"] = batch.seeds[i] if batch.seeds is not None else None
        return info

    def preprocess(self, batch: BatchView, input_ids: torch.Tensor, inputs_embeds: torch.Tensor) -> None:
        """vLLM-Omni's ``_preprocess``: for every scheduled request, every step,
        ``model.preprocess(input_ids=ids[span], input_embeds=embeds[span], **infos)
        -> (ids, embeds, update)``; the returned rows replace the request's rows
        of ``input_ids`` ``[num_tokens]`` / ``inputs_embeds`` ``[num_tokens, H]``
        (in place), ``update`` is merged into its state. Then, for a talker-MTP
        model, the MTP runs on the decode rows (:meth:`run_talker_mtp`)."""
        pre = self.contract.preprocess
        if pre is None:
            return
        mtp_rows: list[MtpRow] = []
        for i, req_id in enumerate(batch.req_ids):
            if req_id in self._foreign:
                continue  # vLLM's own request: its rows stay the token embeddings
            s, e = batch.span(i)
            info = self.request_infos(batch, i)
            ids_out, emb_out, update = pre(input_ids=input_ids[s:e], input_embeds=inputs_embeds[s:e], **info)
            update = dict(update or {})
            if self.talker_mtp is not None and batch.is_decode_row(i) and "mtp_inputs" in update:
                last_hidden, text_step = update.pop("mtp_inputs")
                mtp_rows.append(MtpRow(req_id, s, ids_out, emb_out, last_hidden, text_step))
            self.payloads.put(req_id, update)
            n = min(e - s, int(emb_out.shape[0]))
            inputs_embeds[s : s + n].copy_(emb_out[:n].reshape(n, -1).to(inputs_embeds.dtype))
            if isinstance(ids_out, torch.Tensor) and ids_out.numel() == n:
                input_ids[s : s + n].copy_(ids_out.reshape(-1).to(input_ids.dtype))
        if mtp_rows:
            self.run_talker_mtp(mtp_rows, inputs_embeds)

    # --------------------------------------------------------- talker MTP
    def run_talker_mtp(self, rows: list[MtpRow], inputs_embeds: torch.Tensor) -> None:
        """Once per decode row, before the forward: ``talker_mtp`` on the rows'
        ids, embeds, ``last_talker_hidden`` and ``text_step`` (from
        ``preprocess``'s ``mtp_inputs``); its embeds replace the rows of
        ``inputs_embeds``, its codes ``[1, Q]`` go to the request's state under
        ``talker_mtp_output_key`` (and ``talker_mtp_validity_key`` = True)."""
        mtp, c = self.talker_mtp, self.contract
        assert mtp is not None
        dev = inputs_embeds.device
        ids = torch.cat([r.input_ids.reshape(-1)[:1] for r in rows]).to(dev)
        embeds = torch.cat([r.inputs_embeds.reshape(1, -1) for r in rows])
        hidden = torch.cat([r.last_hidden.reshape(1, -1) for r in rows])
        text = torch.cat([r.text_step.reshape(1, -1) for r in rows])
        gens = [request_generator(self._mtp_seeds.get(r.req_id), dev, self._mtp_generators, r.req_id) for r in rows]
        kwargs = dict(self.mtp_sampling) or {"do_sample": None, "temperature": None, "top_k": None, "top_p": None}
        if len(rows) == 1 and gens[0] is not None:
            kwargs["generator"] = gens[0]
        elif any(g is not None for g in gens):
            kwargs["generators"] = gens
        out_embeds, codes = mtp(ids, embeds, hidden, text, **kwargs)
        starts = torch.tensor([r.start for r in rows], device=dev)
        inputs_embeds.index_copy_(0, starts, out_embeds.to(inputs_embeds.dtype))
        cat, qual = c.talker_mtp_output_key
        for j, r in enumerate(rows):
            update: dict[str, Any] = {cat: {qual: codes[j : j + 1]}}
            if c.talker_mtp_validity_key is not None:
                vcat, vqual = c.talker_mtp_validity_key
                update.setdefault(vcat, {})[vqual] = torch.ones((), dtype=torch.bool, device=codes.device)
            self.payloads.put(r.req_id, update)
            self.mtp_calls[r.req_id] = self.mtp_calls.get(r.req_id, 0) + 1

    # ---------------------------------------------------- build_extra_kwargs
    def build_extra_kwargs(self, batch: BatchView, **runner_kwargs: Any) -> dict[str, Any]:
        """vLLM-Omni's model kwargs extra, restricted to what the forward accepts:
        ``model_intermediate_buffer`` and ``runtime_additional_information`` (the
        same list of per-request state dicts, batch order, with ``generated_len``),
        ``request_token_spans`` (``(start, end)`` per request); generation kind:
        ``seq_token_counts``, ``request_ids`` (each request's :func:`state_key`); plus ``runner_kwargs`` (the AR
        runner passes ``sampling_metadata`` and ``sampler``). A dummy batch's state is the model's
        ``get_dummy_runtime_additional_information(n)`` where it declares one, else empty dicts. A real batch is
        counted in :attr:`forward_requests` (requests per forward)."""
        if not batch.dummy:
            self.forward_requests[len(batch.req_ids)] += 1
        if not self.passes_request_state:  # the forward takes none of them: build nothing per request
            return self.contract.forward_kwargs(dict(runner_kwargs))
        # a dummy batch's ids are never removed: fresh dicts (the model's own dummy state where it declares one),
        # or every profile / warm-up run would leave entries
        if batch.dummy:
            dummy = self.contract.dummy_request_state
            infos = list(dummy(len(batch.req_ids))) if dummy is not None else [{} for _ in batch.req_ids]
        else:
            infos = self.payloads.entries(batch.req_ids)
        if batch.num_output is not None:
            for info, n in zip(infos, batch.num_output.tolist()):
                info["generated_len"] = n
        spans = list(batch.spans)  # the model may keep or change it
        kwargs: dict[str, Any] = {"model_intermediate_buffer": infos, "runtime_additional_information": infos,
                                  "request_token_spans": spans}
        if self.kind == GENERATION:
            kwargs["seq_token_counts"] = [e - s for s, e in spans]
            kwargs["request_ids"] = [state_key(info, r) for info, r in zip(infos, batch.req_ids)]
        kwargs.update(runner_kwargs)
        return self.contract.forward_kwargs(kwargs)

    def release_request_state(self, keys: Iterable[str]) -> int:
        """Tell the model that the requests keyed ``keys`` (:func:`state_key`: e.g. the utterance a stage's chunk
        requests belong to) ended, through its ``on_requests_finished``; returns how many keys it was told (0
        for a model without the hook)."""
        keys = {str(k) for k in keys}
        if not keys or self.contract.on_requests_finished is None:
            return 0
        self.contract.on_requests_finished(keys)
        return len(keys)

    # --------------------------------------------------- process_model_output
    def normalize_output(self, output: Any, model_kwargs: dict[str, Any] | None = None) -> Any:
        """The forward's result as an ``OmniOutput`` (ours or vLLM-Omni's), via
        the model's ``make_omni_output(out, **model_kwargs)`` when it returned
        something else; ``None`` for a plain tensor of a model without it."""
        omni = as_omni_output(output)
        make = self.contract.make_omni_output
        if make is None:  # most models, every step: the output as it is
            return omni
        if isinstance(output, torch.Tensor):
            return as_omni_output(make(output, **(model_kwargs or {})))
        if omni is not None and not omni.multimodal_outputs and omni.text_hidden_states is not None:
            # the model-output adapter (core.model_io) hands a bare forward result over as (hidden, {})
            return as_omni_output(make(omni.text_hidden_states, **(model_kwargs or {})))
        return omni

    def process_model_output(self, output: Any, batch: BatchView, model_kwargs: dict[str, Any] | None = None) -> Any:
        """After a real step's forward: normalise the output
        (:meth:`normalize_output`), run the model's ``postprocess`` per request on
        its rows (merged into its state), tell the model the batch order
        (``set_batch_req_ids``), and collect this step's multimodal outputs per
        request: a tensor whose first dim is ``num_tokens`` is sliced by the
        request's rows (positions emitted before -- a request recomputed after
        preemption -- are skipped); a list with one entry per request is handed
        out by position. Names are ``category.qualifier``. Copies go to the CPU
        through ``Backend.to_host`` (:meth:`~core.hooks.step_rows.StepRowsCollector.collect`, where a step's
        outputs become its rows). Returns the text hidden states
        ``[num_tokens, H]`` (``None`` if the model returns none)."""
        if self.outputs_only and type(output) is OmniOutput:  # the adapter's output, no model hook to run
            if output.multimodal_outputs:
                self.rows.collect(output.multimodal_outputs, batch.req_ids, batch.query_start_loc, batch.num_computed)
            return output.text_hidden_states
        c = self.contract
        omni = self.normalize_output(output, model_kwargs)
        hidden = omni.text_hidden_states if omni is not None else output
        mm = (omni.multimodal_outputs if omni is not None else None) or {}
        if c.postprocess is not None:
            for i, req_id in enumerate(batch.req_ids):
                if req_id in self._foreign:
                    continue
                s, e = batch.span(i)
                info = self.payloads.get(req_id) if c.postprocess_uses_req_infos else {}
                kwargs = {k: v for k, v in info.items() if k != "hidden_states"}
                h = hidden[s:e] if c.postprocess_uses_hidden_states and hidden is not None else hidden
                update = c.postprocess(h, multimodal_outputs=mm if c.postprocess_uses_multimodal_outputs else None,
                                       **kwargs)
                self.payloads.put(req_id, update)
        if c.set_batch_req_ids is not None:
            c.set_batch_req_ids(list(batch.req_ids))
        if mm:
            self.rows.collect(mm, batch.req_ids, batch.query_start_loc, batch.num_computed)
        return hidden

    # ------------------------------------------------ get_model_runner_output
    def take_step_outputs(self) -> StepOutputs:
        """This step's multimodal outputs (a read-only mapping req_id -> name -> CPU tensor, built when
        first read: :class:`~core.outputs.StepOutputs`), handed over once."""
        return self.rows.take()

    def get_model_runner_output(self, base: Any, step: Any = None) -> Any:
        """Wrap vLLM's ``ModelRunnerOutput`` into an :class:`~core.outputs.OmniModelRunnerOutput` carrying this
        step's multimodal outputs step-major (``omni_rows``; waits for the step's copies):
        :meth:`~core.hooks.step_rows.StepRowsCollector.runner_output`. ``step``: outputs taken earlier with
        :meth:`take_step_outputs` (or a ``req_id -> name -> tensor`` mapping); ``base`` itself when there are
        none."""
        return self.rows.runner_output(base, step)


class _Payloads(PayloadStore):
    """The hooks' :class:`~core.payloads.PayloadStore`, knowing which live requests were given
    ``prompt_embeds`` (``with_embeds``), so a step of a batch without any does no per-request work for them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.with_embeds: set[str] = set()

    def put(self, req_id: str, update: dict[str, Any] | None) -> dict[str, Any]:
        if update and "prompt_embeds" in update:
            self.with_embeds.add(req_id)
        return super().put(req_id, update)

    def free(self, req_ids: Iterable[str]) -> None:
        req_ids = list(req_ids)
        self.with_embeds.difference_update(req_ids)
        super().free(req_ids)
