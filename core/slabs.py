"""Host (and device) memory for the steps' outputs: :class:`HostSlabs` (a few large host slabs, one open per
trailing shape and dtype, instead of one tensor per step) and :class:`DeviceSlabs` (the same on the forward's
device). The worker's step rows (``core.hooks.step_rows``) and the front end's step log (``core.step_log``) each
hold their own.
"""

from __future__ import annotations

import torch


class HostSlabs:
    """Host memory for the steps' outputs: rows are copied into a few large slabs (one open slab per trailing
    shape and dtype, append-only), each step's rows a view of one slab, instead of one new tensor per step.

    Why: a step's host copy lives until every request that has rows in it read them (``FINAL_ONLY``: at its
    finish, many steps later); one allocation per step kept that long made vLLM's own forward measurably
    slower on cpu (``bench/RESULTS.md``, decode overhead), and a page-locked
    allocation per step costs a driver call. A slab is never written twice: when its rows are used up a new
    one is opened (``max(rows, n)`` rows), the old one freed by the allocator once no view of it is left.
    ``pin``: page-locked slabs (for non-blocking device-to-host copies).
    """

    __slots__ = ("rows", "pin", "_open")
    #: one open slab per device too (:class:`DeviceSlabs`); host slabs: per trailing shape and dtype
    by_device = False

    def __init__(self, rows: int = 4096, pin: bool = False) -> None:
        self.rows, self.pin = int(rows), pin
        self._open: dict[tuple, list] = {}  # (trailing shape, dtype) -> [slab, next free row]

    def copy(self, t: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """A host view ``[n, ...]`` holding ``t``'s rows (``t``: ``[n, ...]``, any device); ``non_blocking``:
        the copy may still be in flight (the caller fences it)."""
        slab, at, view = self._place(t, non_blocking)
        view._omni_slab = (slab, at)  # type: ignore[attr-defined]  # read by StepLog.extend (same process only)
        return view

    def place(self, t: torch.Tensor, non_blocking: bool = False) -> tuple[torch.Tensor, int]:
        """:meth:`copy` as ``(slab, first row)``. (A view :meth:`copy` returns carries that pair as its
        ``_omni_slab`` attribute, a Python attribute that does not survive serialisation.)"""
        return self._place(t, non_blocking)[:2]

    def _place(self, t: torch.Tensor, non_blocking: bool) -> tuple[torch.Tensor, int, torch.Tensor]:
        """``(slab, first row, the view of the rows)``, ``t`` copied in (one slice of the slab: a tensor
        index is a few microseconds of host time, once per step and output)."""
        n = t.shape[0]
        key = (t.shape[1:], t.dtype, t.device) if self.by_device else (t.shape[1:], t.dtype)
        entry = self._open.get(key)
        if entry is None or entry[1] + n > entry[0].shape[0]:
            entry = self._open[key] = [self._new_slab(t, max(self.rows, n)), 0]
        slab, at = entry
        view = slab[at : at + n]
        view.copy_(t, non_blocking=non_blocking)
        entry[1] = at + n
        return slab, at, view

    def _new_slab(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.empty((rows, *t.shape[1:]), dtype=t.dtype, pin_memory=self.pin)


class DeviceSlabs(HostSlabs):
    """:class:`HostSlabs` on the device of the tensors copied in (one open slab per trailing shape, dtype and
    device): a step's rows kept where the forward made them, for a caller in the same process
    (:class:`~core.hooks.step_rows.StepRowsCollector`'s ``outputs_on_device``). The copy is a device-to-device
    copy on the current stream: a later read on that stream needs no fence."""

    __slots__ = ()
    by_device = True

    def _new_slab(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        return t.new_empty((rows, *t.shape[1:]))
