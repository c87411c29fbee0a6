"""A fake driver module whose import raises RuntimeError (a vendor init check failing)."""


def _check_vendor_runtime() -> None:
    raise RuntimeError("fake vendor runtime refused to initialise: driver version mismatch")


_check_vendor_runtime()
