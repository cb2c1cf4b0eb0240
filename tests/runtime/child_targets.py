"""Functions `tests/runtime/test_child_on_cpu.py` runs in a child process (module-level, so they pickle by name,
as `in_child` requires)."""

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger("verl_search.tests.child")
#: a standard-library module nothing else of the test process imports: `pid_and_logs` imports it, in the child
HEAVY = "wave"


def pid_and_logs(message: str) -> int:
    """Import `HEAVY`, log `message` at INFO and return this process's id."""
    import wave  # noqa: F401  (HEAVY)

    logger.info("%s", message)
    return os.getpid()


def fails(value: int) -> None:
    raise ValueError(f"value {value} is refused")


def sleeps(pid_file: str, seconds: float) -> None:
    """Write this process's id to `pid_file`, then sleep `seconds`."""
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)
