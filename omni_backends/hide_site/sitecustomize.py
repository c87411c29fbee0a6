"""Interpreter start-up hook (run only as the top-level ``sitecustomize``; see the package docstring).

Sets ``sys.modules[name] = None`` for every module named in ``OMNI_BACKENDS_HIDDEN_VENDORS`` (the
vendor packages the parent found raising on import), then runs the next ``sitecustomize`` on
``sys.path``, if there is one (it then replaces this module in ``sys.modules``). Standard library only;
never raises, prints nothing.
"""

import json
import os
import sys


def _hide() -> None:
    try:
        hidden = json.loads(os.environ.get("OMNI_BACKENDS_HIDDEN_VENDORS") or "{}")
    except ValueError:
        return
    for name in hidden if isinstance(hidden, dict) else ():
        if isinstance(name, str) and name.isidentifier() and sys.modules.get(name) is None:
            sys.modules[name] = None  # type: ignore[assignment]


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        # none to chain: this module stays ``sys.modules["sitecustomize"]`` (the import system pops that entry
        # when this import finishes; deleting it here made ``site`` print "Error in sitecustomize; KeyError")
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    try:
        _hide()
        _chain()
    except Exception:  # a start-up hook must not stop the interpreter
        pass
