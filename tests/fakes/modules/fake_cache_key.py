"""``python -m fake_cache_key``: print the stevedore entry-point cache file this
interpreter (same sys.path as ``python -m omni_backends.cli``) reads and writes."""

import os
import sys

from stevedore import _cache

digest, _ = _cache._hash_settings_for_path(tuple(sys.path))
print(os.path.join(_cache._c._dir, digest))
