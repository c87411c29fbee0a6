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
them zeroed). A call carrying explicit per-request generators runs the
unwrapped head (a graph would freeze the generator), as vLLM-Omni does.
"""

from __future__ import annotations

import bisect
import contextlib
from typing import Any, Callable, ContextManager

import torch


class TalkerMTP:
    """The model's ``talker_mtp`` on persistent buffers (see the module docstring).

    ``mtp``: the head as the runner calls it (possibly ``Backend.wrap_graph``-ed);
    ``eager``: the unwrapped head (for calls with generators). ``context(p)``
    is entered around a call on ``p`` rows (the forward context that selects
    the graph). Raises ``ValueError`` for more rows than ``max_num_reqs``.
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
        #: graphs captured (one per size); graph replays after capture
        self.captured = 0
        self.replays = 0

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
        p = n if with_generators else self.padded(n)
        self.input_ids[:n].copy_(input_ids.reshape(-1))
        self.input_embeds[:n].copy_(input_embeds.reshape(n, -1))
        self.last_talker_hidden[:n].copy_(last_talker_hidden.reshape(n, -1))
        self.text_step[:n].copy_(text_step.reshape(n, -1))
        if p > n:
            for buf in (self.input_ids, self.input_embeds, self.last_talker_hidden, self.text_step):
                buf[n:p].zero_()
        if with_generators:
            embeds, codes = self.eager(self.input_ids[:n], self.input_embeds[:n], self.last_talker_hidden[:n],
                                       self.text_step[:n], **sampling)
            return embeds[:n].clone(), codes[:n].clone()
        self._run(p, self.mtp, sampling)
        if self.captured:
            self.replays += 1
        assert self.out_embeds is not None and self.out_codes is not None
        return self.out_embeds[:n].clone(), self.out_codes[:n].clone()

    def graph_stats(self) -> dict[str, Any] | None:
        """Graph mode: ``{"sizes", "captured", "replays"}`` -- ``captured`` counts the graphs the wrapped head
        holds (``Backend.captured_graphs``, e.g. vLLM's ``CUDAGraphWrapper`` entries with a graph) when the
        driver tells, else the sizes run by :meth:`capture`; ``replays`` the calls since. ``None`` when eager."""
        if not self.sizes:
            return None
        held = self.count_graphs(self.mtp) if self.count_graphs is not None else None
        captured = held if held is not None else (len(self.sizes) if self.captured else 0)
        return {"sizes": list(self.sizes), "captured": captured, "replays": self.replays}

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
            if self.eager is not self.mtp:
                self._run(p, self.eager, {})
            self._run(p, self.mtp, {})
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
