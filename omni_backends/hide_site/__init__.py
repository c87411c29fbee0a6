"""A ``sitecustomize`` for the child processes of a process that hid vendor packages.

:func:`omni_backends.registry.export_selection` puts this directory first on
``PYTHONPATH`` only when :data:`omni_backends.probing.ENV_HIDDEN` names hidden
packages, so that fresh interpreters that vLLM starts itself (``python -m
vllm.model_executor.models.registry`` inspecting a model, ...) hide them too,
before ``import vllm`` can reach them. Importing this package does nothing.
"""
