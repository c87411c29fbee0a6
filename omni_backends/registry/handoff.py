"""Handing the parent's selection to its child processes (vLLM's workers) through the environment.

The worker side is :func:`omni_backends.registry.workers.verify_worker_selection`.
"""

from __future__ import annotations

import json
import os

from omni_backends.registry.results import ENV_DEVICE, ENV_SELECTION, Selection

#: the directory whose ``sitecustomize`` hides the parent's hidden vendor packages in fresh interpreters
HIDE_SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hide_site")


def export_selection(sel: Selection, env: dict[str, str] | None = None) -> dict[str, str]:
    """Write the selection into ``env`` (default ``os.environ``) for child processes.

    Sets ``OMNI_BACKENDS_DEVICE``, ``OMNI_BACKENDS_SELECTION`` (name, versions,
    fingerprint), ``OMNI_BACKENDS_HIDDEN_VENDORS`` (the vendor packages this process
    hid because they raise on import, so workers hide them too; when there are
    any, ``omni_backends/hide_site`` goes first on ``PYTHONPATH``: its
    ``sitecustomize`` hides them in fresh interpreters that do not import
    omni_backends first), the driver's ``vllm_platform_env()`` and, where
    ``env`` has no value yet, its ``vllm_env_defaults()``. Returns what was set.
    """
    from omni_backends.probing import ENV_HIDDEN, hidden_vendor_packages

    env = os.environ if env is None else env
    values = {
        ENV_DEVICE: sel.name,
        ENV_SELECTION: json.dumps({"name": sel.name, "versions": sel.versions, "fingerprint": sel.fingerprint}),
        ENV_HIDDEN: json.dumps(hidden_vendor_packages()),
    }
    if hidden_vendor_packages():  # fresh interpreters vLLM starts itself hide them at start-up too
        shim = HIDE_SITE
        path = [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p and p != shim]
        values["PYTHONPATH"] = os.pathsep.join([shim, *path])
    if sel.backend is not None:
        values.update(sel.backend.vllm_platform_env())
        values.update({k: v for k, v in sel.backend.vllm_env_defaults().items() if k not in env})
    env.update(values)
    return values


__all__ = ["HIDE_SITE", "export_selection"]
