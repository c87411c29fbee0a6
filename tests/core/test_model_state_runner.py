"""The omni V2 runner seam (core.runner.model_state ``OmniV2RunnerMixin``) and V1/V2 parity.

The parity test spies on :class:`core.hooks.OmniHooks` and runs one synthetic batch through the V1 seams
(``OmniV1RunnerMixin`` over a small base playing vLLM's V1 runner) and the V2 state (a small base calling the
state in the V2 runner's order): the same hook methods are called on the same batches and the multimodal outputs
are equal. Also: async outputs keep their own step, a model without the omni state is refused, the V2 runner
class over the driver's V2 base. Fakes: ``tests/core/v2_fakes.py``.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from core.kinds import AR, GENERATION  # noqa: E402
from tests.core.v2_fakes import (  # noqa: E402
    COMPUTED, H, IDS, MAX_REQS, MAX_TOKENS, NUM_TOKENS, PROMPT, TinyTalker, add_all, greedy_inner, input_batch,
    StockLike, make_state, needs_vllm, new_request, omni_sampler, payloads,
)
from omni_backends.registry import get_backend  # noqa: E402



# ------------------------------------------------ V1 and V2: the same hooks
PROTOCOL = ("on_new_requests", "on_finished_requests", "needs_embeds", "prepare_prefill_embeds", "preprocess",
            "build_extra_kwargs", "process_model_output", "run_talker_mtp", "get_model_runner_output")


def _summary(value):
    from core.hooks import BatchView

    if isinstance(value, BatchView):
        ints = [tuple(np.asarray(v).tolist()) for v in (value.query_start_loc, value.num_computed, value.num_prompt)]
        return ("batch", tuple(value.req_ids), *ints)  # each a numpy array or a list (BatchView)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape))
    return type(value).__name__


@pytest.fixture
def spy(monkeypatch):
    from core.hooks import OmniHooks

    calls: list[tuple] = []
    for name in PROTOCOL:
        orig = getattr(OmniHooks, name)

        def wrapper(self, *args, _orig=orig, _name=name, **kwargs):
            args = list(args)
            if _name in ("on_new_requests", "on_finished_requests"):
                args[0] = list(args[0])
                for item in args[0]:
                    calls.append((_name, item[0] if isinstance(item, tuple) else item))
            else:
                calls.append((_name, *[_summary(a) for a in args if not isinstance(a, dict)]))
            return _orig(self, *args, **kwargs)

        monkeypatch.setattr(OmniHooks, name, wrapper)
    return calls


def _runner_output(ids):
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(req_ids=list(ids), req_id_to_index={r: i for i, r in enumerate(ids)})


def _v1_step(model, pl, b):
    """One step through the V1 seams (OmniV1RunnerMixin over a base that plays
    vLLM's V1 runner: its methods return what V1's return)."""
    from vllm.v1.sample.sampler import Sampler

    from core.runner import OmniV1RunnerMixin

    new = [types.SimpleNamespace(req_id=r, sampling_params=new_request(r, PROMPT[r], pl[r]).sampling_params) for r in IDS]

    class V1Base:
        def __init__(self, *a, **k):
            self.input_batch = types.SimpleNamespace(
                num_reqs=len(IDS), req_ids=list(IDS), num_computed_tokens_cpu=np.array(COMPUTED, np.int32),
                num_prompt_tokens=np.array([PROMPT[r] for r in IDS], np.int32))
            self.query_start_loc = types.SimpleNamespace(np=b.query_start_loc_np.copy())
            self.inputs_embeds = types.SimpleNamespace(gpu=torch.zeros(MAX_TOKENS, H))
            self.model = model
            self.max_num_tokens, self.max_num_reqs, self.dtype = MAX_TOKENS, MAX_REQS, torch.float32
            self.device = torch.device("cpu")
            self.model_config = types.SimpleNamespace(get_hidden_size=lambda: H)
            self.requests = {}
            self.sampler = Sampler(logprobs_mode="raw_logprobs")  # what vLLM's V1 runner builds in __init__
            self.input_batch.sampling_metadata = None

        def load_model(self):
            pass

        def get_model(self):
            return model

        def _update_states(self, so):
            return None

        def _preprocess(self, so, n, it=None):
            return b.input_ids[:n], None, None, None, {}, None

        def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kw):
            return model(input_ids, positions, intermediate_tensors, inputs_embeds, **kw)

        def _sample(self, logits, spec):
            self._so = greedy_inner()(logits, b)
            return self._so

        def sample_tokens(self, grammar_output):
            return _runner_output(IDS)

    runner = type("V1", (OmniV1RunnerMixin, V1Base), {"omni_backend": get_backend()})()
    runner.vllm_config = None
    runner.load_model()
    runner._update_states(types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new))
    ids, embeds, pos, it, kw, _ = runner._preprocess(None, NUM_TOKENS)
    hidden = runner._model_forward(ids, pos, it, embeds, **kw)
    runner._sample(model.compute_logits(hidden[b.logits_indices]), None)
    out = runner.sample_tokens(None)
    runner._update_states(types.SimpleNamespace(finished_req_ids={"mid"}, scheduled_new_reqs=[]))
    runner._omni_io.remove()  # the V2 step reuses this model instance: one output adapter per model
    return out


def _v2_step(vllm_config, model, pl, b):
    """One step through the V2 state, in the V2 runner's order, with the
    runner's one omni seam (``OmniV2RunnerMixin.sample_tokens``)."""
    from vllm.v1.worker.gpu.model_states import init_model_state

    from core.runner.model_state import OmniSampler
    from core.runner.v2 import OmniV2RunnerMixin

    state = init_model_state(vllm_config, model, None, torch.device("cpu"))  # what vLLM's load_model builds

    class V2Base:
        def load_model(self):
            self.model_state = state
            self.sampler = greedy_inner()

        def get_model(self):
            return model

        def execute_model(self):
            self.rs = add_all(state, pl)
            inputs = {"input_ids": b.input_ids, "positions": None, "intermediate_tensors": None, "inputs_embeds": None,
                      **state.prepare_inputs(b, self.rs)}
            self.hidden = model(**inputs)

        def sample_tokens(self, grammar_output):
            self.sampler(model.compute_logits(self.hidden[b.logits_indices]), b)  # the runner's (now omni) sampler
            return _runner_output(IDS)

    runner = type("V2", (OmniV2RunnerMixin, V2Base), {"omni_backend": get_backend(), "vllm_config": vllm_config})()
    assert runner.omni_hooks is None  # before load_model
    runner.load_model()
    assert runner.omni_hooks is state.omni_hooks is not None  # composed; what the worker's omni_state RPC reads
    assert isinstance(runner.sampler, OmniSampler) and runner.sampler.state is state
    runner.execute_model()
    out = runner.sample_tokens(None)
    state.remove_request("mid")
    return out


@needs_vllm
def test_v1_and_v2_call_the_same_hooks_with_the_same_batches(vllm_config, spy):
    from core.outputs import OmniModelRunnerOutput

    model, pl, b = TinyTalker(), payloads(), input_batch()
    out1 = _v1_step(model, pl, b)
    v1_calls = list(spy)
    spy.clear()
    out2 = _v2_step(vllm_config, model, pl, b)
    v2_calls = list(spy)
    assert [c[0] for c in v1_calls] == [c[0] for c in v2_calls]
    assert v1_calls == v2_calls
    assert {c[0] for c in v1_calls} == set(PROTOCOL)  # every hook of the protocol ran
    assert isinstance(out1, OmniModelRunnerOutput) and isinstance(out2, OmniModelRunnerOutput)
    assert out1.multimodal_outputs.keys() == out2.multimodal_outputs.keys() == set(IDS)
    for r in IDS:
        a, c = out1.multimodal_outputs[r], out2.multimodal_outputs[r]
        assert a.keys() == c.keys()
        for k in a:
            torch.testing.assert_close(a[k], c[k], rtol=0, atol=0)


@needs_vllm
def test_v2_runner_seam_converts_async_output_with_its_own_step(cpu_selected):
    """An async output read after the next step ran still gets its own step's
    outputs, and is an ``AsyncModelRunnerOutput`` (what vLLM's executors unwrap)."""
    from vllm.v1.outputs import AsyncModelRunnerOutput

    from core.hooks import OmniHooks
    from core.runner.v2 import OmniV2RunnerMixin
    from core.outputs import OmniModelRunnerOutput

    hooks = OmniHooks(cpu_selected)
    hooks.bind_model(object())
    steps = iter([torch.ones(1), torch.zeros(1)])

    class Async(AsyncModelRunnerOutput):  # vLLM's AsyncOutput: no req_ids until get_output()
        def __init__(self, base):
            self.base = base

        def get_output(self):
            return self.base

    class Base:
        def sample_tokens(self, grammar_output):
            hooks.rows.add_item("a", "x", next(steps))  # what this step's hooks produced
            return Async(_runner_output(["a"]))

    runner = type("R", (OmniV2RunnerMixin, Base), {})()
    runner.model_state = types.SimpleNamespace(omni_hooks=hooks)
    first = runner.sample_tokens(None)
    second = runner.sample_tokens(None)  # the next step runs before the first output is read
    assert isinstance(first, AsyncModelRunnerOutput) and isinstance(second, AsyncModelRunnerOutput)
    o1, o2 = first.get_output(), second.get_output()
    assert isinstance(o1, OmniModelRunnerOutput) and isinstance(o2, OmniModelRunnerOutput)
    assert o1.multimodal_outputs["a"]["x"].tolist() == [1.0] and o2.multimodal_outputs["a"]["x"].tolist() == [0.0]


@needs_vllm
def test_v2_runner_keeps_vllms_state_and_sampler_for_a_stock_model(vllm_config, cpu_selected):
    """A stock vLLM class (no omni contract, vLLM's own forward) runs exactly as on stock V2: the state vLLM
    built stays, unchanged, and so does the sampler; only the output seam has hooks (with no outputs)."""
    from vllm.v1.worker.gpu.model_states import init_model_state
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.hooks.contract import needs_omni_hooks
    from core.runner.v2 import OmniV2RunnerMixin

    model = StockLike()
    assert not needs_omni_hooks(model, AR) and needs_omni_hooks(model, GENERATION)
    assert needs_omni_hooks(TinyTalker(), AR)
    state = init_model_state(vllm_config, model, None, torch.device("cpu"))
    inner = greedy_inner()

    from vllm.v1.outputs import AsyncModelRunnerOutput

    class Async(AsyncModelRunnerOutput):  # what V2's sample_tokens returns at every step
        def get_output(self):
            return _runner_output(IDS)

    vllm_out = Async()

    class Base:
        def load_model(self):
            self.model_state, self.sampler = state, inner

        def sample_tokens(self, grammar_output):
            return vllm_out

    runner = type("R", (OmniV2RunnerMixin, Base), {"omni_backend": cpu_selected, "vllm_config": vllm_config})()
    runner.load_model()
    assert type(runner.model_state) is DefaultModelState and runner.sampler is inner
    assert runner.omni_hooks is not None and runner.omni_hooks.take_step_outputs() == {}
    # its step's output is vLLM's own object, unwrapped (as V1 returns a stock model's): no per-step omni work
    assert runner.sample_tokens(None) is vllm_out


@needs_vllm
def test_v2_runner_refuses_a_state_it_cannot_compose_naming_both_classes_and_leaves_it_as_built(
        vllm_config, cpu_selected):
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from core.runner.model_state import ModelStateCompositionError
    from core.runner.v2 import OmniV2RunnerMixin

    class ClashingState(DefaultModelState):  # a platform / model state with its own, different on_sampled hook
        def on_sampled(self, *a):
            return "mine"

    class NotAState:
        model = TinyTalker()

    class StateSettingTalkerMTP(DefaultModelState):  # its __init__ sets an attribute the omni hooks set too
        def __init__(self, *a):
            super().__init__(*a)
            self.talker_mtp = "mine"

    for built, why in ((NotAState(), "not a subclass of vLLM's"), (None, "defines on_sampled"),
                       ("instance", "instance sets talker_mtp")):
        if built is None:
            built = ClashingState(vllm_config, TinyTalker(), None, torch.device("cpu"))
        elif built == "instance":
            built = StateSettingTalkerMTP(vllm_config, TinyTalker(), None, torch.device("cpu"))
        before, cls = dict(vars(built)), type(built)

        class Base:
            def load_model(self, built=built):
                self.model_state, self.sampler = built, greedy_inner()

        runner = type("R", (OmniV2RunnerMixin, Base), {"omni_backend": cpu_selected, "vllm_config": vllm_config})()
        with pytest.raises(ModelStateCompositionError, match=rf"OmniModelStateMixin\) with the model state "
                                                             rf".*{cls.__name__}: it.*{why}.*VLLM_USE_V2_MODEL_RUNNER=0"):
            runner.load_model()
        assert type(built) is cls and vars(built) == before and not hasattr(runner.sampler, "state")


# ------------------------------------------------------- runner bases
@needs_vllm
def test_build_runner_class_v2_on_the_cpu_driver_is_a_clear_error(cpu_selected):
    from core.runner import build_runner_class
    from omni_backends.errors import OmniBackendError

    with pytest.raises(OmniBackendError, match=r"driver 'cpu' cannot run it .*VLLM_USE_V2_MODEL_RUNNER=0"):
        build_runner_class(cpu_selected, AR, v2=True)
    with pytest.raises(OmniBackendError, match="needs a Triton CPU backend"):
        cpu_selected.model_runner_base(v2=True)


@needs_vllm
def test_v2_runner_class_is_the_seam_over_the_drivers_v2_base():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from core.runner.v2 import OmniV2RunnerMixin, v2_runner_class

    backend = object()
    cls = v2_runner_class(GPUModelRunner, GENERATION, backend)
    assert cls.__mro__[1:3] == (OmniV2RunnerMixin, GPUModelRunner)
    assert cls.__name__ == "OmniGenerationGPUModelRunner" and cls.omni_backend is backend
    assert cls.omni_kind == GENERATION
    assert v2_runner_class(GPUModelRunner, GENERATION, backend) is cls
    overridden = {n for n in vars(OmniV2RunnerMixin) if not n.startswith("__")}
    # no execute_model / _dummy_run copy
    assert overridden == {"load_model", "sample_tokens", "capture_model", "initialize_kv_cache", "omni_hooks", "omni_kind",
                          "_omni_output_hooks"}


