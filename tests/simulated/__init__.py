"""Simulated devices and recorded vendor signatures for CPU-only tests.

- :mod:`simulated.device`: a device made of CPU tensors whose copy engine
  completes host<->device copies late and out of order, plus a
  ``CpuGpuBuffer`` twin on it. Used to prove that a buffer / copy path honours
  "copies are not ordered" (Ascend H2D, XPU D2H).
- :mod:`simulated.vendor_signatures`: stand-ins with the exact signatures of
  vendor functions (recorded from the vendor sources named in each), whose
  bodies only record the call. ``tests/test_drift_vendor_sources.py`` checks
  them against the real sources when those are available.

These stand in for the device and the vendor stack only; they never stand in
for the claim that a real driver works on real hardware.
"""
