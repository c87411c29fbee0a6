"""Vendor API drift check: ``omni-backends check-drift``.

Every driver declares the vendor symbols it binds as module-level
:class:`~omni_backends.binding.VendorSymbol` objects and uses them only through
``.resolve()``. This module collects those declarations (from the driver's
package and from the ``omni_backends`` modules it imports names from, e.g.
``omni_backends/vllm_upstream.py``) and resolves each one against

- the installed stack (``--installed``): ``importlib.import_module`` +
  ``getattr`` + ``inspect.signature``; or
- a source tree, wheel (``.whl``/``.zip``) or sdist (``.tar.gz``)
  (``--source``, repeatable): the Python files are parsed with :mod:`ast`,
  nothing is imported, so a vendor stack that cannot install here (CANN,
  torch-npu) can still be checked.

Problems reported, each with the driver's ``file:line`` (declaration and every
``.resolve()`` use) and the vendor's ``file:line`` where found:
``missing-module``, ``missing-symbol``, ``removed-param``, ``renamed-param``,
``new-required-param``, ``changed-default``, ``import-error``. Notes that are
not drift: ``not-checked`` (the symbol's package is not in what was given)
and ``unverifiable`` (the definition is outside the given sources, e.g. a C
extension base class).

:func:`vendor_import_drift` checks a *vendor's own* source (vllm-ascend)
against the upstream vLLM it is meant to run on: every ``from vllm... import
name`` is resolved in the upstream tree.

:func:`~omni_backends.drift.seams.check_seams` resolves a seam contract
(:class:`~omni_backends.binding.SeamContract`; the core's is ``core.seams``,
registered under the entry point group ``omni_backends.seam_contracts``)
against the base runner chain each driver binds: seams and their parameters,
call edges, model calls and their coverage, the async output type and how the
executors recognise it, V2 model-state facts (``docs/drift.md``).

Modules: ``model`` (findings, reports), ``sources`` (source trees and AST
resolution), ``installed`` (import + inspect), ``declarations`` (what a driver
binds), ``symbols`` (signature comparison, vendor imports), ``chain`` (a
class chain's dispatch and call reach), ``seams`` (the seam check's entry
points) with one module per fact family: ``seam_facts`` (findings and their
recorder), ``seam_calls`` (seams, call edges, model calls), ``seam_async``
(async outputs), ``seam_state`` (V2 model state); ``cli``.
"""

from __future__ import annotations

from omni_backends.drift.cli import add_command, load_contracts, render_text, run_check
from omni_backends.drift.declarations import driver_declarations
from omni_backends.drift.installed import InstalledResolver
from omni_backends.drift.model import DRIFT_KINDS, NOTE_KINDS, Declared, DriverReport, Finding, Param
from omni_backends.drift.seams import SEAM_DRIFT_KINDS, SeamFact, check_seams
from omni_backends.drift.sources import SourceResolver, SourceTree
from omni_backends.drift.symbols import check_declarations, compare_signature, vendor_import_drift

__all__ = [
    "DRIFT_KINDS",
    "Declared",
    "DriverReport",
    "Finding",
    "NOTE_KINDS",
    "InstalledResolver",
    "Param",
    "SEAM_DRIFT_KINDS",
    "SeamFact",
    "SourceResolver",
    "SourceTree",
    "add_command",
    "check_declarations",
    "check_seams",
    "compare_signature",
    "driver_declarations",
    "load_contracts",
    "render_text",
    "run_check",
    "vendor_import_drift",
]
