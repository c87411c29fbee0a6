"""Declared vendor symbols: the one place a driver names what it binds.

A driver declares every vendor symbol it uses as a module-level
:class:`VendorSymbol` and calls it through :meth:`VendorSymbol.resolve`, so the
declaration cannot drift from the code that uses it. The drift check
(``omni-backends check-drift``) reads the same declarations and resolves them
against an installed stack or a source tree, reporting the driver's
``file:line`` for each problem.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any, Iterator

#: what a :class:`VendorSymbol` can name.
KINDS = ("callable", "class", "attribute", "module")


@dataclasses.dataclass(frozen=True)
class VendorSymbol:
    """A vendor symbol a driver binds.

    - ``module``: dotted module path (``"vllm.forward_context"``).
    - ``attr``: attribute path inside it; dots walk into classes
      (``"CUDAGraphWrapper.clear_all_graphs"``).
    - ``params``: parameters the driver passes (by keyword or position) or
      reads; the drift check fails if one disappears or is renamed.
    - ``required``: the parameters the driver always fills; a parameter
      without a default that is not listed here is drift ("newly required").
      ``None`` = do not check for new required parameters.
    - ``defaults``: ``(param, default source)`` pairs for parameters the driver
      leaves at the vendor's default and relies on (``("logprobs_mode",
      "'raw_logprobs'")``); a changed default is drift.
    - ``dist``: the distribution that ships ``module`` (for version reports).
    - ``kind``: ``"callable"`` (signature checked), ``"class"`` (its
      ``__init__`` signature checked), ``"attribute"`` (existence only; on a
      class this also finds instance attributes assigned in its methods) or
      ``"module"``.
    - ``mentions``: names the vendor callable's own source must contain (a
      behaviour the binding relies on that no signature shows, e.g. that
      ``init_model_state`` asks the model for ``get_model_state_cls``); the
      drift check reads the source, a name gone is drift (``missing-behaviour``).
    - ``absent``: text the vendor source of this symbol must *not* contain (a
      layout the binding relies on, e.g. ``"__slots__"`` for a class whose live
      instances get their ``__class__`` swapped); a name that appears is drift
      (``changed-layout``).
    - ``alternatives``: the same seam under the spelling of other supported
      vendor versions (older names first-come, e.g. vLLM 0.26's
      ``get_mm_embeddings`` for 0.27+'s ``prepare_inputs_embeds``).
      :meth:`resolve` returns the first that exists (this symbol first); the
      drift check passes when one of them resolves without drift and reports
      which. This is the one place a version-dependent binding is written:
      callers never branch on a version.
    - ``defined_at``: ``file:line`` of the declaration (filled automatically).
    """

    module: str
    attr: str
    params: tuple[str, ...] = ()
    required: tuple[str, ...] | None = None
    dist: str = "vllm"
    kind: str = "callable"
    defaults: tuple[tuple[str, str], ...] = ()
    mentions: tuple[str, ...] = ()
    alternatives: tuple["VendorSymbol", ...] = ()
    absent: tuple[str, ...] = ()
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"VendorSymbol kind must be one of {KINDS}, got {self.kind!r}")
        unknown = [p for p in (self.required or ()) if p not in self.params]
        if unknown:
            raise ValueError(f"{self.module}.{self.attr}: required {unknown} must also be listed in params")
        if not self.defined_at:
            frame = sys._getframe(2)  # the driver module line that declared it
            object.__setattr__(self, "defined_at", f"{frame.f_code.co_filename}:{frame.f_lineno}")
        for alt in self.alternatives:
            if alt.alternatives:
                raise ValueError(f"{self.qualname}: an alternative ({alt.qualname}) cannot have alternatives itself")
            if not alt.defined_at or alt.defined_at.startswith(__file__):
                object.__setattr__(alt, "defined_at", self.defined_at)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.attr}" if self.attr else self.module

    def resolve(self) -> Any:
        """Import ``module`` and return ``attr`` (or, when absent, the first of
        ``alternatives`` that exists). Raises ``ImportError`` / ``AttributeError``
        naming this declaration when the vendor moved it."""
        return self.resolve_spelling()[1]

    def resolve_spelling(self) -> "tuple[VendorSymbol, Any]":
        """``(the symbol that resolved, the object)``: this one or the first of
        ``alternatives`` present in the installed vendor version. Raises this
        symbol's own error (naming the alternatives tried) when none exists."""
        if not self.alternatives:
            return self, self._resolve_one()
        try:
            return self, self._resolve_one()
        except (ImportError, AttributeError) as first:
            for alt in self.alternatives:
                try:
                    return alt, alt._resolve_one()
                except (ImportError, AttributeError):
                    continue
            tried = ", ".join(a.qualname for a in self.alternatives)
            raise type(first)(f"{first} (alternatives tried: {tried})") from first

    @property
    def attr_name(self) -> str:
        """The last part of ``attr`` (a method or field name)."""
        return self.attr.rpartition(".")[2]

    def _resolve_one(self) -> Any:
        obj: Any = sys.modules.get(self.module)  # fast path: already imported (resolution stays call-time)
        if obj is None:
            try:
                obj = importlib.import_module(self.module)
            except ImportError as exc:
                raise ImportError(f"{self.qualname} (declared at {self.defined_at}): cannot import {self.module}: {exc}") from exc
        for part in self.attr.split(".") if self.attr else ():
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise AttributeError(
                    f"{self.qualname} (declared at {self.defined_at}): {self.module} has no {self.attr!r}; "
                    f"run `omni-backends check-drift` to see what moved"
                ) from exc
        return obj


#: the arguments vLLM builds a model runner with: ``runner_cls(vllm_config, device)``
RUNNER_ARGS = ("vllm_config", "device")
#: the arguments vLLM builds a worker with (``is_driver_worker`` has a default)
WORKER_ARGS = ("vllm_config", "local_rank", "rank", "distributed_init_method", "is_driver_worker")


def runner_symbol(module: str, attr: str, dist: str = "vllm") -> VendorSymbol:
    """A vendor model-runner class, built as ``cls(vllm_config, device)`` (:data:`RUNNER_ARGS`, both passed)."""
    return VendorSymbol(module, attr, params=RUNNER_ARGS, required=RUNNER_ARGS, dist=dist, kind="class",
                        defined_at=_caller_line(2))


def worker_symbol(module: str, attr: str, dist: str = "vllm") -> VendorSymbol:
    """A vendor worker class, built with :data:`WORKER_ARGS` (all but ``is_driver_worker`` passed)."""
    return VendorSymbol(module, attr, params=WORKER_ARGS, required=WORKER_ARGS[:-1], dist=dist, kind="class",
                        defined_at=_caller_line(2))


def declared_symbols(module: Any) -> Iterator[tuple[str, VendorSymbol]]:
    """Every ``VendorSymbol`` bound at module level in ``module`` (name, symbol)."""
    for name, value in vars(module).items():
        if isinstance(value, VendorSymbol):
            yield name, value


# --------------------------------------------------------------- seam contracts
# What the omni core relies on in a base runner's *behaviour*, beyond the
# symbols it binds: which methods it overrides (and their parameters), which
# calls vLLM makes between them, where the model is called, how an async output
# is recognised, how V2 builds the model state. Declared as data next to the
# code that relies on it (``core/seams.py``) and checked statically against
# each driver's base runner chain by ``omni-backends check-drift``
# (``omni_backends.drift.seams``). This module only holds the shapes.

#: the forms of a model call check-drift finds in a base runner (source text patterns).
MODEL_CALL_FORMS = ("self.model(", "partial(self.model", "model(", ".forward(")


def _caller_line(depth: int = 3) -> str:
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@dataclasses.dataclass(frozen=True)
class Seam:
    """A base-runner (or base model-state) method the core overrides and calls through ``super()``.

    - ``name``: the method name (``"_preprocess"``).
    - ``params`` / ``required``: as :class:`VendorSymbol` (parameters the core
      passes or reads, by name; the ones it always fills; ``required=None``:
      the override passes ``*args, **kwargs`` through, only existence matters).
    - ``ours``: where the core implements it, ``"path/to/file.py:Class.method"``
      relative to the contract's ``root`` (read with ``ast``, never imported).
    - ``fallback``: (V2 state seams) where the core does the seam's work when
      the runner never calls it (``"file.py:Qualname"``); a seam the runner
      lacks or never calls is then a note, not drift.
    - ``alternatives``: the same seam's name in other supported vendor
      versions (same parameters; e.g. vLLM 0.26's ``get_mm_embeddings`` for
      0.32+'s ``prepare_inputs_embeds``): the first name the chain defines is
      checked, and a call of any of them counts.
    """

    name: str
    params: tuple[str, ...] = ()
    required: tuple[str, ...] | None = None
    ours: str = ""
    fallback: str = ""
    alternatives: tuple[str, ...] = ()
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.defined_at:
            object.__setattr__(self, "defined_at", _caller_line())


@dataclasses.dataclass(frozen=True)
class CallEdge:
    """``caller`` reaches ``callee`` in the base runner (``self.callee``, ``super().callee``,
    ``Base.callee(self, ...)``, directly or through other methods of the chain).

    ``relied_on=True``: the core's hooks need it (a missing edge is drift);
    ``False``: a fact reported for the matrix (e.g. ``profile_run`` ->
    ``_dummy_run``, which calls the model outside ``_model_forward``)."""

    caller: str
    callee: str
    relied_on: bool = True
    why: str = ""
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.defined_at:
            object.__setattr__(self, "defined_at", _caller_line())


@dataclasses.dataclass(frozen=True)
class ModelCallCoverage:
    """Which of the base runner's model calls the core sees (turns an omni output into hidden states).

    A call is covered when it lies inside one of ``in_methods`` (a seam that
    wraps it, e.g. ``_model_forward``) or its form is one of ``forms`` (a
    subset of :data:`MODEL_CALL_FORMS`; covered wherever it occurs, e.g. by an
    adapter on the model instance). ``by`` says what covers them; ``ours``
    where (``file.py:Qualname``)."""

    in_methods: tuple[str, ...] = ()
    forms: tuple[str, ...] = ()
    by: str = ""
    ours: str = ""
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        bad = [f for f in self.forms if f not in MODEL_CALL_FORMS]
        if bad:
            raise ValueError(f"ModelCallCoverage forms must be among {MODEL_CALL_FORMS}, got {bad}")
        if not self.defined_at:
            object.__setattr__(self, "defined_at", _caller_line())


@dataclasses.dataclass(frozen=True)
class AsyncOutputContract:
    """How the core hands an async step output back, and what it assumes the executor does with it.

    - ``base``: the class the executor's ``isinstance`` recognises
      (``VendorSymbol("vllm.v1.outputs", "AsyncModelRunnerOutput", kind="class")``).
    - ``executors``: modules whose ``isinstance(x, base)`` calls are listed.
    - ``recognised_by``: what the core's wrapper relies on: ``"isinstance"``
      (it subclasses ``base``) or ``"get_output"`` (duck typing: any object
      with ``get_output``; drift wherever an executor uses ``isinstance``).
    - ``implements``: the abstract methods of ``base`` the wrapper implements;
      ``None`` = every abstract method of the version it runs on (delegated).
    - ``ours``: the wrapper, ``file.py:Qualname``.
    """

    base: VendorSymbol
    executors: tuple[str, ...] = ()
    recognised_by: str = "isinstance"
    implements: tuple[str, ...] | None = None
    ours: str = ""
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.recognised_by not in ("isinstance", "get_output"):
            raise ValueError(f"recognised_by must be 'isinstance' or 'get_output', got {self.recognised_by!r}")
        if not self.defined_at:
            object.__setattr__(self, "defined_at", _caller_line())


@dataclasses.dataclass(frozen=True)
class V1RunnerContract:
    """What the core's V1 mixin relies on in a V1 ``GPUModelRunner`` chain."""

    seams: tuple[Seam, ...]
    edges: tuple[CallEdge, ...]
    model_calls: ModelCallCoverage
    async_output: AsyncOutputContract
    #: a class in the chain that marks it as V1 (``("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")``).
    marker: tuple[str, str] = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    #: edges from the driver's *worker* into its model runner (``self.model_runner.<callee>``),
    #: e.g. warm-up -> ``_dummy_run``; checked on the class ``worker_base`` returns.
    worker_edges: tuple[CallEdge, ...] = ()


@dataclasses.dataclass(frozen=True)
class V2RunnerContract:
    """What the core's V2 model state and runner mixin rely on in a V2 runner chain.

    - ``init_function`` / ``state_hook``: the runner builds its model state with
      ``init_function(...)``; with a ``state_hook`` (``get_model_state_cls``) it
      must consult the model's hook; ``state_hook=None`` (the core since the
      runner composes the omni state with whatever was built) makes the hook
      and a vendor's replacement facts, not drift; a vendor that reassigns ``init_function`` at
      module level must consult it too.
    - ``state_base``: the class the omni state subclasses; ``state_interface``:
      the abstract base whose abstract methods must all be implemented.
    - ``state_seams``: the state methods the omni state overrides; each must be
      called by the runner (``….model_state.<name>(``), else the hook never runs.
    - ``runner_seams``: runner methods the V2 mixin overrides.
    """

    runner_seams: tuple[Seam, ...]
    state_seams: tuple[Seam, ...]
    model_calls: ModelCallCoverage
    async_output: AsyncOutputContract
    state_base: VendorSymbol
    state_interface: VendorSymbol
    init_function: str = "init_model_state"
    state_hook: str | None = "get_model_state_cls"
    marker: tuple[str, str] = ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")


@dataclasses.dataclass(frozen=True)
class Patch:
    """One in-place change of a live vendor object (a class swap, an instance attribute replaced, a write
    into the engine's config), declared by the module that makes it (``core/patches/<name>.py``; the
    driver-side one in :mod:`omni_backends.patches`) with :meth:`declare`, from its docstring.

    - ``name``: the patch's name (the module's name), what ``check-drift`` reports.
    - ``module``: the file that makes the change, relative to the repository root.
    - ``changes``: what is changed on which object.
    - ``why``: why the project needs it (what breaks without it).
    - ``versions``: the vendor versions it is written for and checked against.
    - ``until``: the upstream change that would let it go.
    - ``checks``: what the patch assumes of the vendor, as :class:`VendorSymbol` s:
      the attributes it reads or replaces, the call sites that make the change
      take effect (``mentions``), the class layout a swap needs (``absent``);
      ``check-drift`` resolves each against every vendor version it is given.
    """

    name: str
    module: str
    changes: str
    why: str
    versions: str
    until: str
    checks: tuple[VendorSymbol, ...]
    defined_at: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        empty = [f for f in ("name", "module", "changes", "why", "versions", "until") if not getattr(self, f)]
        if empty or not self.checks:
            raise ValueError(f"patch {self.name!r} must say {', '.join(empty or ['its checks'])}")
        if not self.defined_at:
            object.__setattr__(self, "defined_at", _caller_line())

    @classmethod
    def declare(cls, module_name: str, doc: str | None, checks: tuple[VendorSymbol, ...],
                name: str | None = None) -> "Patch":
        """The patch a module makes, read from the module itself (one home per fact): ``name`` (default:
        the module's last name), ``module`` its file relative to the repository root, and ``changes`` / ``why`` /
        ``versions`` / ``until`` the docstring's bullets ``- What:``, ``- Why:``, ``- Versions:``, ``- Until:``.
        Call it at module level as ``PATCH = Patch.declare(__name__, __doc__, (CHECK, ...))``. Raises
        ``ValueError`` naming a bullet the docstring lacks."""
        import re

        mod = sys.modules[module_name]
        depth = module_name.count(".") + (1 if os.path.basename(mod.__file__ or "") == "__init__.py" else 0)
        root = os.path.dirname(os.path.abspath(mod.__file__ or ""))
        for _ in range(depth):
            root = os.path.dirname(root)
        bullets = {k: " ".join(v.split()) for k, v in re.findall(r"^- (What|Why|Versions|Until): (.*?)(?=^- |^\S|\Z)",
                                                                    doc or "", re.M | re.S)}
        missing = [k for k in ("What", "Why", "Versions", "Until") if k not in bullets]
        if missing:
            raise ValueError(f"{module_name}'s docstring lacks the bullet(s) {', '.join('- ' + k + ':' for k in missing)}")
        return cls(name=name or module_name.rpartition(".")[2], module=os.path.relpath(os.path.abspath(mod.__file__ or ""), root),
                   changes=bullets["What"], why=bullets["Why"], versions=bullets["Versions"], until=bullets["Until"],
                   checks=tuple(checks), defined_at=_caller_line(2))

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.name, "module": self.module, "changes": self.changes, "why": self.why,
                "versions": self.versions, "until": self.until}


@dataclasses.dataclass(frozen=True)
class SeamContract:
    """The core's seam contract: ``v1`` / ``v2`` parts; ``root`` is the directory
    the ``ours`` paths are relative to (the core's source, read, not imported)."""

    name: str
    root: str
    v1: V1RunnerContract | None = None
    v2: V2RunnerContract | None = None
    #: every vendor symbol the core binds (resolved by ``check-drift`` like a driver's declarations)
    symbols: tuple[VendorSymbol, ...] = ()
    #: every in-place change of a vendor object the core (and its drivers) make, with what each assumes
    patches: tuple[Patch, ...] = ()
