"""Fake driver distributions for registry/CLI tests (see :mod:`fakes.sites`).

They exercise registry logic only; they never stand in for a real driver.
"""
