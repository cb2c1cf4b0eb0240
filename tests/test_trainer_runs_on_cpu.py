"""tests/trainer_runs.py: trainer runs take turns, and a run Ray reports out of memory, or past its time, is ended
at once with every process it started."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from tests import trainer_runs
from tests.trainer_runs import RAY_MEMORY_KILL, run_trainer
from tests.waiting import wait_until

# a parent that starts a child sleeping for a minute, writes the child's pid, then prints `message` and sleeps
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(child.pid))
print(sys.argv[2], flush=True)
time.sleep(60)
"""


@pytest.fixture(autouse=True)
def own_lock(tmp_path, monkeypatch):
    """A lock file of this test's own: README's test command runs these tests beside the suite's trainer runs, whose
    turn (the shared `ENGINE_LOCK`) they would otherwise wait for."""
    monkeypatch.setattr(trainer_runs, "ENGINE_LOCK", tmp_path / "trainer.lock")
    monkeypatch.setenv(trainer_runs.TURNS_ENV, str(tmp_path / "turns.jsonl"))  # not the run's table either


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a killed child not yet reaped by its killed parent is a zombie
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_run_that_ray_reports_out_of_memory_is_ended_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    message = f"(raylet) 3 Workers (tasks / actors) {RAY_MEMORY_KILL} (OOM)"
    started = time.monotonic()
    code, log = run_trainer([sys.executable, "-c", PARENT, str(pid_file), message], dict(os.environ), tmp_path,
                            tmp_path / "train.log", timeout=120)
    assert time.monotonic() - started < 30
    assert code == -9
    assert message in log and f"killed the run's process group: Ray reported workers {RAY_MEMORY_KILL}" in log
    assert log == (tmp_path / "train.log").read_text()
    child = int(pid_file.read_text())
    wait_until(lambda: not alive(child), 10, f"the run's child process {child} ended")


def test_a_run_past_its_time_is_ended(tmp_path):
    code, log = run_trainer([sys.executable, "-c", PARENT, str(tmp_path / "child.pid"), "training"],
                            dict(os.environ), tmp_path, tmp_path / "train.log", timeout=8)
    assert code == -9
    assert log.startswith("training") and "killed the run's process group: the run passed its 8 s" in log
    child = int((tmp_path / "child.pid").read_text())
    wait_until(lambda: not alive(child), 10, f"the run's child process {child} ended")


def test_runs_take_turns(tmp_path):
    spans = {}

    def one(name: str) -> None:
        code, _ = run_trainer([sys.executable, "-c", "import time; time.sleep(1.5)"], dict(os.environ), tmp_path,
                              tmp_path / f"{name}.log", timeout=60)
        spans[name] = (code, time.monotonic())

    threads = [threading.Thread(target=one, args=(name,)) for name in ("a", "b")]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [code for code, _ in spans.values()] == [0, 0]
    first, second = sorted(end for _, end in spans.values())
    # one after the other: the second ended at least a run's length (1.5 s) after the first
    assert second - first >= 1.4 and first - started >= 1.4, (started, first, second)
    # each turn is recorded: both held it about a run's length, the second waited about as long for it
    lines = trainer_runs.turns_table(tmp_path / "turns.jsonl", started)
    assert len(lines) == 3 and lines[-1].startswith("held in all: ") and lines[-1].endswith(" in 2 turn(s)"), lines
    waited = [float(line.split("waited")[1].split()[0]) for line in lines[:2]]
    held = [float(line.split("held")[1].split()[0]) for line in lines[:2]]
    assert waited[0] < 1 and waited[1] >= 1 and min(held) >= 1, lines
    assert all(line.endswith("test_runs_take_turns (call)") for line in lines[:2]), lines


def test_a_run_that_trains_nothing_does_not_wait_for_the_turn(tmp_path):
    from tests.trainer_runs import one_engine_at_a_time

    with one_engine_at_a_time():  # a trainer run holds the turn
        code, log = run_trainer([sys.executable, "-c", "print('exported')"], dict(os.environ), tmp_path,
                                tmp_path / "export.log", timeout=30, take_turn=False)
    assert code == 0 and log == "exported\n"
