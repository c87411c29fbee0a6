"""Deliberately broken copies of the simdev driver, one broken contract each.

Not part of the simdev distribution: ``tests/test_kit.py`` registers each
class under its own driver name (a generated ``.dist-info`` with an
``omni_backends.drivers`` entry point) and checks that the conformance kit
fails it with a message naming the broken contract. Every variant differs
from :class:`omni_simdev.driver.SimDevBackend` in exactly one place.
"""

from __future__ import annotations

from typing import Any

from omni_simdev.device import SimGraph
from omni_simdev.driver import SimDevBackend


def _without(cls: type, method: str, name: str) -> type:
    """``cls`` rebuilt on the same bases without ``method``: what a vendor gets
    by forgetting to write it. ABCMeta marks the method abstract again."""
    namespace = {k: v for k, v in vars(cls).items() if k not in (method, "__dict__", "__weakref__")}
    namespace["name"] = name
    return type(name.replace("-", "_"), cls.__bases__, namespace)


#: missing method: ``to_host`` (the ordering-safe device-to-host copy) was never written.
MissingMethod = _without(SimDevBackend, "to_host", "simdev-broken-missing")


class _StaleGraph(SimGraph):
    """Replays the captured work once, then keeps returning that output."""

    def replay(self) -> None:
        if not getattr(self, "_replayed", False):
            self._replayed = True
            super().replay()


class StaleGraphReplay(SimDevBackend):
    """graph replay returns stale output: only the first replay recomputes."""

    name = "simdev-broken-graph"

    def new_graph(self) -> Any:
        return _StaleGraph()


class InFlightCopySource(SimDevBackend):
    """copy path reuses an in-flight source: H2D is queued non-blocking although
    this device does not order it, so the copy reads ``buffer.cpu`` after the
    caller has rewritten it."""

    name = "simdev-broken-copy"

    def copy_to_device(self, buffer: Any, n: int | None = None):
        src = buffer.cpu if n is None else buffer.cpu[:n]
        dst = buffer.gpu if n is None else buffer.gpu[:n]
        return self._device.copy(dst, src, blocking=False)


class TieBreakingSampler(SimDevBackend):
    """sampler breaks ties differently: greedy picks the *last* of tied maxima."""

    name = "simdev-broken-sampler"

    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        import torch
        from vllm.v1.sample.sampler import Sampler

        class LastTieSampler(Sampler):
            @staticmethod
            def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
                vocab = logits.shape[-1]
                return (vocab - 1 - logits.flip(-1).argmax(dim=-1)).view(-1)

        return LastTieSampler(logprobs_mode=logprobs_mode)


class TopKTiesSampler(SimDevBackend):
    """sampler leaves ``top_k=1`` random on tied maxima: vLLM's own ``Sampler`` without the
    one-token rule (greedy ties are right, so only the one-token checks fail)."""

    name = "simdev-broken-ties"

    def make_sampler(self, logprobs_mode: str = "raw_logprobs") -> Any:
        from vllm.v1.sample.sampler import Sampler

        return Sampler(logprobs_mode=logprobs_mode)

    def prepare_sampler(self, sampler: Any) -> Any:
        return sampler


#: driver name -> (class path, the contract the kit must name, a test that must fail)
VARIANTS = {
    "simdev-broken-missing": ("omni_simdev_broken:MissingMethod", "interface-completeness",
                              "test_interface.py::test_every_abstract_method_is_implemented"),
    "simdev-broken-graph": ("omni_simdev_broken:StaleGraphReplay", "graph-replay",
                            "test_graphs.py::test_replay_recomputes_from_persistent_inputs"),
    "simdev-broken-copy": ("omni_simdev_broken:InFlightCopySource", "copy-ordering",
                           "test_buffers.py::test_source_may_be_rewritten_right_after_copy"),
    "simdev-broken-sampler": ("omni_simdev_broken:TieBreakingSampler", "sampler-equivalence",
                              "test_sampler.py::test_greedy_ties"),
    "simdev-broken-ties": ("omni_simdev_broken:TopKTiesSampler", "sampler-equivalence",
                           "test_sampler.py::test_one_token_edges_on_ties_are_greedy"),
}


class OldInterface(SimDevBackend):
    """speaks only an interface version this omni-backends does not (the registry refuses it)."""

    name = "simdev-broken-version"
    interface_versions = (99,)


VARIANTS["simdev-broken-version"] = ("omni_simdev_broken:OldInterface", "interface-version",
                                     "test_interface.py::test_every_abstract_method_is_implemented")
