"""The shared capture-size policy (device tier; no device work)."""

from __future__ import annotations

import pytest

from omni_backends import backend as backend_module
from omni_backends.backend import capture_sizes
from omni_backends.testing.kit import expect

pytestmark = pytest.mark.device_tier

#: vLLM's default cudagraph ladder up to 1024, as documented (VllmConfig._set_cudagraph_sizes): 1, 2, 4, then
#: every 8 below 256, then every 16.
_VLLM_LADDER = [1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16)]


@pytest.mark.parametrize("max_batch", [1, 2, 3, 5, 8, 9, 12, 16, 20, 32, 63, 64, 255, 256, 257, 300, 512])
def test_policy_properties(max_batch):
    sizes = capture_sizes(max_batch)
    expect(sizes == sorted(set(sizes)), "capture-sizes", f"capture_sizes({max_batch}) not strictly increasing: {sizes}")
    expect(sizes[0] == 1 and sizes[-1] == max_batch, "capture-sizes",
           f"capture_sizes({max_batch}) must start at 1 and include max_batch: {sizes}")
    ladder = [s for s in _VLLM_LADDER if s <= max_batch]
    expect(set(sizes) == set(ladder) | {max_batch}, "capture-sizes",
           f"capture_sizes({max_batch}) must be vLLM's ladder up to max_batch ({ladder}) plus max_batch: {sizes}")
    expect(set(capture_sizes(max_batch + 40)) >= set(sizes) - {max_batch}, "capture-sizes",
           "a larger max_batch must capture every size a smaller one captures")


def test_policy_examples():
    for max_batch, want in ((12, [1, 2, 4, 8, 12]), (20, [1, 2, 4, 8, 16, 20])):
        expect(capture_sizes(max_batch) == want, "capture-sizes",
               f"capture_sizes({max_batch}) = {capture_sizes(max_batch)}; want {want}")
    expect(capture_sizes(257)[-3:] == [248, 256, 257], "capture-sizes",
           f"capture_sizes(257) ends {capture_sizes(257)[-3:]}; want [248, 256, 257]")


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_policy_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        capture_sizes(bad)


def test_driver_uses_the_shared_policy(backend):
    own = getattr(type(backend), "capture_sizes", None)
    expect(own is None or own is backend_module.capture_sizes, "capture-sizes",
           f"{type(backend).__qualname__} defines its own capture_sizes; every driver shares "
           "omni_backends.backend.capture_sizes")
