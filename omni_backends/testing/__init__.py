"""Conformance kit for omni-backends drivers (a pytest plugin: ``pytest --device NAME``)."""
