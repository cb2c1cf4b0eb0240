"""Progress of a trainer run (the cold start, GRPO): a step bar (tqdm: step, rate, ETA) read from the
metrics file verl's file logger writes (`VERL_FILE_LOGGER_PATH`), while the trainer's own output
goes to a log file."""

from __future__ import annotations

import json
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

REFRESH_S = 30
"""Seconds between redraws of a step bar while no step finishes (logs stay short)."""

EXCERPT_LINES = 40
"""Lines of a failed trainer's log quoted in the error (`log_excerpt`)."""

EXCERPT_LINE_CHARS = 400
"""Characters kept of each quoted line (Ray and Hydra print very long ones)."""


def logged_steps(metrics: Path) -> dict[int, dict]:
    """verl's file-logger lines by step (`VERL_FILE_LOGGER_PATH`); a torn last line is skipped."""
    steps: dict[int, dict] = {}
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            steps.setdefault(entry["step"], {}).update(entry["data"])
    return steps


def log_excerpt(log: Path, lines: int = EXCERPT_LINES) -> str:
    """The last `lines` lines (default `EXCERPT_LINES`) of a trainer's `log`, each cut to
    `EXCERPT_LINE_CHARS` characters and indented, for the error raised when the trainer failed: where it
    runs unattended (CI, a cluster job) the log folder is often gone by the time anyone reads the error.
    An empty string when the log is empty; the log is read line by line, only the last `lines` kept.

    Raises:
        FileNotFoundError: `log` does not exist."""
    with open(log, encoding="utf-8", errors="replace") as source:
        tail = deque(source, maxlen=lines)
    kept = [line.rstrip("\n") for line in tail]
    kept = [line if len(line) <= EXCERPT_LINE_CHARS else line[:EXCERPT_LINE_CHARS] + " [...]" for line in kept]
    return "\n".join("    " + line for line in kept)


def failure_message(what: str, log: Path) -> str:
    """`what` (e.g. "GRPO training failed (exit 1)"), where the whole output is, and the log's last lines
    (`log_excerpt`); says so when the log is empty or was never written."""
    if not log.is_file():
        return f"{what}; it wrote no log ({log} does not exist)"
    excerpt = log_excerpt(log)
    return f"{what}; its output is in {log}" + (f", which ends:\n{excerpt}" if excerpt else " (empty)")


def run_logged(command: list[str], env: dict, log: Path, metrics: Path, total: int, desc: str,
               while_running: Callable[[], None] | None = None) -> int:
    """Run `command` with its output appended to `log`, showing a step bar (tqdm: step, ETA) read
    from the trainer's `metrics` file; return its exit code.

    `while_running` (default none) is called every 2 seconds while the trainer runs; an exception it raises
    stops the trainer (terminated as on Ctrl-C, killed after 60 s) and propagates (`quickstart.grpo.run_grpo`
    checks the config that way while the trainer starts)."""
    from tqdm.auto import tqdm

    with open(log, "a", encoding="utf-8") as sink, tqdm(total=total, desc=desc, unit="step") as bar:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        drawn = time.monotonic()
        try:
            while process.poll() is None:
                time.sleep(2)
                if while_running is not None:
                    while_running()
                done = min(max(logged_steps(metrics), default=0), total)
                if done > bar.n:
                    bar.update(done - bar.n)
                    drawn = time.monotonic()
                elif time.monotonic() - drawn > REFRESH_S:
                    bar.refresh()  # the elapsed time moves on between steps (a line per redraw in a log)
                    drawn = time.monotonic()
        except BaseException:  # Ctrl-C or an error here: stop the trainer too, its checkpoints stay
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
        bar.update(max(0, min(max(logged_steps(metrics), default=0), total) - bar.n))
        return process.returncode
