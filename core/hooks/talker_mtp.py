"""The talker MTP in vLLM-Omni's form: before the forward, on decode rows, on persistent buffers.

``model.talker_mtp(input_ids [p], input_embeds [p, H], last_talker_hidden [p, H],
text_step [p, H], do_sample=, temperature=, top_k=, top_p=, generator= | generators=)
-> (embeds [p, H], codes [p, Q])`` (vllm-omni 0.30.0,
``worker/gpu_model_runner.py:_talker_mtp_forward``). :class:`TalkerMTP` calls it
on slices ``[:p]`` of buffers allocated once, ``H = model.mtp_hidden_size``
(vLLM-Omni's ``talker_mtp_input_ids`` / ``talker_mtp_inputs_embeds`` /
``last_talker_hidden`` / ``text_step``), and copies the results into persistent
outputs, so a FULL graph the Backend captured for ``p`` stays valid
(``sizes``: the capture sizes; ``p`` is the smallest one >= the rows, rows past
them zeroed).

Seeds (vLLM-Omni's ``tts_local_seed``: the same seed gives the same codes whatever else is in the batch) and
graphs: a head that takes its sampling noise as an input (the model declares vLLM-Omni's
``mtp_sample_uniforms`` with ``mtp_sample_steps`` and ``mtp_sample_vocab_size``; Qwen3-TTS's
``talker_mtp(..., sample_uniforms=[p, steps, vocab] float32)`` samples each residual code by Gumbel-max
``argmax(logits - log(-log(u)))`` over them) is given a persistent buffer ``sample_uniforms`` ``[max_num_reqs,
steps, vocab]`` on every call, seeded or not, eager or graph: the uniforms in ``(1e-20, 1 - 1e-20)`` are drawn
*outside* the head, each seeded row's ``[1, steps, vocab]`` from its own generator (one draw per row per call,
so a row's noise does not depend on the batch), the other rows and the padding from the default generator. The
captured graph reads the buffer like its other inputs, so a seeded row replays the same graph as an unseeded
one. This is vLLM-Omni 0.30's V2 model state's way (``OmniModelState._prepare_mtp_sample_uniforms``: the same
draws, so a seed gives the codes vLLM-Omni's V2 runner gives); its V1 runner instead leaves the graph for seeded
rows. Chosen by reading the code: the head's sampler is the only consumer of randomness, it already takes the
noise as a tensor, and the alternative (replaying the graph per residual step with sampling outside) would
split the captured head into ``steps`` graphs with a host round per step. A head without the declaration
(e.g. vLLM-Omni's Qwen3-Omni talker) keeps vLLM-Omni's V1 rule: a call carrying per-request generators runs
the unwrapped head (a graph would freeze the generator).
"""

from __future__ import annotations

import bisect
import contextlib
from typing import Any, Callable, ContextManager, Sequence

import torch

#: the open interval of the sampling uniforms (vLLM-Omni's ``qwen3_code_predictor._UNIFORM_EPS``): ``log(-log(u))``
#: stays finite
UNIFORM_LOW, UNIFORM_HIGH = 1e-20, 1.0 - 1e-20


class TalkerMTP:
    """The model's ``talker_mtp`` on persistent buffers (see the module docstring).

    ``mtp``: the head as the runner calls it (possibly ``Backend.wrap_graph``-ed);
    ``eager``: the unwrapped head (for calls with generators). ``context(p)``
    is entered around a call on ``p`` rows (the forward context that selects
    the graph). Raises ``ValueError`` for more rows than ``max_num_reqs``.
    :meth:`use_sample_uniforms` gives a head that takes its sampling noise the
    ``sample_uniforms`` buffer (seeded rows then stay on the graph).
    """

    def __init__(self, mtp: Callable[..., Any], max_num_reqs: int, hidden_size: int, dtype: torch.dtype,
                 device: Any, *, eager: Callable[..., Any] | None = None, sizes: list[int] | None = None,
                 context: Callable[[int], ContextManager[Any]] | None = None,
                 count_graphs: Callable[[Any], int | None] | None = None) -> None:
        self.mtp = mtp
        self.eager = eager or mtp
        self.max_num_reqs = max_num_reqs
        self.hidden_size = hidden_size
        self.sizes = sorted(set(sizes)) if sizes else None
        if self.sizes and self.sizes[-1] < max_num_reqs:
            raise ValueError(f"capture sizes {self.sizes} do not reach max_num_reqs={max_num_reqs}")
        self.context = context
        self.count_graphs = count_graphs  # Backend.captured_graphs: graphs the wrapped head holds
        self.input_ids = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        self.input_embeds = torch.zeros(max_num_reqs, hidden_size, dtype=dtype, device=device)
        self.last_talker_hidden = torch.zeros(max_num_reqs, hidden_size, dtype=dtype, device=device)
        self.text_step = torch.zeros(max_num_reqs, hidden_size, dtype=dtype, device=device)
        self.out_embeds: torch.Tensor | None = None
        self.out_codes: torch.Tensor | None = None
        #: ``[max_num_reqs, steps, vocab]`` float32: the head's sampling noise (:meth:`use_sample_uniforms`)
        self.sample_uniforms: torch.Tensor | None = None
        #: calls on the graph-capable path that carried a seeded row (the stats' ``seeded_replays``)
        self.seeded = 0
        #: calls that ran the unwrapped head because of generators (a head without ``sample_uniforms``)
        self.eager_seeded = 0
        #: graphs captured (one per size); graph replays after capture
        self.captured = 0
        self.replays = 0

    def use_sample_uniforms(self, steps: int, vocab: int) -> None:
        """Give the head its sampling noise as ``sample_uniforms=`` ``[p, steps, vocab]`` float32 (vLLM-Omni's
        ``mtp_sample_uniforms`` / ``mtp_sample_steps`` / ``mtp_sample_vocab_size``), drawn per row outside the
        head on every call (the module docstring). Call before :meth:`capture`; raises ``ValueError`` for a
        non-positive size or after capture (the graphs would not read the buffer)."""
        if steps <= 0 or vocab <= 0:
            raise ValueError(f"sample uniforms need positive steps and vocab, got steps={steps}, vocab={vocab}")
        if self.captured:
            raise ValueError("use_sample_uniforms after capture: the captured graphs do not read the buffer")
        self.sample_uniforms = torch.full((self.max_num_reqs, steps, vocab), 0.5, dtype=torch.float32,
                                          device=self.input_ids.device)

    def draw_uniforms(self, n: int, p: int, generators: Sequence[torch.Generator | None] | None) -> None:
        """Fill ``sample_uniforms[:p]``: row ``i < n`` from ``generators[i]`` (one ``[1, steps, vocab]`` draw, so
        the same seed draws the same noise whatever the batch), rows without one and the padding rows ``n..p``
        from the default generator (one draw when no row is seeded)."""
        buf = self.sample_uniforms
        assert buf is not None
        if generators is None or all(g is None for g in generators):
            buf[:p].uniform_(UNIFORM_LOW, UNIFORM_HIGH)
            return
        if len(generators) != n:
            raise ValueError(f"talker MTP got {len(generators)} generators for {n} rows; pass one per row "
                             "(None for an unseeded row)")
        for i, g in enumerate(generators):
            buf[i : i + 1].uniform_(UNIFORM_LOW, UNIFORM_HIGH, generator=g)
        if p > n:
            buf[n:p].uniform_(UNIFORM_LOW, UNIFORM_HIGH)

    def padded(self, n: int) -> int:
        """Rows the head runs on for ``n`` requests: ``n`` eager, else the next capture size."""
        if not self.sizes:
            return n
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def _run(self, p: int, head: Callable[..., Any], sampling: dict[str, Any]) -> None:
        with self.context(p) if self.context is not None else contextlib.nullcontext():
            embeds, codes = head(self.input_ids[:p], self.input_embeds[:p], self.last_talker_hidden[:p],
                                 self.text_step[:p], **sampling)
        if self.out_embeds is None or self.out_embeds.shape[1:] != embeds.shape[1:]:
            self.out_embeds = embeds.new_zeros((self.max_num_reqs, *embeds.shape[1:]))
        if self.out_codes is None or self.out_codes.shape[1:] != codes.shape[1:]:
            self.out_codes = codes.new_zeros((self.max_num_reqs, *codes.shape[1:]))
        self.out_embeds[:p].copy_(embeds)
        self.out_codes[:p].copy_(codes)

    def __call__(self, input_ids: torch.Tensor, input_embeds: torch.Tensor, last_talker_hidden: torch.Tensor,
                 text_step: torch.Tensor, **sampling: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head on ``n`` rows; returns new tensors ``(embeds [n, H], codes [n, Q])``."""
        n = int(input_ids.shape[0])
        if n > self.max_num_reqs:
            raise ValueError(f"talker MTP got {n} rows but its buffers hold max_num_reqs={self.max_num_reqs}")
        with_generators = sampling.get("generator") is not None or sampling.get("generators") is not None
        gens: Sequence[torch.Generator | None] | None = None
        if self.sample_uniforms is not None:  # seeds become noise drawn here: the graph-capable path for all rows
            gen, gens = sampling.pop("generator", None), sampling.pop("generators", None)
            if gen is not None:
                if n != 1:
                    raise ValueError(f"talker MTP got one generator for {n} rows; pass generators= (one per row)")
                gens = [gen]
            self.seeded += int(with_generators)
            with_generators = False
        p = n if with_generators else self.padded(n)
        self.input_ids[:n].copy_(input_ids.reshape(-1))
        self.input_embeds[:n].copy_(input_embeds.reshape(n, -1))
        self.last_talker_hidden[:n].copy_(last_talker_hidden.reshape(n, -1))
        self.text_step[:n].copy_(text_step.reshape(n, -1))
        if p > n:
            for buf in (self.input_ids, self.input_embeds, self.last_talker_hidden, self.text_step):
                buf[n:p].zero_()
        if self.sample_uniforms is not None:
            if sampling.get("do_sample", True) is not False:  # greedy: the head reads no noise
                self.draw_uniforms(n, p, gens)
            sampling["sample_uniforms"] = self.sample_uniforms[:p]
        if with_generators:
            self.eager_seeded += 1
            embeds, codes = self.eager(self.input_ids[:n], self.input_embeds[:n], self.last_talker_hidden[:n],
                                       self.text_step[:n], **sampling)
            return embeds[:n].clone(), codes[:n].clone()
        self._run(p, self.mtp, sampling)
        if self.captured:
            self.replays += 1
        assert self.out_embeds is not None and self.out_codes is not None
        return self.out_embeds[:n].clone(), self.out_codes[:n].clone()

    def graph_stats(self) -> dict[str, Any] | None:
        """Graph mode: ``{"sizes", "captured", "replays", "seeded", "eager_seeded"}`` -- ``captured`` counts the
        graphs the wrapped head holds (``Backend.captured_graphs``, e.g. vLLM's ``CUDAGraphWrapper`` entries with
        a graph) when the driver tells, else the sizes run by :meth:`capture`; ``replays`` the calls since;
        ``seeded`` the calls with a seeded row that stayed on the graph path (their noise drawn outside it),
        ``eager_seeded`` those that left it for the unwrapped head (a head without ``sample_uniforms``).
        ``None`` when eager."""
        if not self.sizes:
            return None
        held = self.count_graphs(self.mtp) if self.count_graphs is not None else None
        captured = held if held is not None else (len(self.sizes) if self.captured else 0)
        return {"sizes": list(self.sizes), "captured": captured, "replays": self.replays, "seeded": self.seeded,
                "eager_seeded": self.eager_seeded}

    def capture(self) -> int:
        """Run the head once per capture size, largest first (the graph wrapper
        captures on a size's first call). Returns the number of sizes.

        Each size first runs the unwrapped head once outside capture (vLLM's own
        warm-up before a capture, ``compilation_config.cudagraph_num_of_warmups``):
        a head that sets itself up lazily on its first call -- vLLM-Omni's code
        predictor compiles and warms its buckets there, copying from unpinned CPU
        tensors -- would otherwise do that inside CUDA graph capture and fail."""
        for p in reversed(self.sizes or []):
            for buf in (self.input_ids, self.input_embeds, self.last_talker_hidden, self.text_step):
                buf[:p].zero_()
            # the graph reads the noise buffer like its other inputs (a seeded replay then needs no other graph)
            noise = {} if self.sample_uniforms is None else {"sample_uniforms": self.sample_uniforms[:p]}
            if self.eager is not self.mtp:
                self._run(p, self.eager, dict(noise))
            self._run(p, self.mtp, dict(noise))
        self.captured = len(self.sizes or [])
        return self.captured


def request_generator(seed: int | None, device: Any, cache: dict[str, torch.Generator], req_id: str) -> Any:
    """The per-request MTP generator (vLLM-Omni's ``tts_local_seed``): created on
    ``device`` from ``seed`` at a request's first decode step, then reused;
    ``None`` without a seed."""
    if seed is None:
        return None
    gen = cache.get(req_id)
    if gen is None:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        cache[req_id] = gen
    return gen
