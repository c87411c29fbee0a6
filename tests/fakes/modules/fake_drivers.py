"""Fake omni-backends drivers, registered by tests through real ``*.dist-info``
entry-point metadata (see ``tests/fakes/sites.py``). Registry logic only: a
fake never stands in for the claim that a real driver works.

They subclass the cpu driver so that ``select()`` can instantiate them; only
identity and ``probe()`` differ. Importing this module imports no torch/vLLM.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from omni_backends.backend import Backend, ProbeResult, ProbeState, Verification
from omni_backends.cpu.driver import CpuBackend


class _Fake(CpuBackend):
    vendor_requirements: ClassVar[dict[str, str]] = {}
    verification = (Verification.SIMULATED,)
    state: ClassVar[ProbeState] = ProbeState.USABLE
    why: ClassVar[str] = "fake device present"

    @classmethod
    def probe(cls) -> ProbeResult:
        fix = "" if cls.state is ProbeState.USABLE else "plug in the fake device"
        return ProbeResult(cls.state, cls.why, {"fake-vendor": "1.0"}, fix=fix, device_count=int(cls.state is ProbeState.USABLE))


class NoDeviceBackend(_Fake):
    """Vendor package imports, but it reports no device: not usable."""

    name = "nodev"
    priority = 50
    state = ProbeState.IMPORTABLE
    why = "fake vendor package imports but reports 0 devices"


class UsableLowBackend(_Fake):
    name = "usable-low"
    priority = 40


class TieABackend(_Fake):
    name = "tie-a"
    priority = 60


class TieBBackend(_Fake):
    name = "tie-b"
    priority = 60


class AliasBackend(_Fake):
    """Reached as ``--device fancy`` or any case of its alias ``Shiny``."""

    name = "fancy"
    aliases = ("shiny",)
    priority = 5


class FutureInterfaceBackend(_Fake):
    name = "future"
    priority = 70
    interface_versions = (99,)


class NotABackend:
    """An entry point whose object is not a Backend subclass."""


class ProbeRaisesBackend(_Fake):
    """A third-party probe that breaks its promise and raises."""

    name = "probe-raises"
    priority = 65

    @classmethod
    def probe(cls) -> ProbeResult:
        raise RuntimeError("fake probe exploded")


class CountingBackend(_Fake):
    """Counts constructions; the constructor is slow to widen any race window."""

    name = "counting"
    priority = 1
    instances: ClassVar[int] = 0
    _count_lock = threading.Lock()

    def __init__(self) -> None:
        time.sleep(0.05)
        with CountingBackend._count_lock:
            CountingBackend.instances += 1


class ReentrantInitBackend(_Fake):
    """A constructor that (wrongly) selects again."""

    name = "reenter-init"
    priority = 1

    def __init__(self) -> None:
        import omni_backends

        omni_backends.select()


class ReentrantProbeBackend(_Fake):
    """A probe that (wrongly) selects again."""

    name = "reenter-probe"
    priority = 1

    @classmethod
    def probe(cls) -> ProbeResult:
        import omni_backends

        omni_backends.select()
        return super().probe()


class HeavyCapabilitiesBackend(_Fake):
    """Its capabilities() imports torch: not cheap, so `devices` must skip it."""

    name = "heavy-caps"
    priority = 2

    def capabilities(self):
        import torch  # noqa: F401

        return super().capabilities()


class IncompleteBackend(Backend):
    """Identity and probe only (like an in-tree driver before its full issue lands)."""

    name = "incomplete"
    device_type = "cpu"
    dist_backend = "gloo"
    visible_devices_env = None
    priority = 3
    vllm_device_type = "cpu"
    verification = (Verification.SIMULATED,)

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(ProbeState.USABLE, "fake device present", {})


class ProbeLogBackend(_Fake):
    """Appends a line to ``$FAKE_PROBE_LOG`` on every probe (to count probes per command)."""

    name = "probe-log"
    priority = 4

    @classmethod
    def probe(cls) -> ProbeResult:
        import os

        with open(os.environ["FAKE_PROBE_LOG"], "a") as f:
            f.write("probe\n")
        return super().probe()


class ScalarInterfaceBackend(_Fake):
    """Declares its interface version as a bare int instead of a tuple."""

    name = "scalar-interface"
    priority = 6
    interface_versions = 1


class NoIdentityBackend(Backend):
    """Forgets part of its identity: no device_type, and a priority that is not an int."""

    name = "no-identity"
    dist_backend = "gloo"
    visible_devices_env = None
    priority = "high"
    vllm_device_type = "cpu"

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(ProbeState.USABLE, "fake device present", {})
