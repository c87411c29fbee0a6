"""The conformance suite: ``pytest --pyargs omni_backends.testing.suite --device NAME -rs``.

Modules marked ``device_tier`` need only the driver's torch device; modules
marked ``engine_tier`` need the device's vLLM stack. Tests are chosen from
``backend.capabilities()``; every test that does not apply skips with its reason.
"""
