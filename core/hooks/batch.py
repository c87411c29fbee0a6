"""The scheduled batch as the omni hooks see it (V1 and V2 runners build it)."""

from __future__ import annotations

import dataclasses

import numpy as np


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

    Each int field is a numpy array or a list of ints (the V1 runner's view of a lean model's step, built after
    the forward: lists, which the output hooks read as they are).
    """

    req_ids: list[str]
    query_start_loc: np.ndarray
    num_computed: np.ndarray
    num_prompt: np.ndarray
    #: int ``[num_reqs]`` output tokens each request has (vLLM-Omni's ``generated_len``); None: unknown
    num_output: np.ndarray | None = None
    #: int ``[num_reqs]`` each request's ``SamplingParams.max_tokens`` / ``seed`` (``_omni_max_tokens`` /
    #: ``_omni_seed``); None: unknown
    max_tokens: list | None = None
    seeds: list | None = None
    #: True for a dummy batch (vLLM's profile / warm-up runs: ids vLLM made up, never added nor removed): the
    #: model still gets its per-request kwargs, but nothing is stored for these ids
    dummy: bool = False

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        """Scheduled tokens this step (unpadded)."""
        spans = self.spans
        return spans[-1][1] if spans else int(np.asarray(self.query_start_loc)[0])

    def is_prefill(self, i: int) -> bool:
        """True while request i still has prompt tokens to compute (vLLM-Omni's ``_omni_is_prefill``)."""
        return int(self.num_computed[i]) < int(self.num_prompt[i])

    def is_decode_row(self, i: int) -> bool:
        """True if request i runs one token past its prompt this step (a talker-MTP row)."""
        start, end = self.span(i)
        return end - start == 1 and not self.is_prefill(i)

    @property
    def spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` of every request's scheduled tokens, batch order (Python ints, computed once
        per batch)."""
        spans = self.__dict__.get("_spans")
        if spans is None:
            qsl = np.asarray(self.query_start_loc)[: self.num_reqs + 1].tolist()
            spans = self.__dict__["_spans"] = list(zip(qsl[:-1], qsl[1:]))
        return spans

    def span(self, i: int) -> tuple[int, int]:
        """(start, end) offsets of request i's scheduled tokens in the flattened batch."""
        return self.spans[i]

    def prefill_rows(self, i: int) -> tuple[int, int, int]:
        """(batch_start, prompt_offset, count) of request i's prompt tokens this step."""
        start, end = self.span(i)
        first = int(self.num_computed[i])
        count = max(0, min(end - start, int(self.num_prompt[i]) - first))
        return start, first, count

