"""An engine released by the pipeline is freed then, not at interpreter exit (issue 38: ``run --device simdev``
printed "Exception ignored in AsyncLLM.__del__ ... TypeError" at exit).

The cause, reproduced without an engine: a vendor module that keeps the error of an optional import in a global
(``vllm.multimodal.media.audio`` keeps ``ModuleNotFoundError: torchcodec``) pins, through the traceback's frames,
whatever the frames that first imported it held -- ``AsyncLLM.__init__``'s ``self`` when that import happened
while an engine was being built.
"""

from __future__ import annotations

import gc
import sys
import textwrap
import weakref

from core.pipeline.release import PINNING_PACKAGES, unpin_stored_import_errors


class Engine:
    """Stands in for an ``AsyncLLM``."""


def _build() -> "weakref.ref[Engine]":
    engine = Engine()
    import omni_pin_fake.optional  # noqa: F401  first imported while a calling frame holds the engine

    return weakref.ref(engine)


def test_a_kept_import_error_no_longer_pins_the_engine_that_first_imported_its_module(tmp_path, monkeypatch):
    pkg = tmp_path / "omni_pin_fake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "optional.py").write_text(textwrap.dedent("""
        try:
            import omni_no_such_module  # an optional dependency that is not installed
        except ImportError as exc:
            KEPT = exc
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "omni_pin_fake", raising=False)
    ref = _build()
    gc.collect()
    assert ref() is not None, "the kept import error does not pin the frame: the cause is not reproduced"
    assert unpin_stored_import_errors(("omni_pin_fake",)) == 1
    gc.collect()
    assert ref() is None, "the engine is still pinned after its module's kept error lost its traceback"
    kept = sys.modules["omni_pin_fake.optional"].KEPT
    assert isinstance(kept, ImportError) and "omni_no_such_module" in str(kept)  # the error itself stays
    monkeypatch.delitem(sys.modules, "omni_pin_fake.optional")


def test_the_release_path_unpins_vllm_and_vllm_omni():
    import inspect

    from core.pipeline import release

    assert PINNING_PACKAGES == ("vllm", "vllm_omni")
    assert "unpin_stored_import_errors()" in inspect.getsource(release.release_engine)
