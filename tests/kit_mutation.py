"""Run the conformance kit's device tier on several drivers in ONE Python process (the kit's mutation test,
``tests/test_kit.py``): torch and vLLM are imported once, so each further driver costs only its tests.

    python tests/kit_mutation.py OUT_DIR NAME [NAME ...]

For each driver NAME: ``pytest --pyargs omni_backends.testing.suite -m device_tier --device NAME
--omni-report OUT_DIR/NAME.json`` through ``pytest.main``, its terminal output in ``OUT_DIR/NAME.out`` and its
exit status in ``OUT_DIR/NAME.rc``. Every driver is run whatever the others gave.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest


def run(out: Path, name: str) -> int:
    buf = io.StringIO()
    args = ["-p", "no:cacheprovider", "-q", "-rs", "--pyargs", "omni_backends.testing.suite", "-m", "device_tier",
            "--device", name, "--omni-report", str(out / f"{name}.json")]
    with contextlib.redirect_stdout(buf):
        rc = int(pytest.main(args))
    (out / f"{name}.out").write_text(buf.getvalue())
    (out / f"{name}.rc").write_text(str(rc))
    return rc


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[1:]:
        run(out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
