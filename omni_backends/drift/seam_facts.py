"""The seam check's findings and the recorder every fact family writes them with.

:class:`SeamFact` is one checked fact (clean ones too); :class:`SeamCheck`
holds what a check is about (the contract, the sources, which runner, the
class chain) and records facts in order; :func:`ours_line` and
:func:`declared_at` give the ``file:line`` of the contract's side.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import Any

from omni_backends.binding import SeamContract
from omni_backends.drift.chain import ClassChain
from omni_backends.drift.model import rel_defined_at
from omni_backends.drift.sources import SourceResolver

#: seam-fact kinds that are drift (non-zero exit).
SEAM_DRIFT_KINDS = (
    "missing-seam", "removed-param", "renamed-param", "new-required-param", "changed-default",
    "missing-call-edge", "uncovered-model-call", "async-output-unrecognised", "async-wrapper-unrecognised",
    "abstract-not-implemented", "model-state-not-consulted", "model-state-replaced", "state-override-never-called",
    "missing-base",
)
#: entry points whose reach is reported for each model call.
ENTRY_POINTS = ("execute_model", "sample_tokens", "profile_run", "capture_model", "_dummy_run", "warming_up_model")


@dataclasses.dataclass
class SeamFact:
    """One checked fact of the contract about one base runner.

    ``status``: ``clean`` (holds), ``covered`` (a model call the core sees),
    ``drift`` (broken: ``kind`` says how) or ``note`` (reported, not drift).
    ``expected`` is what the contract assumes, ``found`` what the source shows;
    ``ours`` / ``vendor`` are ``file:line`` on both sides."""

    runner: str  # "v1" | "v2"
    base: str  # the driver's base runner, module.Class
    fact: str  # seam | call-edge | model-call | async-output | model-state
    seam: str  # e.g. "_preprocess", "execute_model -> _preprocess", "GPUModelRunner._dummy_run: self.model("
    status: str
    kind: str  # "ok" for clean facts, else a SEAM_DRIFT_KINDS entry or a note kind
    expected: str
    found: str
    ours: str | None = None
    vendor: str | None = None

    @property
    def drift(self) -> bool:
        return self.status == "drift"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def ours_line(contract: SeamContract, ref: str) -> str | None:
    """``file.py:Qualname`` (relative to the contract's root) -> ``file.py:line``, read with ast."""
    if not ref:
        return None
    path, _, qual = ref.partition(":")
    full = os.path.join(contract.root, path)
    try:
        tree = ast.parse(open(full, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return f"{path} (not found under {contract.root})"
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qual.split(".") if qual else []:
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return f"{path}: {qual} not found"
        body = getattr(node, "body", [])
    return f"{path}:{getattr(node, 'lineno', 1)}"


def declared_at(obj: Any) -> str | None:
    """``file:line`` (relative) where a contract object was declared, or None."""
    return rel_defined_at(obj.defined_at) if getattr(obj, "defined_at", "") else None


class SeamCheck:
    """What one check is about, and the facts it found so far (in order).

    ``facts`` may be shared by several checks of one runner, so that the
    fact families report in one list."""

    def __init__(self, contract: SeamContract, resolver: SourceResolver, runner: str, chain: ClassChain,
                 facts: list[SeamFact] | None = None) -> None:
        self.contract, self.resolver, self.runner, self.chain = contract, resolver, runner, chain
        self.facts: list[SeamFact] = [] if facts is None else facts

    def add(self, fact: str, seam: str, status: str, kind: str, expected: str, found: str,
            ours: str | None = None, vendor: str | None = None) -> None:
        """Record one fact about ``self.chain``; a drift ``kind`` must be one of :data:`SEAM_DRIFT_KINDS`."""
        assert status != "drift" or kind in SEAM_DRIFT_KINDS, kind
        self.facts.append(SeamFact(self.runner, self.chain.leaf.qualname, fact, seam, status, kind, expected, found,
                                   ours, vendor))


__all__ = ["ENTRY_POINTS", "SEAM_DRIFT_KINDS", "SeamCheck", "SeamFact", "declared_at", "ours_line"]
