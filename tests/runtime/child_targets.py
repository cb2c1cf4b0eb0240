"""Functions `tests/runtime/test_child_on_cpu.py` runs in a child process (importable by name, as `in_child`
requires); this module is imported by the children only."""

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger("verl_search.tests.child")


def pid_and_logs(message: str) -> int:
    """Log `message` at INFO and return this process's id."""
    logger.info("%s", message)
    return os.getpid()


def fails(value: int) -> None:
    raise ValueError(f"value {value} is refused")


def sleeps(pid_file: str, seconds: float) -> None:
    """Write this process's id to `pid_file`, then sleep `seconds`."""
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)
