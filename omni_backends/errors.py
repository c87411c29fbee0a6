"""Errors raised by omni-backends, and the exit status each command gives for them. Every message says what to
do next."""

from __future__ import annotations

#: Exit statuses every ``omni-backends`` command follows (README, "Exit statuses").
EXIT_OK = 0
#: the request is valid but this environment cannot serve it: the device is not usable here, no driver is,
#: a driver or vendor package failed to import, vLLM resolved another platform
EXIT_UNAVAILABLE = 1
#: usage error: unknown command or option, an option value out of range, an unknown device name, bad input files
EXIT_USAGE = 2
#: a run failed after its engines started (a stage's worker died, ran out of memory, the model raised)
EXIT_RUN_FAILED = 3
EXIT_INTERRUPTED = 130


class OmniBackendError(RuntimeError):
    """Base class of every error this package raises on purpose."""


class UnknownDeviceError(OmniBackendError, ValueError):
    """A device name matches no installed driver."""


class DeviceNotUsableError(OmniBackendError):
    """An explicitly selected driver is installed but cannot run here.

    ``probe`` holds the driver's :class:`~omni_backends.backend.ProbeResult`.
    """

    def __init__(self, message: str, probe=None):
        super().__init__(message)
        self.probe = probe


class DuplicateDriverError(OmniBackendError):
    """Two distributions register a driver under the same name."""


class DriverLoadError(OmniBackendError):
    """A driver's entry point raised while being imported.

    The original exception is chained (``__cause__``) with its traceback.
    """


class IncompatibleDriverError(OmniBackendError):
    """A driver implements no Backend interface version this package speaks."""


class NoUsableDeviceError(OmniBackendError):
    """Auto-detection found no usable driver at all (not even ``cpu``)."""


class PlatformMismatchError(OmniBackendError):
    """vLLM resolved a platform other than the one the selected driver needs."""


class PlacementError(OmniBackendError):
    """A rank cannot be given a device of its own (too few visible devices,
    a malformed or duplicated visible-devices entry, a binding that differs
    from the mapping, or a different distributed backend). Raised by
    :mod:`omni_backends.placement` and by a driver's
    :meth:`~omni_backends.backend.Backend.parse_visible_devices`."""


class BadInputError(OmniBackendError, ValueError):
    """A user-supplied value (prompt, voice id, model dir, ...) is invalid."""


class VendorImportError(OmniBackendError):
    """A vendor package raised while being imported, reached through another
    package (torch's device-backend autoload, transformers' availability checks).

    ``package`` is its top-level module, ``distribution`` its distribution (or
    ``None``); the original exception is chained (``__cause__``).
    """

    def __init__(self, message: str, package: str | None = None, distribution: str | None = None):
        super().__init__(message)
        self.package = package
        self.distribution = distribution


class StageFailedError(OmniBackendError):
    """A pipeline stage failed after its engine started (worker died, out of
    memory, the model raised). ``stage`` names it; nothing was written."""

    def __init__(self, message: str, stage: str | None = None):
        super().__init__(message)
        self.stage = stage
