"""Exit codes and logging of the command-line entry points (`verl-search`, `python -m verl_search.server`).

An expected error (a bad path, a mismatched index, a missing extra) is one log line and exit code 2,
never a traceback. Standard library only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

logger = logging.getLogger("verl_search")

#: errors that mean a bad path or input, a mismatched index, a missing extra or no cluster/server at
#: the given address: one log line and exit code 2 (`exit_code`)
EXPECTED_ERRORS = (FileNotFoundError, FileExistsError, ValueError, ImportError, KeyError, ConnectionError)


class DiskWriteError(OSError):
    """Writing an output failed for lack of room (disk full, quota, file size limit); the message
    says where and that nothing half-written was left. An expected error for `exit_code`."""


def configure_logging() -> None:
    """INFO-level logging to stderr with `LOG_FORMAT` (entry points only; the library never calls it)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def exit_code(call: Callable[[], int], expected: tuple[type[BaseException], ...] = EXPECTED_ERRORS) -> int:
    """`call()`'s exit code; 2 (the error logged as one line) when it raises one of `expected`
    (default `EXPECTED_ERRORS`) or a `DiskWriteError`."""
    try:
        return call()
    except (*expected, DiskWriteError) as exc:
        logger.error("%s", exc)
        return 2
