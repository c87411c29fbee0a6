"""Driver discovery (stevedore) and device selection: which driver a process uses, and why.

One package, one module per job, imported in this order (each only imports
the ones above it):

- :mod:`~omni_backends.registry.results`: what discovery and selection
  produce (:class:`DriverEntry`, :class:`Candidate`, :class:`Selection`) and
  the environment variables the registry reads;
- :mod:`~omni_backends.registry.metadata`: entry points as found in the wild,
  every ``.dist-info`` / ``.egg-info`` record on ``sys.path``;
- :mod:`~omni_backends.registry.discovery`: :func:`discover` /
  :func:`load_plugins` (stevedore with an ``on_load_failure_callback``; a
  corrupt or stale entry-point cache is bypassed) and :func:`problem_of`;
- :mod:`~omni_backends.registry.decision`: names and aliases
  (:func:`resolve_name`), the precedence ``--device`` >
  ``OMNI_BACKENDS_DEVICE`` > auto-detect, probing (:func:`safe_probe`) and
  :func:`decide`, which binds nothing;
- :mod:`~omni_backends.registry.vendor_modules`: hiding the other drivers'
  vendor packages that raise on import (``torch_npu`` without CANN);
- :mod:`~omni_backends.registry.handoff`: :func:`export_selection` for
  child processes;
- :mod:`~omni_backends.registry.process`: the process-global selection,
  :func:`select` (once, under a lock, never re-entered), :func:`current`,
  :func:`get_backend`;
- :mod:`~omni_backends.registry.workers`: :func:`verify_worker_selection`
  in a vLLM worker process;
- :mod:`~omni_backends.registry.report`: :func:`devices_report` and
  :func:`cheap_capabilities` (the ``devices`` command), binding nothing.

Every public name is importable from ``omni_backends.registry`` as before the
split; the most used (:func:`select`, :func:`current`, :func:`get_backend`)
also from ``omni_backends``.
"""

from omni_backends.registry.results import AUTO, ENV_DEVICE, ENV_SELECTION, NAMESPACE, Candidate, DriverEntry, Selection
from omni_backends.registry.discovery import discover, load_declared, load_plugins, problem_of
from omni_backends.registry.decision import decide, resolve_name, safe_probe
from omni_backends.registry.vendor_modules import vendor_modules_of
from omni_backends.registry.handoff import export_selection
from omni_backends.registry.process import _reset_for_tests, current, get_backend, select  # noqa: F401 (tests)
from omni_backends.registry.workers import verify_worker_selection
from omni_backends.registry.report import HEAVY_MODULES, cheap_capabilities, devices_report

__all__ = [
    "AUTO",
    "ENV_DEVICE",
    "ENV_SELECTION",
    "HEAVY_MODULES",
    "NAMESPACE",
    "Candidate",
    "DriverEntry",
    "Selection",
    "cheap_capabilities",
    "current",
    "decide",
    "devices_report",
    "discover",
    "export_selection",
    "get_backend",
    "load_declared",
    "load_plugins",
    "problem_of",
    "resolve_name",
    "safe_probe",
    "select",
    "vendor_modules_of",
    "verify_worker_selection",
]
