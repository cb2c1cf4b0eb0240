"""`in_child`: one call in a fresh Python process, so that a long-running command does not keep what the
call imports and allocates (verl, torch, Ray's client, a model) resident while its later stages run.
Standard library only.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from verl_search.runtime.exits import configure_logging

logger = logging.getLogger(__name__)

T = TypeVar("T")

PR_SET_PDEATHSIG = 1
"""`prctl` option (linux/prctl.h): the signal a process gets when its parent exits."""


def _start_child() -> None:
    """The child's set-up: the entry points' logging, and (on Linux) SIGTERM when the parent exits, so
    that a killed command leaves no stage running on behind it."""
    configure_logging()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError) as exc:  # a libc without prctl: the child may outlive a killed parent
            logger.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)


def _call(target: Callable[..., T], args: tuple, kwargs: dict) -> T:
    """`target(*args, **kwargs)`, in the child."""
    return target(*args, **kwargs)


def in_child(target: Callable[..., T], /, *args, **kwargs) -> T:
    """Return `target(*args, **kwargs)` run in a spawned Python process.

    `target` is a module-level function (it pickles by name: its module must import without its weight,
    the heavy imports inside the function, so that this process stays light). The child starts from nothing
    (multiprocessing's `spawn`: none of this process's memory or imports), logs as the entry points do
    (`exits.configure_logging`), writes to this process's stdout and stderr, and gets SIGTERM if this
    process exits first (Linux). Its CPU time counts in this process's `resource.RUSAGE_CHILDREN` once it
    has ended. The arguments and the result must pickle.

    Raises:
        whatever `target` raised, re-raised here (the child's traceback is its `__cause__`).
        concurrent.futures.process.BrokenProcessPool: the child died without an answer (killed, out of memory).
    """
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_start_child) as pool:
        return pool.submit(_call, target, args, kwargs).result()
