"""Every call vLLM makes of an omni model gets a tensor; async outputs are the
class vLLM's executors unwrap (core.model_io). Regression tests for the two
faults seen on a real vLLM CUDA engine (issue 14): ``'OmniOutput' object is not
subscriptable`` in ``_dummy_run`` (V1) and ``'AsyncOutput' object has no
attribute 'logprobs'`` in the scheduler (V2, V1 with async scheduling)."""

from __future__ import annotations

import abc
import types
import weakref
from typing import NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

from core.model_io import ModelOutputAdapter, adapter_of, omni_async_output_cls, split_output
from core.outputs import OmniOutput

H, MAX_TOKENS = 4, 16


class OmniModel(nn.Module):
    """Returns an OmniOutput: hidden = embedding, mm["hidden"] = hidden * 2."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, H)

    def forward(self, input_ids, positions=None, intermediate_tensors=None, inputs_embeds=None, **kw):
        h = self.embed(input_ids)
        return OmniOutput(text_hidden_states=h, multimodal_outputs={"hidden": h * 2})


class VllmOmniOutput(NamedTuple):  # vLLM-Omni's output_templates.OmniOutput field layout
    text_hidden_states: torch.Tensor | None
    multimodal_outputs: dict | None = None
    intermediate_tensors: object = None
    next_token_id: object = None


def test_direct_calls_get_a_tensor_a_weakref_survives_and_outputs_land_in_persistent_buffers():
    model = OmniModel()
    io = ModelOutputAdapter(model, MAX_TOKENS)
    ids = torch.tensor([1, 2, 3])
    out = model(input_ids=ids, positions=None)  # how vLLM's _dummy_run / CUDAGraphWrapper call it
    assert isinstance(out, torch.Tensor) and out.shape == (3, H)
    assert out[torch.tensor([2])].shape == (1, H)  # _dummy_run indexes the result
    weakref.ref(out)  # CUDAGraphWrapper weak-refs the output
    buf = io._buffers["hidden"]
    assert buf.shape == (MAX_TOKENS, H)
    io.begin_step()
    model(ids[:2])
    got = io.take(out[:2])
    torch.testing.assert_close(got.multimodal_outputs["hidden"], model.embed(ids[:2]).detach() * 2)
    assert got.multimodal_outputs["hidden"].data_ptr() == buf.data_ptr()  # the same memory every call
    io.remove()
    assert isinstance(model(ids), OmniOutput)


def test_a_replayed_step_reads_the_buffers_a_captured_forward_writes():
    model = OmniModel()
    io = ModelOutputAdapter(model, MAX_TOKENS, keep_hidden=True)
    model(torch.tensor([0, 0, 0, 0]))  # capture: the copies are part of the graph
    io.begin_step()  # a replayed step: no Python forward; the graph refreshes the buffers
    ids = torch.tensor([5, 6, 7, 8])
    with torch.no_grad():
        h = model.embed(ids)
        io._hidden[:4].copy_(h)
        io._buffers["hidden"][:4].copy_(h * 2)
    got = io.take(4)
    torch.testing.assert_close(got.text_hidden_states, h)
    torch.testing.assert_close(got.multimodal_outputs["hidden"], h * 2)


def test_python_only_outputs_under_replay_are_refused_with_the_fix():
    class Lists(OmniModel):
        def forward(self, input_ids, *a, **k):
            h = self.embed(input_ids)
            return OmniOutput(h, {"per_request": [h[:1]]})

    model = Lists()
    io = ModelOutputAdapter(model, MAX_TOKENS)
    h = model(torch.tensor([1, 2]))
    io.begin_step()
    with pytest.raises(RuntimeError, match="cudagraph_mode=PIECEWISE or enforce_eager"):
        io.take(h)
    io.begin_step()
    h = model(torch.tensor([1, 2]))
    assert isinstance(io.take(h).multimodal_outputs["per_request"], list)  # eager: Python objects pass


def test_vllm_omni_output_and_generation_models_without_text_hidden_states():
    h = torch.ones(3, H)
    assert split_output(VllmOmniOutput(h, None))[0] is h
    assert split_output(VllmOmniOutput(h, {"codes": {"audio": 1}}))[1] == {"codes": {"audio": 1}}
    with pytest.raises(TypeError, match="return a tensor"):
        split_output((h, {}))

    class Code2Wav(nn.Module):
        def forward(self, input_ids, positions=None, **kw):
            return VllmOmniOutput(None, {"wave": [torch.ones(5)]})

    model = Code2Wav()
    io = ModelOutputAdapter(model, MAX_TOKENS, hidden_size=H, dtype=torch.float32)
    out = model(input_ids=torch.tensor([1, 2, 3]), positions=torch.arange(3))
    assert out.shape == (3, H) and not out.any()  # the placeholder vLLM's logits path reads


def test_exact_tokens_cut_a_padded_real_step_to_its_scheduled_tokens():
    """``exact_tokens`` (a generation-kind model, or ``requires_exact_input_shape``): a real step's call padded to a
    CUDA-graph size reaches the model with only its scheduled tokens (``seq_token_counts``, else the last
    ``request_token_spans``), M-RoPE positions cut on their last dim; the runner still gets ``[padded, H]``
    hidden states; dummy runs (no counts) and adapters without the flag pass everything."""
    from core.model_io import exact_token_kwargs, scheduled_tokens

    seen = []

    class Splitter(nn.Module):  # splits by its counts, the only request takes the rest (vLLM-Omni's code2wav)
        def forward(self, input_ids, positions=None, **kw):
            seen.append((input_ids.shape[0], tuple(positions.shape)))
            return VllmOmniOutput(torch.ones(input_ids.shape[0], H), {"frames": [input_ids.numel() // 4]})

    model = Splitter()
    ModelOutputAdapter(model, MAX_TOKENS, hidden_size=H, dtype=torch.float32, persistent=False, exact_tokens=True)
    out = model(input_ids=torch.arange(32), positions=torch.arange(32), seq_token_counts=[28],
                request_token_spans=[(0, 28)])
    assert seen[-1] == (28, (28,)) and out.shape == (32, H) and not out[28:].any() and out[:28].all()
    model(input_ids=torch.arange(32), positions=torch.arange(32))  # a dummy run: no counts, nothing cut
    assert seen[-1] == (32, (32,))
    plain = Splitter()
    ModelOutputAdapter(plain, MAX_TOKENS, hidden_size=H, dtype=torch.float32, persistent=False)
    plain(input_ids=torch.arange(32), positions=torch.arange(32), seq_token_counts=[28])
    assert seen[-1] == (32, (32,))
    kw = exact_token_kwargs({"inputs_embeds": torch.ones(8, H), "positions": torch.zeros(3, 8),
                             "request_token_spans": [(0, 2), (2, 5)]})
    assert kw["inputs_embeds"].shape == (5, H) and kw["positions"].shape == (3, 5)
    assert scheduled_tokens({}) is None and scheduled_tokens({"seq_token_counts": [3, 4]}) == 7


def test_the_placeholder_of_a_model_without_text_hidden_states_is_on_its_inputs_device():
    # on the H200 (2026-12-02) vLLM-Omni's Qwen3TTSCode2Wav returned text_hidden_states=None and the placeholder
    # was made on the CPU: vLLM's _dummy_run then indexed it with device indices and failed. The meta device stands
    # in for an accelerator here: a placeholder made anywhere but on the inputs' device fails this test.
    class Code2Wav(nn.Module):
        def forward(self, input_ids=None, positions=None, inputs_embeds=None, **kw):
            return VllmOmniOutput(None, {"wave": [torch.ones(5)]})

    meta = torch.device("meta")
    for call in ({"input_ids": torch.zeros(3, dtype=torch.long, device=meta)},
                 {"positions": torch.arange(4, device=meta)},
                 {"inputs_embeds": torch.zeros(2, H, device=meta)}):
        model = Code2Wav()  # one engine, one call signature: a model per kind of call
        ModelOutputAdapter(model, MAX_TOKENS, hidden_size=H, dtype=torch.float32)
        out = model(**call)
        assert out.device == meta and out.shape[1] == H
    model = Code2Wav()
    ModelOutputAdapter(model, MAX_TOKENS, hidden_size=H, dtype=torch.float32)
    assert model(input_ids=torch.zeros(3, dtype=torch.long, device=meta)).device == meta
    assert model(input_ids=torch.tensor([1, 2])).device.type == "cpu"  # and back, when the inputs move



def test_no_module_hook_and_every_way_vllm_calls_the_model_lands_outputs_in_the_buffers(monkeypatch):
    """The adapter wraps the instance's ``forward`` (issue 25): no forward hook or pre-hook is registered, so
    ``nn.Module.__call__`` keeps its hook-free path on every step; every way vLLM calls the model -- ``model(...)``,
    ``model.forward(...)``, vLLM's ``CUDAGraphWrapper`` around it (the H200's FULL graphs: capture and the
    non-graph calls go through ``runnable(...)``), a torch.compile'd module -- still gets a tensor and lands the
    outputs in the same persistent buffers (what a FULL-graph replay refreshes)."""
    import inspect

    model = OmniModel()
    io = ModelOutputAdapter(model, MAX_TOKENS)
    assert not model._forward_hooks and not model._forward_pre_hooks and not model._forward_hooks_with_kwargs
    assert inspect.signature(model.forward) == inspect.signature(OmniModel().forward)  # vLLM / contract readers
    ids = torch.tensor([1, 2, 3])
    model(input_ids=ids, positions=None)  # the profile run: buffers allocated
    buf = io._buffers["hidden"]
    calls = {"module call": lambda i: model(input_ids=i, positions=None),
             "forward": lambda i: model.forward(i, None, None, None),
             "compiled": lambda i: torch.compile(model, backend="eager", dynamic=False)(input_ids=i, positions=None)}
    pytest.importorskip("vllm")
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CUDAGraphMode
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "_global_graph_pool", object(), raising=False)  # no graph pool on cpu
    wrapper = CUDAGraphWrapper(model, types.SimpleNamespace(compilation_config=None), CUDAGraphMode.FULL)
    calls["CUDAGraphWrapper"] = lambda i: wrapper(input_ids=i, positions=None)
    for k, (name, call) in enumerate(calls.items()):
        io.begin_step()
        step_ids = torch.tensor([k + 4, k + 5])
        out = call(step_ids)
        assert isinstance(out, torch.Tensor) and out.shape == (2, H), name
        got = io.take(out).multimodal_outputs["hidden"]
        assert got.data_ptr() == buf.data_ptr(), name  # the same memory on every path
        torch.testing.assert_close(got, model.embed(step_ids).detach() * 2, msg=name)
    assert io.calls == 1 + len(calls)
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_the_wrapped_forward_is_removed_replaced_and_keeps_the_models_own():
    model = OmniModel()
    first = ModelOutputAdapter(model, MAX_TOKENS)
    second = ModelOutputAdapter(model, MAX_TOKENS)  # one adapter per model: the second replaces the first
    assert adapter_of(model) is second and model.forward.__wrapped__.__func__ is OmniModel.forward
    ids = torch.tensor([1, 2])
    assert isinstance(model(ids), torch.Tensor) and (first.calls, second.calls) == (0, 1)
    second.remove()
    assert "forward" not in model.__dict__ and adapter_of(model) is None
    assert isinstance(model(ids), OmniOutput)  # the model's own output again

    own = []  # an instance forward set before the adapter (another wrapper) runs inside it and comes back
    model.forward = lambda *a, **k: own.append(1) or OmniModel.forward(model, *a, **k)
    before = model.forward
    io = ModelOutputAdapter(model, MAX_TOKENS)
    assert isinstance(model(ids), torch.Tensor) and own == [1]
    io.remove()
    assert model.forward is before

    class Patched(OmniModel):
        pass

    model = Patched()
    ModelOutputAdapter(model, MAX_TOKENS)
    Patched.forward = lambda self, input_ids, *a, **k: OmniOutput(self.embed(input_ids) + 1, {})
    # the class's forward is looked up at every call (as nn.Module.__call__ does): a later patch is seen
    torch.testing.assert_close(model(ids), model.embed(ids) + 1)


# ------------------------------------------------------------------ V1 runner
def _v1_runner(model):
    """OmniV1RunnerMixin over a base that calls the model the way vLLM's V1
    GPUModelRunner does: ``_dummy_run`` (profile, warm-up, capture) calls
    ``self.model(...)`` directly and indexes the result."""
    from core.runner import OmniV1RunnerMixin

    class Base:
        def __init__(self):
            self.max_num_tokens, self.dtype = MAX_TOKENS, torch.float32
            self.model_config = types.SimpleNamespace(get_hidden_size=lambda: H)
            self.vllm_config = None

        def load_model(self):
            self.model = model

        def get_model(self):
            return self.model

        def _dummy_run(self, num_tokens):
            hidden = self.model(input_ids=torch.zeros(num_tokens, dtype=torch.long), positions=None)
            return hidden[torch.tensor([num_tokens - 1])]

    cls = type("R", (OmniV1RunnerMixin, Base), {"__init__": lambda self: Base.__init__(self)})
    runner = cls()
    runner.omni_hooks = types.SimpleNamespace(bind_model=lambda *a, **k: None, mtp_mode="none")
    return runner


def test_v1_dummy_run_calls_the_model_directly_and_gets_a_tensor():
    runner = _v1_runner(OmniModel())
    runner.load_model()
    assert runner._dummy_run(8).shape == (1, H)  # before: 'OmniOutput' object is not subscriptable
    runner.load_model()  # a reload installs one adapter, not two
    assert adapter_of(runner.model) is runner._omni_io and not runner.model._forward_hooks
    assert runner.model.forward.__wrapped__.__func__ is OmniModel.forward  # wrapped once, over the model's own


def test_v1_dummy_runs_of_a_preprocess_model_carry_embeddings_like_its_real_steps():
    # the H200 (2026-12-02): vLLM-Omni's Qwen3-TTS talker (a preprocess model, real steps pass inputs_embeds)
    # gave garbage codes under compilation: vLLM compiled its decoder on a dummy run's input_ids path and dropped
    # the guards. Every call must reach the model with embeddings; the dummy run's input_ids stay.
    seen = []

    class Talker(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, H)

        def embed_input_ids(self, ids):
            return self.emb(ids)

        def forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kw):
            seen.append((input_ids is not None, inputs_embeds is not None))
            return inputs_embeds if inputs_embeds is not None else self.emb(input_ids)

    model = Talker()
    runner = _v1_runner(model)
    buffer = torch.full((MAX_TOKENS, H), 7.0)  # what the last real step's preprocess left there
    runner.inputs_embeds = types.SimpleNamespace(gpu=buffer)
    runner.omni_hooks.uses_preprocess = True
    runner.load_model()
    out = runner._dummy_run(4)
    assert seen == [(True, True)]
    # the persistent buffer itself, unwritten: a FULL graph captured here reads what preprocess writes at replay
    assert torch.equal(out, torch.full((1, H), 7.0)) and torch.equal(buffer, torch.full((MAX_TOKENS, H), 7.0))
    real = torch.ones(3, H)
    assert torch.equal(model(input_ids=torch.zeros(3, dtype=torch.long), inputs_embeds=real), real)  # real steps kept
    runner.load_model()  # a reload: one adapter, no module hooks
    assert not model._forward_pre_hooks and not model._forward_hooks
    seen.clear()
    runner._dummy_run(2)
    assert seen == [(True, True)] and model.forward.__wrapped__.__func__ is Talker.forward

    plain = _v1_runner(OmniModel())  # a model without preprocess: vLLM's dummy inputs unchanged
    plain.omni_hooks.uses_preprocess = False
    plain.load_model()
    assert plain._omni_io._embeds_for_ids is None and not plain.model._forward_pre_hooks


# ------------------------------------------------------------------ async outputs
@pytest.fixture
def async_base():
    pytest.importorskip("vllm")
    from vllm.v1.outputs import AsyncModelRunnerOutput

    return AsyncModelRunnerOutput


def _runner_output(ids):
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(req_ids=list(ids), req_id_to_index={r: i for i, r in enumerate(ids)})


def test_v1_async_output_is_an_async_model_runner_output_with_its_own_step(async_base):
    """V1 under async scheduling: the executor unwraps by isinstance; the output
    read after the next step ran still carries its own step's outputs."""
    from core.hooks import OmniHooks
    from core.outputs import OmniModelRunnerOutput
    from core.runner import OmniV1RunnerMixin

    hooks = OmniHooks(types.SimpleNamespace(name="test"))  # no device op is reached here
    hooks.bind_model(object())
    steps = iter([torch.ones(1), torch.zeros(1)])

    class AsyncGPUModelRunnerOutput(async_base):
        def __init__(self, base):
            self.base = base

        def get_output(self):
            return self.base

    class Base:
        def sample_tokens(self, grammar_output):
            hooks.rows.add_item("a", "x", next(steps))
            return AsyncGPUModelRunnerOutput(_runner_output(["a"]))

    runner = type("R", (OmniV1RunnerMixin, Base), {"__init__": lambda self: None})()
    runner.omni_hooks = hooks
    first, second = runner.sample_tokens(None), runner.sample_tokens(None)
    assert isinstance(first, async_base) and isinstance(second, async_base)
    o1, o2 = first.get_output(), second.get_output()
    assert isinstance(o1, OmniModelRunnerOutput) and o1.multimodal_outputs["a"]["x"].tolist() == [1.0]
    assert o2.multimodal_outputs["a"]["x"].tolist() == [0.0]


def test_every_abstract_method_of_the_installed_base_is_delegated():
    """vLLM 0.33's AsyncModelRunnerOutput adds ``get_kv_connector_output``: the
    wrapper class is instantiable and delegates it, whatever the version adds."""

    class Base033(abc.ABC):
        @abc.abstractmethod
        def get_output(self): ...

        @abc.abstractmethod
        def get_kv_connector_output(self): ...

    class Inner(Base033):
        def get_output(self):
            return "out"

        def get_kv_connector_output(self):
            return "kv"

        extra = 7

    wrapped = omni_async_output_cls(Base033)(Inner(), lambda o: o.upper())
    assert isinstance(wrapped, Base033)
    assert wrapped.get_output() == "OUT" and wrapped.get_kv_connector_output() == "kv" and wrapped.extra == 7
    assert np.array_equal(sorted(Base033.__abstractmethods__), ["get_kv_connector_output", "get_output"])


def test_without_graphs_the_adapter_keeps_each_calls_own_tensors():
    """An engine without graphs (``persistent=False``): nothing replays a capture, so no copy into the
    buffers; the step's outputs are the forward's own tensors, and vLLM still gets a tensor back."""
    model = OmniModel()
    io = ModelOutputAdapter(model, MAX_TOKENS, keep_hidden=True, persistent=False)
    ids = torch.tensor([1, 2, 3])
    io.begin_step()
    out = model(ids)
    assert isinstance(out, torch.Tensor) and out.shape == (3, H)
    got = io.take(3)
    assert got.text_hidden_states.data_ptr() == out.data_ptr() and torch.equal(got.text_hidden_states, out)
    torch.testing.assert_close(got.multimodal_outputs["hidden"], out * 2)
    first = got.multimodal_outputs["hidden"]
    io.begin_step()
    model(ids[:1])
    assert io.take(1).multimodal_outputs["hidden"].data_ptr() != first.data_ptr()  # a new tensor, not a buffer
    torch.testing.assert_close(first, model.embed(ids).detach() * 2)  # the earlier one is untouched


def test_stored_outputs_survive_the_next_forward_when_to_host_returns_its_input():
    """On cpu ``Backend.to_host`` returns its input; the adapter's buffers are
    overwritten by the next forward, so the hooks must own what they keep."""
    from core.hooks import BatchView, OmniHooks

    hooks = OmniHooks(types.SimpleNamespace(name="cpu-like", to_host=lambda t: t))
    hooks.bind_model(object())
    model = OmniModel()
    io = ModelOutputAdapter(model, MAX_TOKENS)
    kept = []
    for step, ids in enumerate(([1, 2], [3, 4])):
        io.begin_step()
        h = model(torch.tensor(ids))
        batch = BatchView(["r"], np.array([0, 2]), np.array([2 * step]), np.array([1]))
        hooks.process_model_output(io.take(h), batch)
        kept.append(hooks.take_step_outputs()["r"]["hidden"])
    with torch.no_grad():
        torch.testing.assert_close(kept[0], model.embed(torch.tensor([1, 2])) * 2)


# ------------------------------------------------------- vLLM's own requests and scheduler
def test_vllms_warmup_requests_without_a_payload_skip_the_models_preprocess():
    """vLLM 0.26's V2 warm-up (``warmup_kernels``) schedules real requests
    (``_v2_mixed_warmup_*``) with plain SamplingParams: a model whose
    preprocess / postprocess need the request's state must not see them (seen
    on the H200); the rows of such a request keep vLLM's token embeddings."""
    pytest.importorskip("vllm")
    import numpy as np
    from vllm import SamplingParams

    from core.hooks import BatchView, OmniHooks
    from core.payloads import EXTRA_ARGS_KEY, pack

    class Talker:
        has_preprocess = has_postprocess = True

        def preprocess(self, input_ids, input_embeds, **info):
            if "thinker_hidden" not in info:
                raise ValueError("talker request needs 'thinker_hidden'")
            return input_ids, info["thinker_hidden"] * 2, {}

        def postprocess(self, hidden, multimodal_outputs=None, **info):
            if "thinker_hidden" not in info:
                raise ValueError("talker request needs 'thinker_hidden'")
            return {"seen": True}

    hooks = OmniHooks(types.SimpleNamespace(name="t", device=lambda: torch.device("cpu"), to_host=lambda t: t))
    hooks.bind_model(Talker())
    hooks.on_new_requests([("_v2_mixed_warmup_decode_", SamplingParams(max_tokens=2, temperature=0.0))])
    assert hooks.payloads.get("_v2_mixed_warmup_decode_") == {}
    user = SamplingParams(max_tokens=2, extra_args={EXTRA_ARGS_KEY: pack({"thinker_hidden": torch.ones(2, 3)})})
    hooks.on_new_requests([("u", user)])
    batch = BatchView(["_v2_mixed_warmup_decode_", "u"], np.array([0, 2, 4]), np.array([0, 0]), np.array([2, 2]))
    embeds = torch.full((4, 3), -1.0)
    hooks.preprocess(batch, torch.arange(4), embeds)
    assert (embeds[:2] == -1).all() and (embeds[2:] == 2).all()
    hooks.process_model_output(torch.zeros(4, 3), batch)
    assert hooks.payloads.get("u")["seen"] is True and "seen" not in hooks.payloads.get("_v2_mixed_warmup_decode_")
    hooks.on_new_requests([("bad", SamplingParams(extra_args={EXTRA_ARGS_KEY: pack({"voice": 1})}))])
    bad = BatchView(["bad"], np.array([0, 2]), np.array([0]), np.array([2]))
    with pytest.raises(ValueError, match="thinker_hidden"):  # a state the model rejects still fails loudly
        hooks.preprocess(bad, torch.arange(2), torch.zeros(2, 3))


def test_the_omni_scheduler_keeps_vllms_async_scheduling():
    """vLLM uses a custom ``scheduler_cls`` as given; one over plain
    ``Scheduler`` turns async scheduling (vLLM's CUDA default) off."""
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    import core.engine as engine

    def config(on):
        return types.SimpleNamespace(scheduler_config=types.SimpleNamespace(async_scheduling=on))

    assert engine.scheduler_base(config(True)) is AsyncScheduler
    assert engine.scheduler_base(config(False)) is Scheduler
    assert issubclass(engine.omni_scheduler_cls(AsyncScheduler), AsyncScheduler)
    built = []

    class Probe:
        def __init__(self, **kw):
            built.append(kw)

    orig = engine.omni_scheduler_cls
    engine.omni_scheduler_cls = lambda base: type("P", (Probe,), {"base": base})
    try:
        s = engine.OmniScheduler(vllm_config=config(True), kv_cache_config=None)
    finally:
        engine.omni_scheduler_cls = orig
    assert type(s).base is AsyncScheduler and built == [{"vllm_config": config(True), "kv_cache_config": None}]


def test_talker_mtp_is_graph_wrapped_only_when_the_engine_captures_graphs():
    """With ``enforce_eager`` (cudagraph_mode NONE) vLLM never calls
    ``capture_model``: a graph-wrapped MTP head would capture mid-step."""
    pytest.importorskip("vllm")
    from vllm.config import CUDAGraphMode

    from core.hooks import OmniHooks

    wrapped = []
    backend = types.SimpleNamespace(
        name="graphs", capabilities=lambda: types.SimpleNamespace(talker_mtp_graph=True),
        wrap_graph=lambda fn, cfg, mode: wrapped.append(mode) or fn, device=lambda: torch.device("cpu"))

    class Talker:
        talker_mtp_graph_safe = True
        mtp_hidden_size = H

        def talker_mtp(self, input_ids, input_embeds, last_talker_hidden, text_step, **sampling):
            return input_embeds, input_ids[:, None]

    for mode, expect in ((CUDAGraphMode.NONE, "eager"), (CUDAGraphMode.PIECEWISE, "graph"),
                         (CUDAGraphMode.FULL_AND_PIECEWISE, "graph")):
        hooks = OmniHooks(backend)
        hooks.bind_model(Talker(), types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=mode)))
        assert hooks.mtp_mode == expect, mode
    assert wrapped == [CUDAGraphMode.FULL, CUDAGraphMode.FULL]


def test_talker_mtp_graphs_are_captured_once_whichever_seam_vllm_reaches():
    """vLLM >= 0.32's V2 runner calls ``ModelState.capture_inner_cudagraphs``;
    0.26's never does, so the first real decode step captured on the default
    stream (seen on the H200). The V2 runner's ``capture_model`` captures what
    the state did not, exactly once."""
    pytest.importorskip("vllm")
    import contextlib

    from core.hooks import TalkerMTP
    from core.runner.model_state import OmniModelStateMixin
    from core.runner.v2 import OmniV2RunnerMixin

    calls = []
    backend = types.SimpleNamespace(graph_capture_context=lambda device: contextlib.nullcontext())

    def head(input_ids, input_embeds, last_talker_hidden, text_step, **sampling):
        calls.append(input_ids.shape[0])
        return input_embeds, input_ids[:, None]

    for state_captures in (False, True):  # 0.26, then >= 0.32
        calls.clear()
        mtp = TalkerMTP(head, 4, H, torch.float32, torch.device("cpu"), sizes=[1, 2, 4])
        state = OmniModelStateMixin.__new__(OmniModelStateMixin)
        state.talker_mtp, state.backend, state.device = mtp, backend, torch.device("cpu")

        class V2Base:
            def capture_model(self, **kw):
                if state_captures and not kw.get("profile_only"):
                    from core.hooks.graphs import capture_talker_mtp

                    capture_talker_mtp(state.talker_mtp, state.backend, state.device)
                return 3

        runner = type("V2", (OmniV2RunnerMixin, V2Base), {"omni_backend": backend})()
        runner.model_state, runner.device = state, torch.device("cpu")
        assert runner.capture_model() == 3
        assert calls == [4, 2, 1] and mtp.captured, state_captures  # once, largest first
        mtp(torch.zeros(1, dtype=torch.int64), torch.zeros(1, H), torch.zeros(1, H), torch.zeros(1, H))
        assert mtp.replays == 1
    calls.clear()
    mtp = TalkerMTP(head, 4, H, torch.float32, torch.device("cpu"), sizes=[1, 2, 4])
    state.talker_mtp = mtp
    runner.capture_model(profile_only=True)  # vLLM 0.33's memory profiling pass captures nothing
    assert calls == [] and not mtp.captured


def test_vllms_warmup_requests_reach_a_generation_kind_runner_unrefused():
    """vLLM 0.26's warm-up schedules ``_warmup_0_`` with max_tokens=16 through a
    code2wav (generation-kind) engine: the engine failed to start on the H200."""
    pytest.importorskip("vllm")
    from vllm import SamplingParams

    from core.hooks import OmniHooks
    from core.kinds import GENERATION
    from core.payloads import EXTRA_ARGS_KEY, pack

    hooks = OmniHooks(types.SimpleNamespace(name="t", device=lambda: torch.device("cpu")), GENERATION)
    hooks.bind_model(object())
    hooks.on_new_requests([("_warmup_0_", SamplingParams(max_tokens=16))])
    with pytest.raises(ValueError, match="max_tokens=1"):  # a user request with a payload is still refused
        hooks.on_new_requests([("u", SamplingParams(max_tokens=4, extra_args={EXTRA_ARGS_KEY: pack({"codes": 1})}))])


def test_a_call_with_other_inputs_than_the_first_is_refused_with_why():
    from core.model_io import ModelCallSignatureError

    model = OmniModel()
    ModelOutputAdapter(model, MAX_TOKENS)
    ids = torch.tensor([1, 2, 3])
    model(input_ids=ids, positions=None)  # the first call (vLLM's profile run) fixes the signature
    model(ids)  # positionally: the same inputs
    model(ids, None, None, None)
    with pytest.raises(ModelCallSignatureError, match=r"OmniModel was called with input_ids=tensor, "
                                                      r"inputs_embeds=tensor after a first call with "
                                                      r"input_ids=tensor, inputs_embeds=None.*drops Dynamo's guards"):
        model(input_ids=ids, inputs_embeds=torch.zeros(3, H))

    class EmbedsModel(OmniModel):
        def forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kw):
            h = inputs_embeds if inputs_embeds is not None else self.embed(input_ids)
            return OmniOutput(text_hidden_states=h, multimodal_outputs={})

    other = EmbedsModel()
    ModelOutputAdapter(other, MAX_TOKENS)
    other(input_ids=None, inputs_embeds=torch.zeros(3, H))
    with pytest.raises(ModelCallSignatureError, match="input_ids=tensor, inputs_embeds=None after a first call "
                                                      "with input_ids=None, inputs_embeds=tensor"):
        other(input_ids=ids)


def test_a_call_without_request_state_gets_the_models_dummy_state():
    """vLLM's dummy runs (profile, warm-up, capture) call the model without per-request state; a model that
    declares vLLM-Omni's ``get_dummy_runtime_additional_information`` gets its own dummy state for one request
    there (as vLLM-Omni's generation runner passes it), a real step's state is left as it is, and a model without
    the hook is called unchanged."""

    class Stateful(OmniModel):
        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, input_ids=None, positions=None, **kwargs):
            self.seen.append(kwargs.get("runtime_additional_information"))
            return super().forward(input_ids=input_ids, positions=positions)

        def get_dummy_runtime_additional_information(self, num_reqs):
            return [{"meta": {"request_id": f"dummy-{i}", "finished": True}} for i in range(num_reqs)]

    model = Stateful()
    ModelOutputAdapter(model, MAX_TOKENS)
    ids, pos = torch.arange(3), torch.arange(3)
    model(input_ids=ids, positions=pos)  # a dummy run
    real = [{"meta": {"request_id": "utt"}}]
    model(input_ids=ids, positions=pos, runtime_additional_information=real, model_intermediate_buffer=real)
    assert model.seen == [[{"meta": {"request_id": "dummy-0", "finished": True}}], real]
    plain = OmniModel()
    ModelOutputAdapter(plain, MAX_TOKENS)
    plain(input_ids=ids, positions=pos)  # no hook: called as vLLM called it
