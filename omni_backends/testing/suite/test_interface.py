"""Interface contract: completeness, version, identity, probe (no device needed)."""

from __future__ import annotations

import pytest

from omni_backends.backend import INTERFACE_VERSION, Capabilities, ProbeResult
from omni_backends.testing.kit import ContractViolation, check_interface, expect

pytestmark = pytest.mark.device_tier


@pytest.fixture(scope="module")
def driver_cls(driver_under_test):
    driver_under_test.fail_if_unusable()
    return driver_under_test.cls


def test_every_abstract_method_is_implemented(driver_cls):
    check_interface(driver_cls)


def test_interface_version_declared(driver_cls):
    expect(
        INTERFACE_VERSION in driver_cls.interface_versions,
        "interface-version",
        f"{driver_cls.__qualname__}.interface_versions = {list(driver_cls.interface_versions)}",
    )


def test_identity_is_data(driver_cls, driver_under_test):
    ident = driver_cls.identity()
    expect(ident["name"] == driver_under_test.name, "interface-completeness",
           f"entry-point name {driver_under_test.name!r} differs from {driver_cls.__qualname__}.name={ident['name']!r}")
    for key in ("device_type", "dist_backend"):
        expect(isinstance(ident[key], str) and ident[key], "interface-completeness", f"{key} must be a non-empty str")
    expect(isinstance(ident["priority"], int), "interface-completeness", "priority must be an int")


def test_probe_returns_result(driver_cls):
    try:
        result = driver_cls.probe()
    except Exception as exc:
        raise ContractViolation("probe", f"probe() raised {type(exc).__name__}: {exc}; a probe catches every "
                                "exception and reports it in ProbeResult.error") from exc
    expect(isinstance(result, ProbeResult), "probe", f"probe() returned {type(result).__name__}")
    expect(result.reason, "probe", "ProbeResult.reason is empty: say what was found")
    if not result.usable:
        expect(result.fix, "probe", f"probe says {result.state.value} ({result.reason}) but gives no fix")


def test_capabilities_are_declared(backend):
    caps = backend.capabilities()
    expect(isinstance(caps, Capabilities), "interface-completeness", f"capabilities() returned {type(caps).__name__}")
    if caps.events:
        expect(type(backend).new_event is not _base("new_event"), "interface-completeness",
               "capabilities() declares events but new_event() is Backend's default, which raises")


def _base(name):
    from omni_backends.backend import Backend

    return getattr(Backend, name)
