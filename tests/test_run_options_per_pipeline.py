"""``omni-backends run`` never silently ignores an option: one the chosen pipeline does not read (the demo's with
``--model``, a checkpoint's without it) is a usage error naming it and the option to use, before any engine or
model file is touched (the model paths here do not exist, so a run that got past the options fails there, on
another message)."""

from __future__ import annotations

import pytest

from omni_backends.cli import main

MISSING = "/nonexistent/omni-backends-test-model"


@pytest.mark.parametrize("argv, names", [
    (["--model", MISSING, "--max-tokens", "5"], ("--max-tokens", "--max-new-tokens")),
    (["--model-dir", MISSING, "--max-new-tokens", "5"], ("--max-new-tokens", "needs --model", "--max-tokens")),
    (["--model-dir", MISSING, "--language", "English"], ("--language", "needs --model")),
    (["--model-dir", MISSING, "--instructions", "calm"], ("--instructions", "needs --model")),
    (["--model-dir", MISSING, "--task-type", "CustomVoice"], ("--task-type", "needs --model")),
    (["--model-dir", MISSING, "--voice", "vivian"], ("--voice", "needs --model")),
])
def test_an_option_the_pipeline_does_not_read_is_a_usage_error_naming_it(argv, names, capsys):
    status = main(["run", "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert status == 2, err
    line = [x for x in err.splitlines() if x.startswith("omni-backends: error:")]
    assert len(line) == 1 and all(n in line[0] for n in names), err


def test_the_demo_keeps_its_numeric_voice_and_max_tokens(capsys):
    """The control: the demo's own options pass the check (and fail only on the missing models folder)."""
    status = main(["run", "--device", "cpu", "--model-dir", MISSING, "--voice", "1", "--max-tokens", "4"])
    err = capsys.readouterr().err
    assert status == 2 and MISSING in err and "needs --model" not in err, err
