"""A streamed HTTP response read partly in a test keeps its iterator: ``next(r.iter_bytes())`` drops the generator
at once, and httpx closes the connection when it is dropped, so the test disconnects before it means to and its
health check races the server's abort (``test_serve_qwen3_tts``'s disconnect test failed on a fast machine).

Read from the sources (AST): ``next()`` called directly on an ``iter_*()`` call fails here.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
ITERATORS = ("iter_bytes", "iter_raw", "iter_text", "iter_lines", "aiter_bytes", "aiter_raw", "aiter_text",
             "aiter_lines")


def dropped_stream_iterators(source: str) -> list[int]:
    """Lines where ``next()`` / ``anext()`` is applied directly to a response's ``iter_*()`` / ``aiter_*()``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("next", "anext") and node.args:
            inner = node.args[0]
            if isinstance(inner, ast.Call) and getattr(inner.func, "attr", "") in ITERATORS:
                lines.append(node.lineno)
    return lines


def test_the_check_finds_a_dropped_iterator():
    assert dropped_stream_iterators("first = next(r.iter_bytes())\nchunks = r.iter_bytes()\nnext(chunks)\n") == [1]


def test_no_test_or_bench_drops_a_stream_iterator_it_reads_from():
    found = {str(p.relative_to(ROOT)): lines for d in ("tests", "bench", "core", "ci") for p in (ROOT / d).rglob("*.py")
             if (lines := dropped_stream_iterators(p.read_text()))}
    assert not found, f"keep the iterator in a name while the stream stays open: {found}"
