"""pytest plugin (entry point ``pytest11: omni_backends``): the conformance kit's glue.

Adds:

- ``--device NAME``: the driver the tests run on (``cpu``, ``cuda``, ``npu``,
  ``xpu`` or an out-of-tree driver's name; default ``cpu``);
- ``--omni-report PATH``: write a JSON report (pass/fail/skip per test, with
  the driver's name, distribution, versions, interface version and
  capabilities);
- markers (every one the suite uses is registered here, so ``--strict-markers`` collects it from any
  directory): ``device_tier``, ``engine_tier`` (tiers), ``slow``, ``device_cpu``,
  ``device_cuda``, ``device_npu``, ``device_xpu`` and ``device(NAME)`` (a
  test for one device: skipped, with the reason printed, under any other
  ``--device``; a driver's declared aliases, such as ``ascend`` for ``npu``,
  count as its name);
- fixtures: ``device_name``, ``driver_under_test``, ``backend``,
  ``capabilities``.

Run the suite on a driver: ``pytest --pyargs omni_backends.testing.suite --device NAME -rs``.

Kept light: importing it imports neither torch nor vLLM.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from typing import Any

import pytest

#: per-device marker -> driver name it requires.
DEVICE_MARKERS = {"device_cpu": "cpu", "device_cuda": "cuda", "device_npu": "npu", "device_xpu": "xpu"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("omni-backends")
    group.addoption(
        "--device",
        action="store",
        default=None,
        help="omni-backends driver the tests run on (cpu, cuda, npu, xpu, or an out-of-tree driver name)",
    )
    group.addoption(
        "--omni-report",
        action="store",
        default=None,
        metavar="PATH",
        help="write a JSON conformance report (pass/fail/skip per test, driver name, versions, interface version)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "device_tier: torch-level conformance tests (need the selected device)")
    config.addinivalue_line("markers", "engine_tier: tests that start a real vLLM engine (need the device's vLLM stack)")
    config.addinivalue_line("markers", "slow: tests that take more than a few seconds")
    for marker, dev in DEVICE_MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: runs only with --device {dev}; skipped with a reason otherwise")
    config.addinivalue_line("markers", "device(name): runs only with --device NAME; skipped with a reason otherwise")
    path = config.getoption("--omni-report")
    if path:
        config.pluginmanager.register(JsonReport(config, path), "omni_backends_json_report")


def canonical_device(config: pytest.Config, name: str) -> str:
    """The driver name ``name`` stands for: lowercased, an alias a driver declares (``Backend.aliases``: the npu
    driver's ``ascend``) resolved by :func:`omni_backends.registry.resolve_name` over the installed drivers; a
    name no installed driver claims stays as given (the tests that need it skip or fail with the registry's
    error). Cached per run."""
    name = name.strip().lower()
    cache = config.__dict__.setdefault("_omni_canonical_devices", {})
    if name not in cache:
        from omni_backends import registry
        from omni_backends.errors import OmniBackendError

        try:
            entries, _notes = registry.discover()
            cache[name] = registry.resolve_name(name, entries)
        except OmniBackendError:  # an unknown name
            cache[name] = name
    return cache[name]


def selected_device(config: pytest.Config) -> str:
    """The driver name of this run's ``--device`` (default ``cpu``), aliases resolved (:func:`canonical_device`)."""
    return canonical_device(config, config.getoption("--device") or "cpu")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, with the reason, a test marked for a device other than ``--device``."""
    selected = selected_device(item.config)
    wanted = [dev for marker, dev in DEVICE_MARKERS.items() if item.get_closest_marker(marker)]
    wanted += [canonical_device(item.config, str(a)) for m in item.iter_markers("device") for a in m.args]
    if wanted and selected not in wanted:
        pytest.skip(f"needs --device {' or '.join(sorted(set(wanted)))}; this run uses --device {selected}")


@pytest.fixture(scope="session")
def device_name(request: pytest.FixtureRequest) -> str:
    """The ``--device`` value (default ``cpu``)."""
    return request.config.getoption("--device") or "cpu"


@pytest.fixture(scope="session")
def driver_under_test(request: pytest.FixtureRequest, device_name: str):
    """The :class:`~omni_backends.testing.kit.DriverUnderTest` for ``--device``
    (loaded once; problems recorded, not raised)."""
    from omni_backends.testing.kit import load_driver

    return _dut_cache(request.config, device_name, load_driver)


def _dut_cache(config: pytest.Config, device_name: str, load: Any) -> Any:
    dut = getattr(config, "_omni_dut", None)
    if dut is None:
        dut = load(device_name)
        config._omni_dut = dut  # type: ignore[attr-defined]
    return dut


@pytest.fixture(scope="session")
def backend(driver_under_test):
    """The instantiated driver under test.

    Fails (naming the contract) when the driver cannot be loaded, is
    incomplete (an abstract method, or a kit operation of
    :class:`~omni_backends.testing.kit_ops.KitOps`: contract ``kit-ops``), or
    probes usable but cannot be instantiated; skips, with the
    probe's reason, when its device is absent or it cannot be instantiated
    on a host where its own probe says it is not usable.
    """
    dut = driver_under_test
    dut.fail_if_unusable()
    if dut.backend is None:
        from omni_backends.testing.kit import check_interface

        check_interface(dut.cls)  # names the missing abstract methods
        probe = dut.probe
        if probe is not None and not probe.usable:  # the driver itself says it cannot run here
            pytest.skip(f"driver {dut.name!r} cannot be instantiated here ({dut.instantiate_error}); probe: "
                        f"{probe.state.value}: {probe.reason}" + (f"; to fix: {probe.fix}" if probe.fix else ""))
        pytest.fail(f"driver {dut.name!r} probes usable but could not be instantiated: {dut.instantiate_error}",
                    pytrace=False)
    if not dut.present:
        pytest.skip(dut.absent_reason)
    from omni_backends.testing.kit import check_kit_ops

    check_kit_ops(type(dut.backend))  # a kit operation missing: every test on the device names 'kit-ops'
    return dut.backend


@pytest.fixture(scope="session")
def capabilities(backend):
    """``backend.capabilities()`` (a :class:`~omni_backends.backend.Capabilities`)."""
    return backend.capabilities()


class JsonReport:
    """Collects one outcome per test and writes the ``--omni-report`` JSON at session end.

    Layout: ``{"kit": {version, interface_version, source_url, commit, requested_revision, editable, dirty,
    command, python, host, started, duration_s, exitstatus}, "driver": {...}, "summary": {"passed": n, ...},
    "ordering": {"synchronous_copies", "checks": [...]} (:meth:`ordering`),
    "tests": [{"nodeid", "outcome", "tier", "duration_s", "reason"}]}``;
    ``outcome`` is ``passed``/``failed``/``skipped``/``error`` (setup or
    teardown failure) and ``reason`` carries the skip reason or failure message.
    """

    def __init__(self, config: pytest.Config, path: str) -> None:
        self.config = config
        self.path = path
        self.tests: dict[str, dict[str, Any]] = {}
        self.properties: dict[str, list[tuple[str, Any]]] = {}
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        rec = self.tests.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": None, "reason": None,
                                                    "duration_s": 0.0, "tier": _tier(report)})
        if report.user_properties:
            self.properties[report.nodeid] = list(report.user_properties)
        rec["duration_s"] = round(rec["duration_s"] + report.duration, 4)
        if report.skipped:
            rec["outcome"] = "skipped"
            rec["reason"] = _skip_reason(report)
        elif report.failed:
            rec["outcome"] = "failed" if report.when == "call" else "error"
            rec["reason"] = _failure_message(report)
        elif report.when == "call" and rec["outcome"] is None:
            rec["outcome"] = "passed"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from omni_backends.testing.kit import load_driver

        device = self.config.getoption("--device") or "cpu"
        try:
            driver = _dut_cache(self.config, device, load_driver).describe()
        except Exception as exc:  # the report still lists every test
            driver = {"requested": device, "error": f"driver could not be described: {type(exc).__name__}: {exc}"}
        tests = list(self.tests.values())
        summary: dict[str, int] = {}
        for t in tests:
            summary[t["outcome"] or "unknown"] = summary.get(t["outcome"] or "unknown", 0) + 1
        from omni_backends.testing.kit import kit_provenance

        doc = {
            "kit": {
                # the kit this driver was certified against: omni-backends' version, interface version and the
                # source it was installed from (a git commit where pip recorded one)
                **kit_provenance(),
                "command": " ".join(sys.argv),
                "python": platform.python_version(),
                "host": platform.node(),
                "started": self.started,
                "duration_s": round(time.time() - self.started, 3),
                "exitstatus": int(exitstatus),
            },
            "driver": driver,
            "summary": summary,
            "ordering": self.ordering(driver),
            "tests": tests,
        }
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, default=str)

    def ordering(self, driver: dict[str, Any]) -> dict[str, Any]:
        """The report's ``ordering`` section: the driver's declared ``synchronous_copies`` and, per check that
        relies on ``queue_copy`` leaving a copy in flight (the suite records them through ``record_property``:
        ``omni_backends.testing.suite._helpers.ordering_check`` / ``queue_in_flight``), its ``contract``,
        ``outcome``, ``reason``, ``copies_queued`` / ``copies_in_flight`` (copies it queued / shown still in
        flight before it relied on them), ``evidence`` (what showed them in flight: ``destination`` and/or
        ``stream query``) and ``in_flight``: True when every copy it relied on was shown in flight, False when
        one was not (the check failed ``kit-ops``), None when it queued none (skipped, or failed before)."""
        from omni_backends.testing.kit import IN_FLIGHT, IN_FLIGHT_EVIDENCE, ORDERING_CHECK

        checks = []
        for nodeid, props in self.properties.items():
            contract = next((v for k, v in props if k == ORDERING_CHECK), None)
            if contract is None:
                continue
            shown = [bool(v) for k, v in props if k == IN_FLIGHT]
            evidence = sorted({str(v) for k, v in props if k == IN_FLIGHT_EVIDENCE})
            test = self.tests.get(nodeid, {})
            checks.append({"nodeid": nodeid, "contract": contract, "outcome": test.get("outcome"),
                           "in_flight": all(shown) if shown else None, "copies_queued": len(shown),
                           "copies_in_flight": sum(shown), "evidence": evidence, "reason": test.get("reason")})
        caps = driver.get("capabilities") if isinstance(driver.get("capabilities"), dict) else {}
        return {"synchronous_copies": caps.get("synchronous_copies"), "checks": checks}


def _tier(report: pytest.TestReport) -> str | None:
    keywords = report.keywords
    for tier in ("device_tier", "engine_tier"):
        if tier in keywords:
            return tier
    return None


def _skip_reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2]).removeprefix("Skipped: ")
    return str(lr)


def _failure_message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(report.longrepr)[-2000:]
