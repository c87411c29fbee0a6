"""The worker side of a selection: a vLLM worker process selects its parent's driver and checks it matches.

The parent side is :func:`omni_backends.registry.handoff.export_selection`.
"""

from __future__ import annotations

import json
import os

from omni_backends.errors import OmniBackendError
from omni_backends.registry.process import select
from omni_backends.registry.results import ENV_SELECTION, Selection


def verify_worker_selection(env: dict[str, str] | None = None) -> Selection:
    """In a vLLM worker process: select the parent's driver and check it matches.

    Reads ``OMNI_BACKENDS_SELECTION`` written by the parent. Raises
    :class:`OmniBackendError` naming both sides if this process resolves a
    different driver or different vendor versions.
    """
    env = os.environ if env is None else env
    raw = env.get(ENV_SELECTION)
    try:
        parent = json.loads(raw) if raw else None
        if parent is not None and not (isinstance(parent, dict) and {"name", "fingerprint"} <= parent.keys()):
            raise ValueError("expected an object with name, versions and fingerprint")
    except ValueError as exc:
        raise OmniBackendError(
            f"{ENV_SELECTION} holds no valid selection from the parent process ({exc}): {raw[:200]!r}. It is "
            f"written by omni_backends.select() in the parent; unset it to let this process select on its own."
        ) from exc
    try:
        sel = select(parent["name"] if parent else None, export=False, flag_name=ENV_SELECTION)
    except OmniBackendError as exc:  # this rank cannot run the parent's driver: say both sides
        if not parent:
            raise
        raise OmniBackendError(
            f"worker process cannot use the driver the parent selected, {parent['name']!r} (versions "
            f"{parent.get('versions')}, fingerprint {parent['fingerprint']}); in this worker: {exc}"
        ) from exc
    if parent and (parent["name"] != sel.name or parent["fingerprint"] != sel.fingerprint):
        raise OmniBackendError(
            f"worker process resolved driver {sel.name!r} (versions {sel.versions}, fingerprint {sel.fingerprint}) "
            f"but the parent selected {parent['name']!r} (versions {parent.get('versions')}, fingerprint "
            f"{parent['fingerprint']}). Every rank must see the same vendor stack: check the worker's environment."
        )
    return sel


__all__ = ["verify_worker_selection"]
