"""A step's outputs to its rows in one worker-side call (``core.hooks.step_rows.StepRowsCollector``).

Units: what :meth:`StepRowsCollector.collect` makes of one step (token-aligned tensors placed once for the whole
step, nested names, per-request lists, padded rows, rows emitted before). The V2 model state (fakes,
``tests/core/v2_fakes.py``) and a V1 engine (the demo thinker): a model with no output hook of its own reaches
its step's rows through one collector call per step -- no ``process_model_output``, no ``OmniOutput`` built by
the adapter, no batch view built after the forward, and (V2) no persistent copy of the hidden states.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from core.hooks.step_rows import StepRowsCollector  # noqa: E402
from core.outputs import rows_per_request  # noqa: E402


def test_collect_places_each_name_once_for_the_whole_step(cpu_backend):
    rows = StepRowsCollector(cpu_backend)
    per_token = torch.arange(14, dtype=torch.float32)[:, None].repeat(1, 2)  # 10 rows used, 4 padded
    codes = torch.arange(14 * 3).reshape(14, 3)
    waves = [torch.ones(2), None, torch.zeros(3)]
    rows.collect({"hidden": per_token, "codes": {"audio": codes}, "wave": waves},
                 ["a", "b", "c"], np.array([0, 4, 5, 10]), [0, 7, 2])
    (block, items) = rows.take().rows()
    assert (block.req_ids, block.starts, block.ends) == (["a", "b", "c"], [0, 4, 5], [4, 5, 10])
    assert set(block.tensors) == {"hidden", "codes.audio"}  # nested: vLLM-Omni's category.qualifier
    assert torch.equal(block.tensors["hidden"], per_token[:10]) and torch.equal(block.tensors["codes.audio"], codes[:10])
    assert block.tensors["hidden"].untyped_storage().data_ptr() != per_token.untyped_storage().data_ptr()  # a copy
    assert items.item_req_ids == ["a", "c"] and items.item_names == ["wave", "wave"]
    assert rows.emitted == {"a": 4, "b": 8, "c": 7}
    # recomputed after preemption: "a" again from position 0, 6 rows; the 4 it emitted are skipped
    rows.collect({"hidden": per_token}, ["a"], [0, 6], np.array([0]))
    got = rows_per_request(rows.take().rows())
    assert torch.equal(got["a"]["hidden"], per_token[4:6]) and rows.emitted["a"] == 6
    rows.drop(["a", "b"])
    assert rows.emitted == {"c": 7}


class _Plain(torch.nn.Module):
    """An omni model with no output hook: its forward returns an ``OmniOutput`` with per-token hidden states
    (as the demo thinker does); no postprocess, ``make_omni_output`` nor ``set_batch_req_ids``."""

    have_multimodal_outputs = True

    def __init__(self, hidden: int):
        super().__init__()
        self.embed = torch.nn.Embedding(64, hidden)

    def embed_input_ids(self, input_ids):
        return self.embed(input_ids.long())

    def compute_logits(self, hidden):
        return hidden @ self.embed.weight.T

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        from core.outputs import OmniOutput

        h = self.embed_input_ids(input_ids) * 2.0
        return OmniOutput(h, {"hidden": h})


def _count(monkeypatch, cls, name, calls):
    inner = getattr(cls, name)

    def counted(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return inner(*args, **kwargs)

    monkeypatch.setattr(cls, name, counted)


def test_v2_a_model_without_output_hooks_reaches_its_rows_in_one_collector_call(vllm_config, monkeypatch):
    from core.hooks import OmniHooks
    from core.model_io import ModelOutputAdapter
    from tests.core.v2_fakes import H, IDS, add_all, greedy_inner, input_batch, make_state, omni_sampler

    model = _Plain(H)
    state = make_state(vllm_config, model)
    assert state.omni_hooks.outputs_only and not state.omni_io.keep_hidden  # no persistent hidden copy per step
    rs = add_all(state, {r: {} for r in IDS})
    calls: dict = {}
    for cls, name in ((StepRowsCollector, "collect"), (OmniHooks, "process_model_output"),
                      (ModelOutputAdapter, "take")):
        _count(monkeypatch, cls, name, calls)
    b = input_batch()
    kw = state.prepare_inputs(b, rs)
    out = model(**{"input_ids": b.input_ids, "positions": None, **kw})
    sampler, _ = omni_sampler(state, greedy_inner())
    sampler(model.compute_logits(out[b.logits_indices]), b)
    assert calls == {"collect": 1}
    step = state.omni_hooks.take_step_outputs()
    qsl = b.query_start_loc_np.tolist()
    for i, r in enumerate(IDS):
        torch.testing.assert_close(step[r]["hidden"], out[qsl[i] : qsl[i + 1]].detach())


@pytest.mark.engine_tier
def test_the_thinkers_step_reaches_its_rows_in_one_collector_call(demo_dir, test_device, monkeypatch):
    """The demo thinker (hidden states per token, no output hook) on the engine's runner (V1 on the cpu): one
    collector call per forward with tokens, and none of the general path's calls."""
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    from vllm import SamplingParams

    from core.hooks import OmniHooks
    from core.model_io import ModelOutputAdapter
    from core.pipeline.release import release_engine
    from core.runner.v1 import OmniV1RunnerMixin
    from core.stage import make_engine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    calls: dict = {}
    for cls, name in ((StepRowsCollector, "collect"), (OmniHooks, "process_model_output"),
                      (ModelOutputAdapter, "take"), (OmniV1RunnerMixin, "_lean_batch_view")):
        _count(monkeypatch, cls, name, calls)
    llm = make_engine(os.path.join(demo_dir, "thinker"), device=test_device, dtype="float32", enforce_eager=True,
                      max_model_len=64, max_num_seqs=2, seed=0)
    try:
        calls.clear()  # engine start: vLLM's dummy runs collect nothing
        params = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}], params, use_tqdm=False)
    finally:
        release_engine(llm, "thinker")
    assert [o.multimodal_outputs["hidden"].shape[0] for o in outs] == [3 + 4, 2 + 4]
    # the prefill step and 4 decode steps (async scheduling, where vLLM runs it, may run one step more)
    assert set(calls) == {"collect"} and calls["collect"] in (5, 6), calls


# ------------------------------------------------------------------ rows kept on the device
class _CountingBackend:
    """The cpu driver, counting host copies and events (page-locked memory declared absent: ``to_host``)."""

    def __init__(self, cpu_backend):
        import dataclasses as dc

        self.inner, self.to_host_calls, self.events = cpu_backend, 0, 0
        self.caps = dc.replace(cpu_backend.capabilities(), events=True, pinned_memory=False)

    def capabilities(self):
        return self.caps

    def to_host(self, t):
        self.to_host_calls += 1
        return torch.zeros(t.shape, dtype=t.dtype)

    def new_event(self, enable_timing=False):
        self.events += 1
        return self.inner.new_event()


def test_outputs_on_device_stay_on_the_forwards_device_with_no_host_copy_nor_fence(cpu_backend):
    """``outputs_on_device``: a device tensor's rows go into a slab on its own device (``meta`` stands for an
    accelerator here: the same code path, no data), no ``to_host``, no event; by default they are copied to the
    host."""
    from core.slabs import DeviceSlabs

    backend = _CountingBackend(cpu_backend)
    rows = StepRowsCollector(backend)
    per_token = torch.empty(6, 4, device="meta")
    rows.collect({"hidden": per_token}, ["a"], [0, 5], [0])
    (block,) = rows.take().rows()
    assert block.tensors["hidden"].device.type == "cpu" and backend.to_host_calls == 1  # the default: to the host
    rows.outputs_on_device = True
    for step in range(2):
        rows.collect({"hidden": per_token}, ["a"], [0, 1], [5 + step])
        (block,) = rows.take().rows()
        kept = block.tensors["hidden"]
        assert kept.device.type == "meta" and kept.shape == (1, 4)
        slab, at = kept._omni_slab  # rows of one device slab, as the front end's log reads them
        assert slab.device.type == "meta" and at == step and isinstance(rows._device_slabs, DeviceSlabs)
    assert backend.to_host_calls == 1 and backend.events == 0


def test_the_front_ends_log_gathers_device_rows_on_the_device_with_no_host_index(monkeypatch):
    """A request's rows over several steps of a device slab are concatenated on the device from views of the
    slab: no ``index_select`` with an index built on the host (copying it over waits for the device; an
    accelerator refuses a host index). Host slabs keep their one ``index_select``."""
    from core.outputs import StepRows
    from core.slabs import DeviceSlabs, HostSlabs
    from core.step_log import StepLog

    selects = []
    inner = torch.Tensor.index_select

    def index_select(self, dim, index):
        selects.append((self.device.type, index.device.type))
        return inner(self, dim, index)

    monkeypatch.setattr(torch.Tensor, "index_select", index_select)
    for slabs, source, want in ((DeviceSlabs(rows=16), torch.empty(2, 4, device="meta"), []),
                                (HostSlabs(rows=16), torch.arange(8.0).reshape(2, 4), [("cpu", "cpu")])):
        log, selects[:] = StepLog(), []
        for step in range(3):
            log.extend([StepRows(["a", "b"], [0, 1], [1, 2], {"hidden": slabs.copy(source)})])
        (got,) = log.steps("b", 0)
        assert got["hidden"].shape == (3, 4) and got["hidden"].device == source.device
        assert selects == want
        if source.is_cpu:
            assert torch.equal(got["hidden"], source[1:].repeat(3, 1))


def test_outputs_on_device_needs_the_worker_in_this_process(demo_dir, test_device, monkeypatch):
    """Refused before vLLM starts, saying what to set: an engine core in its own process (vLLM's default) or
    more than one worker."""
    from core.stage import make_engine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        make_engine(os.path.join(demo_dir, "thinker"), device=test_device, outputs_on_device=True)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1"):
        make_engine(os.path.join(demo_dir, "thinker"), device=test_device, outputs_on_device=True,
                    tensor_parallel_size=2)


@pytest.mark.engine_tier
def test_an_in_process_engine_keeps_its_outputs_on_the_device_when_asked(demo_dir, test_device, monkeypatch):
    """``make_engine(..., outputs_on_device=True)``: the worker is told (``omni_state``), and the outputs are the
    default engine's, on the engine's device."""
    from tests.core.conftest import _need_vllm

    _need_vllm(test_device)
    from vllm import SamplingParams

    from core.pipeline.release import release_engine
    from core.stage import make_engine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0, detokenize=False)
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
    got = {}
    for on in (False, True):
        llm = make_engine(os.path.join(demo_dir, "thinker"), device=test_device, dtype="float32",
                          enforce_eager=True, max_model_len=64, max_num_seqs=2, seed=0, outputs_on_device=on)
        try:
            assert llm.collective_rpc("omni_state")[0]["outputs_on_device"] is on
            got[on] = [o.multimodal_outputs["hidden"] for o in llm.generate(prompts, params, use_tqdm=False)]
        finally:
            release_engine(llm, "thinker")
    from tests.core.precision import tolerance

    assert all(h.device.type == "cpu" for h in got[False])
    assert all(h.device.type == torch.device(test_device).type for h in got[True])
    # the same forward in two engines: bit for bit on the cpu; elsewhere to the device's measured tolerance
    tol = {"rtol": 0.0, "atol": 0.0} if test_device == "cpu" else tolerance(test_device, "float32", "hidden")
    for a, b in zip(got[False], got[True]):
        torch.testing.assert_close(b.cpu(), a, **tol)
