"""Waiting in tests: poll the condition itself until a deadline; never sleep a fixed time and assume
that something happened meanwhile (a server is up, a request is in flight, a worker took a job, a node
joined). A fixed sleep is flaky on a loaded machine (the suite runs in three pytest-xdist workers on
2 cores) and slow on an idle one; a poll returns as soon as the condition holds, and fails naming it.

`wait_until` (a thread) and `wait_until_async` (an event loop: it yields between polls) call
`condition()` every `interval` seconds until it returns something truthy and return that value. They
raise `AssertionError` naming `what` when `timeout` passes first, or at once when a process or thread
in `watch` has ended (the thing waited for will never come: a server that died while starting).

A sleep that paces a load generator or plays a slow server (the delay is the thing under test) is
not a wait for a condition: it stays a sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping

Watched = subprocess.Popen | threading.Thread


def _name(thing: Watched) -> str:
    if isinstance(thing, subprocess.Popen):
        args = thing.args if isinstance(thing.args, (list, tuple)) else [thing.args]
        return f"process {thing.pid} ({' '.join(map(str, args[:6]))}{' ...' if len(args) > 6 else ''})"
    return f"thread {thing.name}"


def ended(watch: Mapping[str, Watched] | Iterable[Watched] = ()) -> str | None:
    """Which of `watch` has ended, in words ("NAME exited with code 1"), or None while all run.

    Args:
        watch: `subprocess.Popen`s (ended once `poll()` has a return code) and `threading.Thread`s (ended
            once not alive); a mapping names them, else they are named by pid and command or thread name.
    """
    items = watch.items() if isinstance(watch, Mapping) else ((_name(thing), thing) for thing in watch)
    for name, thing in items:
        if isinstance(thing, subprocess.Popen):
            code = thing.poll()
            if code is not None:
                return f"{name} exited with code {code}"
        elif not thing.is_alive():
            return f"{name} stopped"
    return None


class _Poll:
    """The bookkeeping both `wait_until`s share: the deadline, the last result, the failure message."""

    def __init__(self, timeout, what, ignore, watch, details):
        self.deadline = time.monotonic() + timeout
        self.timeout, self.what, self.ignore, self.watch, self.details = timeout, what, tuple(ignore), watch, details

    def pause(self, interval: float, last: str) -> float:
        """After a check that did not hold (`last`: its result, in words): raise if something watched has
        ended or the deadline has passed; else the seconds to sleep before the next check."""
        why = ended(self.watch)
        remaining = self.deadline - time.monotonic()
        if why is None and remaining <= 0:
            why = f"not within {self.timeout:g} s"
        if why is not None:
            message = f"waiting for {self.what}: {why} (last check: {last})"
            if self.details is not None:
                message += f"\n{self.details()}"
            raise AssertionError(message)
        return min(interval, remaining)


def wait_until(condition: Callable[[], object], timeout: float, what: str, *, interval: float = 0.05,
               ignore: Iterable[type[BaseException]] = (), watch: Mapping[str, Watched] | Iterable[Watched] = (),
               details: Callable[[], str] | None = None):
    """Call `condition()` every `interval` s until it returns a truthy value; return that value.

    Args:
        condition: what to wait for; called at once, then after each interval.
        timeout: seconds in all.
        what: the condition in words, for the failure message ("the server's /health says draining").
        interval: seconds between calls.
        ignore: exception types that mean "not yet" (e.g. `httpx.TransportError` while a server starts).
        watch: processes and threads whose end fails the wait at once (see `ended`).
        details: called on failure; its text is added to the message (e.g. the tail of a log).

    Raises:
        AssertionError: `timeout` passed, or something in `watch` ended, before the condition held.
    """
    poll = _Poll(timeout, what, ignore, watch, details)
    while True:
        try:
            value = condition()
        except poll.ignore as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if value:
                return value
            last = repr(value)[:300]
        time.sleep(poll.pause(interval, last))


async def wait_until_async(condition: Callable[[], object], timeout: float, what: str, *, interval: float = 0.02,
                           ignore: Iterable[type[BaseException]] = (),
                           watch: Mapping[str, Watched] | Iterable[Watched] = (),
                           details: Callable[[], str] | None = None):
    """`wait_until` in an event loop: it sleeps with `asyncio.sleep`, so the loop's other tasks run between
    checks; `condition()` may return an awaitable (an async HTTP call), which is awaited."""
    poll = _Poll(timeout, what, ignore, watch, details)
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
        except poll.ignore as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if value:
                return value
            last = repr(value)[:300]
        await asyncio.sleep(poll.pause(interval, last))
