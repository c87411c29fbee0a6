"""The shared capture-size policy (device tier; no device work)."""

from __future__ import annotations

import pytest

from omni_backends import backend as backend_module
from omni_backends.backend import capture_sizes
from omni_backends.testing.kit import expect

pytestmark = pytest.mark.device_tier

#: vLLM's default cudagraph ladder, as documented (VllmConfig._set_cudagraph_sizes).
_VLLM_LADDER_SMALL = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


@pytest.mark.parametrize("max_batch", [1, 2, 3, 5, 8, 9, 63, 64, 255, 256, 257, 300, 512])
def test_policy_properties(max_batch):
    sizes = capture_sizes(max_batch)
    expect(sizes == sorted(set(sizes)), "capture-sizes", f"capture_sizes({max_batch}) not strictly increasing: {sizes}")
    expect(sizes[0] == 1 and sizes[-1] == max_batch, "capture-sizes",
           f"capture_sizes({max_batch}) must start at 1 and include max_batch: {sizes}")
    small = [s for s in _VLLM_LADDER_SMALL if s <= max_batch]
    expect(sizes[: len(small)] == small, "capture-sizes",
           f"capture_sizes({max_batch}) departs from vLLM's ladder {small}: {sizes}")
    big = [s for s in sizes if s >= 256 and s != max_batch]
    expect(all(s % 16 == 0 for s in big), "capture-sizes", f"sizes >= 256 must step by 16: {big}")
    expect(set(capture_sizes(max_batch + 40)) >= set(sizes) - {max_batch}, "capture-sizes",
           "a larger max_batch must capture every size a smaller one captures")


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_policy_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        capture_sizes(bad)


def test_driver_uses_the_shared_policy(backend):
    own = getattr(type(backend), "capture_sizes", None)
    expect(own is None or own is backend_module.capture_sizes, "capture-sizes",
           f"{type(backend).__qualname__} defines its own capture_sizes; every driver shares "
           "omni_backends.backend.capture_sizes")
