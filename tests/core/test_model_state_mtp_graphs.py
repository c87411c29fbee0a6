"""The talker MTP under graphs (core.hooks.TalkerMTP, the V2 runner's ``capture_model`` seam): padding to the
capture sizes on fixed input addresses under a simulated graph wrapper (a recorder keyed on vLLM's forward
context, checking input addresses the way ``CUDAGraphWrapper`` does in debug mode), the capture after vLLM's, and
on a device with static graphs (``pytest --device cuda``) real graph replay equal to eager.
Fakes: ``tests/core/v2_fakes.py``.
"""

from __future__ import annotations

import functools
import types

import pytest

torch = pytest.importorskip("torch")

from tests.core.v2_fakes import H, MAX_REQS, VOCAB, TinyTalker, needs_vllm  # noqa: E402


# ------------------------------------------------------------ static MTP
class RecordingGraphWrapper:
    """Simulated graph wrapper: like vLLM's ``CUDAGraphWrapper`` it dispatches
    on the forward context's ``batch_descriptor`` and (in debug mode) asserts
    that a replay sees the capture's input addresses."""

    def __init__(self, runnable):
        self.runnable, self.entries, self.events = runnable, {}, []

    def __call__(self, ids, embeds, last, text, **sampling):
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context

        ctx = get_forward_context()
        assert ctx.cudagraph_runtime_mode == CUDAGraphMode.FULL
        key = ctx.batch_descriptor
        addrs = tuple(t.data_ptr() for t in (ids, embeds, last, text)) + (tuple(embeds.shape),)
        if key not in self.entries:
            self.entries[key] = addrs
            self.events.append(("capture", key.num_tokens))
        else:
            assert self.entries[key] == addrs, "replay with other input addresses than the capture"
            self.events.append(("replay", key.num_tokens))
        return self.runnable(ids, embeds, last, text, **sampling)


@needs_vllm
def test_static_mtp_pads_to_capture_sizes_on_fixed_addresses(vllm_config, cpu_selected):
    from core.hooks import TalkerMTP
    from core.hooks.graphs import mtp_graph_context
    from omni_backends.backend import capture_sizes

    head = TinyTalker().talker_mtp
    wrapper = RecordingGraphWrapper(head)
    context = functools.partial(mtp_graph_context, cpu_selected, vllm_config)  # what the V1 and V2 runners pass

    sizes = capture_sizes(MAX_REQS)
    static = TalkerMTP(wrapper, MAX_REQS, H, torch.float32, torch.device("cpu"), eager=head, sizes=sizes,
                       context=context)
    assert static.capture() == len(sizes)
    assert wrapper.events == [("capture", p) for p in reversed(sizes)]
    g = torch.Generator().manual_seed(5)
    for n in (1, 3, 8, 2):
        rows = (torch.randint(0, VOCAB, (n,), generator=g), torch.randn(n, H, generator=g),
                torch.randn(n, H, generator=g), torch.zeros(n, H))
        embeds, codes = static(*rows)
        p = static.padded(n)
        assert wrapper.events[-1] == ("replay", p) and p >= n and p in sizes
        want_e, want_c = head(*rows)
        assert codes.tolist() == want_c.tolist()
        torch.testing.assert_close(embeds, want_e)
        assert not static.last_talker_hidden[n:p].any() and not static.input_ids[n:p].any()
        assert codes.data_ptr() != static.out_codes.data_ptr()
    with pytest.raises(ValueError, match="max_num_reqs=8"):
        static(torch.zeros(9, dtype=torch.int64), torch.zeros(9, H), torch.zeros(9, H), torch.zeros(9, H))
    with pytest.raises(ValueError, match="do not reach max_num_reqs"):
        TalkerMTP(head, 16, H, torch.float32, torch.device("cpu"), sizes=[1, 2, 4])


@needs_vllm
def test_v2_runner_captures_the_talker_mtp_after_vllms_captures(vllm_config, cpu_selected):
    """vLLM 0.26's V2 runner never calls ``ModelState.capture_inner_cudagraphs``: the talker MTP's graphs are
    captured in the runner's ``capture_model`` (the V1 runner's seam too), with vLLM's capture switch on and
    restored; the stats count the graphs and the replays after."""
    import contextlib

    import vllm.compilation.monitor as monitor

    from core.hooks import TalkerMTP
    from core.hooks.graphs import mtp_graph_context
    from core.runner.v2 import OmniV2RunnerMixin
    from omni_backends.backend import capture_sizes

    head = TinyTalker().talker_mtp
    wrapper = RecordingGraphWrapper(head)
    seen = []

    class Backend:  # the cpu driver plus a recorded capture context
        @contextlib.contextmanager
        def graph_capture_context(self, device):
            seen.append(("context", monitor.cudagraph_capturing_enabled))
            yield

    context = functools.partial(mtp_graph_context, cpu_selected, vllm_config)
    sizes = capture_sizes(MAX_REQS)
    static = TalkerMTP(wrapper, MAX_REQS, H, torch.float32, torch.device("cpu"), eager=head, sizes=sizes,
                       context=context)

    class Base:  # the V2 GPUModelRunner's capture_model, as far as the seam sees it
        device = torch.device("cpu")
        model_state = types.SimpleNamespace(talker_mtp=static, backend=Backend())

        def capture_model(self):
            seen.append("vllm")
            return 7

    runner = type("R", (OmniV2RunnerMixin, Base), {"omni_backend": Backend()})()
    monitor.set_cudagraph_capturing_enabled(False)
    try:
        assert static.graph_stats() == {"sizes": sizes, "captured": 0, "replays": 0, "seeded": 0,
                                        "eager_seeded": 0}
        assert runner.capture_model() == 7
        assert seen == ["vllm", ("context", True)]  # after vLLM's captures, capturing switched on
        assert monitor.cudagraph_capturing_enabled is False  # ... and back as it was
    finally:
        monitor.set_cudagraph_capturing_enabled(True)
    assert wrapper.events == [("capture", p) for p in reversed(sizes)]
    static(torch.zeros(3, dtype=torch.int64), torch.zeros(3, H), torch.zeros(3, H), torch.zeros(3, H))
    assert wrapper.events[-1] == ("replay", 4)
    assert static.graph_stats() == {"sizes": sizes, "captured": len(sizes), "replays": 1, "seeded": 0,
                                    "eager_seeded": 0}
    eager = TalkerMTP(head, MAX_REQS, H, torch.float32, torch.device("cpu"))
    assert eager.graph_stats() is None


# ------------------------------------------------- device level (real graphs)
@pytest.fixture
def graph_device(backend, capabilities):
    """The ``--device`` driver (the kit's ``backend``: skips where its device is absent) when it has static
    graphs (the H200: ``pytest --device cuda``); skips otherwise."""
    if not capabilities.static_graphs:
        pytest.skip(f"driver {backend.name!r} has no static graphs: the talker MTP runs eager there")
    return backend


@pytest.mark.device_tier
def test_static_mtp_under_real_graph_replay_equals_eager(graph_device):
    """Device level: :class:`core.hooks.TalkerMTP` (vLLM-Omni's four-input form)
    feeding one captured graph per capture size (the driver's torch-level graph
    primitive, shared pool, address check on every replay, as vLLM's
    CUDAGraphWrapper does in debug mode); each step's embeds and codes equal the
    eager head's on the same rows."""
    from core.hooks import TalkerMTP
    from omni_backends.backend import capture_sizes
    from bench.static_graph import StaticGraph

    dev, hidden_size, vocab, max_reqs = graph_device.device(), 256, 512, 24
    torch.manual_seed(0)
    heads = torch.nn.ModuleList(torch.nn.Linear(hidden_size, vocab, bias=False) for _ in range(3)).to(dev)
    code_embed = torch.nn.Embedding(vocab, hidden_size).to(dev)

    @torch.no_grad()
    def head(ids, embeds, last_hidden, text_step, **sampling):  # greedy residual codebooks, shape-static
        x = last_hidden + code_embed(ids)
        codes, out = [ids], embeds + text_step
        for h in heads:
            code = h(x).argmax(-1)
            codes.append(code)
            x = x + code_embed(code)
            out = out + code_embed(code)
        return out, torch.stack(codes, -1)

    pool = graph_device.graph_pool_handle()
    graphs: dict[int, StaticGraph] = {}

    def graphed(*inputs, **sampling):
        p = inputs[0].shape[0]
        if p not in graphs:
            graphs[p] = StaticGraph(graph_device, head, inputs, pool=pool, debug=True)
            return graphs[p].outputs
        return graphs[p].replay(*inputs)  # raises if the inputs are not the captured buffers

    sizes = capture_sizes(max_reqs)
    static = TalkerMTP(graphed, max_reqs, hidden_size, torch.float32, dev, eager=head, sizes=sizes)
    assert static.capture() == len(sizes) == len(graphs)
    g = torch.Generator(device=dev).manual_seed(1)
    checked = 0
    for step in range(40):
        n = 1 + (step * 7) % max_reqs
        rows = (torch.randint(0, vocab, (n,), device=dev, generator=g),
                torch.randn(n, hidden_size, device=dev, generator=g),
                torch.randn(n, hidden_size, device=dev, generator=g),
                torch.randn(n, hidden_size, device=dev, generator=g))
        embeds, codes = static(*rows)
        want_e, want_c = head(*rows)
        assert torch.equal(codes, want_c), f"step {step}: n={n} padded to {static.padded(n)}"
        torch.testing.assert_close(embeds, want_e)
        checked += n
    graph_device.synchronize()
    assert checked > 300 and static.out_codes.shape == (max_reqs, 4)


