"""`tests.waiting`: the tests' poll for a condition returns its value as soon as it holds, fails naming what it
waited for at the deadline, and fails at once when a watched process or thread has ended."""

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from tests.waiting import ended, wait_until, wait_until_async


def test_returns_the_conditions_value_once_it_holds():
    calls = []

    def third_time():
        calls.append(1)
        return "done" if len(calls) == 3 else None

    assert wait_until(third_time, 30, "the third call", interval=0.001) == "done" and len(calls) == 3


def test_fails_at_the_deadline_naming_what_it_waited_for_and_the_last_check():
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"waiting for the moon: not within 0.2 s \(last check: 0\)\nmore"):
        wait_until(lambda: 0, 0.2, "the moon", details=lambda: "more")
    assert time.monotonic() - started < 5


def test_ignored_errors_mean_not_yet_and_others_propagate():
    attempts = iter([ConnectionError("refused"), ConnectionError("refused"), "up"])

    def server():
        value = next(attempts)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_until(server, 30, "the server", interval=0.001, ignore=(ConnectionError,)) == "up"
    def refused():
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match="waiting for x: not within 0.1 s .last check: ConnectionError: refused"):
        wait_until(refused, 0.1, "x", ignore=(ConnectionError,))
    with pytest.raises(KeyError):
        wait_until(lambda: {}["status"], 30, "a body with a status")


def test_a_watched_process_that_exits_fails_the_wait_at_once():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    started = time.monotonic()
    with pytest.raises(AssertionError, match="waiting for the server: the server exited with code 3"):
        wait_until(lambda: False, 60, "the server", watch={"the server": process})
    assert time.monotonic() - started < 5
    assert ended([process]).startswith(f"process {process.pid} (") and ended([process]).endswith("exited with code 3")


def test_a_watched_thread_that_stops_fails_the_wait_at_once():
    thread = threading.Thread(target=lambda: None, name="uvicorn")
    thread.start()
    thread.join()
    with pytest.raises(AssertionError, match="thread uvicorn stopped"):
        wait_until(lambda: False, 60, "the server", watch=[thread])


def test_the_async_twin_lets_the_loop_run_and_awaits_an_awaitable_condition():
    async def scenario():
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, event.set)
        await wait_until_async(event.is_set, 30, "the event")

        async def answer():
            return 42

        return await wait_until_async(answer, 30, "the answer")

    assert asyncio.run(scenario()) == 42
    with pytest.raises(AssertionError, match="waiting for never: not within 0.1 s"):
        asyncio.run(wait_until_async(lambda: None, 0.1, "never"))
