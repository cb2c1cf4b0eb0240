"""`verl_search.training.progress`: a trainer run's exit code, and the error of a failed one, which quotes the end
of its log (the quickstart's GRPO and cold-start stages raise it; in CI the log folder is gone by the time anyone
reads the error). The trainer here is a real child process that prints and fails, not verl: what is tested is the
log and the message, which do not depend on what the child is."""

from __future__ import annotations

import sys

from verl_search.training.progress import EXCERPT_LINE_CHARS, EXCERPT_LINES, failure_message, run_logged

FAILING = "import sys\nfor i in range(100):\n    print(f'line {i}')\nprint('x' * 5000)\nsys.exit('ValueError: boom')"


def test_a_failed_runs_error_quotes_the_end_of_its_log(tmp_path):
    log = tmp_path / "train.log"
    code = run_logged([sys.executable, "-u", "-c", FAILING], {}, log, tmp_path / "metrics.jsonl", 2, "test")
    assert code == 1
    message = failure_message(f"GRPO training failed (exit {code})", log)
    head, _, excerpt = message.partition("\n")
    assert head == f"GRPO training failed (exit 1); its output is in {log}, which ends:"
    lines = excerpt.split("\n")
    assert len(lines) == EXCERPT_LINES
    assert lines[-1] == "    ValueError: boom"  # the child's stderr is in the log too
    assert lines[-2] == "    " + "x" * EXCERPT_LINE_CHARS + " [...]"  # a long line is cut, and says so
    assert lines[0] == f"    line {100 - EXCERPT_LINES + 2}"
    assert "line 0\n" not in message


def test_a_missing_log_and_an_empty_one_are_named_as_such(tmp_path):
    missing, empty = tmp_path / "none.log", tmp_path / "empty.log"
    assert failure_message("failed", missing) == f"failed; it wrote no log ({missing} does not exist)"
    empty.write_text("")
    assert failure_message("failed", empty) == f"failed; its output is in {empty} (empty)"


def test_an_error_raised_while_the_trainer_runs_stops_it(tmp_path):
    """`while_running` raising (run_grpo's check-config verdict) terminates a trainer that would run for minutes,
    and the error reaches the caller; until it raises the trainer keeps running."""
    import time

    import pytest

    calls = []

    def verdict() -> None:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("check-config found problems")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="check-config found problems"):
        run_logged([sys.executable, "-u", "-c", "import time\nprint('started')\ntime.sleep(600)"], {},
                   tmp_path / "train.log", tmp_path / "metrics.jsonl", 2, "test", while_running=verdict)
    assert len(calls) == 2
    assert time.monotonic() - started < 60  # terminated (SIGTERM ends a sleeping child at once), not waited for
    assert (tmp_path / "train.log").read_text().splitlines()[-1] == "started"
