"""Device tier (issue 5): torch-level tests of a driver on its real device.

Run: ``pytest --device cuda -m device_tier tests/device`` (on the H200, where
vLLM cannot be installed, these exercise the driver's torch-level parts:
device operations, the graph primitive, buffer copies, the capture-size
policy and the reference sampler). With ``--device cpu`` the same tests run
against the cpu driver where meaningful; tests of features the driver does
not have (static graphs, pinned memory) skip with the reason.

The driver is looked up by name in the installed drivers and instantiated
directly: the device tier tests a driver's device level even where its
vendor vLLM stack is absent (its probe then says "not usable", which is what
selection must say, but the device is there).
"""

from __future__ import annotations

import pytest


def _driver_class(name: str):
    from omni_backends import registry

    entries, _ = registry.discover()
    canonical = registry.resolve_name(name, entries)
    entry = entries[canonical]
    problem = registry.problem_of(entry)
    if problem:
        pytest.fail(f"driver {canonical!r} cannot be loaded: {problem}")
    return entry.cls


@pytest.fixture(scope="session")
def device_backend(request: pytest.FixtureRequest):
    """The ``--device`` driver, instantiated; skips when its device is absent."""
    name = request.config.getoption("--device", default=None) or "cpu"
    cls = _driver_class(name)
    backend = cls()
    try:
        count = backend.device_count()
    except Exception as exc:  # torch without this device's support
        pytest.skip(f"--device {name}: no {cls.device_type} device usable by torch here ({exc})")
    if count == 0:
        probe = cls.probe()
        pytest.skip(f"--device {name}: torch sees no {cls.device_type} device here (probe: {probe.reason})")
    return backend


@pytest.fixture(scope="session")
def torch_mod():
    return pytest.importorskip("torch")



@pytest.fixture(scope="session")
def pinned_pair(device_backend, torch_mod):
    """Factory ``(shape, dtype=float32, fenced=True) -> buffer``: a
    ``vllm.v1.utils.CpuGpuBuffer`` when vLLM is importable, else
    :class:`omni_backends.torch_device.TorchCpuGpuBuffer` (vLLM cannot be installed on the H200);
    pinned where the driver pins; wrapped by the driver's ``fence_buffer``
    when ``fenced`` and the driver has one."""
    torch = torch_mod
    pin = device_backend.capabilities().pinned_memory
    try:
        from vllm.v1.utils import CpuGpuBuffer as cls
    except Exception:  # no vLLM here (H200), or a vLLM that cannot load on this host
        from omni_backends.torch_device import TorchCpuGpuBuffer as cls

    def make(shape, dtype=None, fenced=True):
        dtype = dtype or torch.float32
        buf = cls(*shape, dtype=dtype, device=device_backend.device(), pin_memory=pin,
                  with_numpy=dtype != torch.bfloat16)
        if fenced and hasattr(device_backend, "fence_buffer"):
            return device_backend.fence_buffer(buf)
        return buf

    return make
