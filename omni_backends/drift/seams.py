"""The seam check: a :class:`~omni_backends.binding.SeamContract` against a driver's base runner chain.

Everything is read with :mod:`ast` from the given sources (directories,
wheels, sdists, or the installed packages' directories); nothing is imported.
For a base runner class (the one a driver's ``model_runner_base`` returns) the
*chain* is that class and its bases as far as the sources reach (the driver's
vendor classes, then vLLM's). A method name resolves the way Python dispatches
``self.name``: the first class of the chain that defines it.

Facts checked (each reported with its status, clean ones too), one module per family:

- :mod:`~omni_backends.drift.seam_calls`: ``seam``: every method the core overrides exists in the chain with the
  parameters it assumes (kinds from :func:`~omni_backends.drift.symbols.compare_signature`,
  plus ``missing-seam``).
- ``call-edge``: ``caller`` reaches ``callee`` (``self.x``, ``super().x``,
  ``Base.x(self``; through other methods of the chain, a few levels deep);
  ``missing-call-edge`` when a relied-on edge is gone.
- ``model-call``: every ``self.model(`` / ``partial(self.model`` / ``model(`` /
  ``<…model…>.forward(`` in a method the chain dispatches to, ``covered`` or
  ``uncovered-model-call`` per the contract's coverage, with the entry points
  (``execute_model``, ``profile_run``, ``capture_model``, ...) that reach it.
- :mod:`~omni_backends.drift.seam_async`: ``async-output``: the classes ``sample_tokens`` returns, the executors'
  ``isinstance(x, AsyncModelRunnerOutput)``, the abstract methods of that
  base: ``async-output-unrecognised`` (a returned async-looking class the
  executor does not recognise), ``async-wrapper-unrecognised`` (the core's
  wrapper relies on ``get_output`` duck typing where the executor uses
  ``isinstance``), ``abstract-not-implemented``.
- :mod:`~omni_backends.drift.seam_state`: ``model-state`` (V2): ``init_model_state`` consults ``get_model_state_cls``
  (``model-state-not-consulted``); a vendor reassigning it at module level
  (``model-state-replaced``); each state method the omni state overrides is
  called by the runner (``state-override-never-called``); every abstract
  method of the state interface is implemented (``abstract-not-implemented``).

Findings are :class:`~omni_backends.drift.seam_facts.SeamFact`; this module
holds the two entry points, :func:`check_seams` (a base runner) and
:func:`check_worker_seams` (a worker class).
"""

from __future__ import annotations

from omni_backends.binding import MODEL_CALL_FORMS, SeamContract, V1RunnerContract, V2RunnerContract, VendorSymbol
from omni_backends.drift.chain import ClassChain
from omni_backends.drift.seam_async import AsyncOutputCheck
from omni_backends.drift.seam_calls import RunnerSeamCheck
from omni_backends.drift.seam_facts import ENTRY_POINTS, SEAM_DRIFT_KINDS, SeamFact, declared_at
from omni_backends.drift.seam_state import ModelStateCheck
from omni_backends.drift.sources import SourceResolver, Missing, Unverifiable


def check_seams(contract: SeamContract, base: VendorSymbol, resolver: SourceResolver) -> list[SeamFact]:
    """Every fact of ``contract`` about the base runner ``base`` (a driver's
    ``model_runner_base`` symbol), read from ``resolver``'s sources.

    The chain decides which part applies: V1 when it contains
    ``contract.v1.marker`` (vLLM's V1 ``GPUModelRunner``), V2 when it contains
    ``contract.v2.marker``. Returns the facts (clean ones included); a base
    outside the sources gives one ``not-checked`` note."""
    try:
        chain = ClassChain(resolver, base.module, base.attr)
    except Unverifiable as exc:
        return [SeamFact("?", base.qualname, "chain", base.qualname, "note", "not-checked", "in the sources", str(exc),
                         declared_at(base))]
    except Missing as exc:
        return [SeamFact("?", base.qualname, "chain", base.qualname, "drift", "missing-base", "exists", str(exc),
                         declared_at(base), exc.where)]
    facts: list[SeamFact] = []
    parts: list[tuple[str, V1RunnerContract | V2RunnerContract]] = []
    if contract.v1 is not None and chain.has(*contract.v1.marker):
        parts.append(("v1", contract.v1))
    if contract.v2 is not None and chain.has(*contract.v2.marker):
        parts.append(("v2", contract.v2))
    if not parts:
        return [SeamFact("?", base.qualname, "chain", base.qualname, "note", "not-checked",
                         "a V1 or V2 vLLM runner in the chain",
                         " <- ".join(c.qualname for c in chain.classes)
                         + (f" (bases outside the sources: {', '.join(chain.external)})" if chain.external else ""),
                         declared_at(base), chain.leaf.at())]
    for runner, part in parts:
        calls = RunnerSeamCheck(contract, resolver, runner, chain, facts)
        calls.add("chain", "base runner chain", "clean", "ok", f"a {runner.upper()} runner",
                  " <- ".join(c.qualname for c in chain.classes), declared_at(base), chain.leaf.at())
        if isinstance(part, V1RunnerContract):
            for s in part.seams:
                calls.seam(s)
            calls.edges(part.edges)
        else:
            for s in part.runner_seams:
                calls.seam(s)
            ModelStateCheck(contract, resolver, runner, chain, facts).model_state(part)
        calls.model_calls(part.model_calls)
        AsyncOutputCheck(contract, resolver, runner, chain, facts).async_output(part.async_output)
    return facts


def check_worker_seams(contract: SeamContract, worker: VendorSymbol, resolver: SourceResolver) -> list[SeamFact]:
    """The contract's ``worker_edges`` (V1 part) on a driver's worker class chain: which
    worker methods reach the model runner's methods (``self.model_runner.<name>``), e.g.
    warm-up -> ``_dummy_run``. Facts with ``runner="worker"``."""
    edges = contract.v1.worker_edges if contract.v1 is not None else ()
    if not edges:
        return []
    try:
        chain = ClassChain(resolver, worker.module, worker.attr)
    except Unverifiable as exc:
        return [SeamFact("worker", worker.qualname, "chain", worker.qualname, "note", "not-checked", "in the sources",
                         str(exc), declared_at(worker))]
    except Missing as exc:
        return [SeamFact("worker", worker.qualname, "chain", worker.qualname, "drift", "missing-base", "exists",
                         str(exc), declared_at(worker), exc.where)]
    ck = RunnerSeamCheck(contract, resolver, "worker", chain)
    ck.add("chain", "worker chain", "clean", "ok", "a worker", " <- ".join(c.qualname for c in chain.classes),
           declared_at(worker), chain.leaf.at())
    ck.edges(edges, via="model_runner")
    return ck.facts


__all__ = ["ENTRY_POINTS", "MODEL_CALL_FORMS", "SEAM_DRIFT_KINDS", "ClassChain", "SeamFact", "check_seams",
           "check_worker_seams"]