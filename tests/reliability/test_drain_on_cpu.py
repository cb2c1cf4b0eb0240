"""Graceful drain on SIGTERM, on the real `python -m verl_search.server` process
(= `verl-search serve`) over the real dense index: requests in flight finish with 200, new ones get
503 with `Retry-After`, `/health` says `draining`, and the process exits 0 within a bounded time."""

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.conftest import MINI_QA
from tests.waiting import wait_until
from verl_search.server.local import SubprocessServer

QUESTIONS = [json.loads(line)["question"] for line in MINI_QA.read_text().splitlines()]


def draining(url: str) -> httpx.Response | None:
    """`GET /health` if it says draining, else None."""
    health = httpx.get(f"{url}/health", timeout=10)
    return health if health.json()["status"] == "draining" else None


def test_sigterm_drains_then_exits_zero(tmp_path, dense_index):
    log = tmp_path / "server.log"
    server = SubprocessServer(["--index", str(dense_index), "--drain-timeout", "90"], ready_timeout=180,
                              log_path=str(log)).start()
    try:
        # 4 requests of 64 MiniLM queries: seconds of work on 2 cores, in flight when SIGTERM comes
        bodies = [{"queries": QUESTIONS[64 * i: 64 * (i + 1)], "topk": 3} for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            pending = [pool.submit(httpx.post, f"{server.url}/retrieve", json=b, timeout=180) for b in bodies]
            wait_until(lambda: httpx.get(f"{server.url}/health", timeout=10).json()["in_flight"] >= 4, 60,
                       "the 4 requests in flight on the server", ignore=(httpx.TransportError,),
                       watch={"the server": server.process},
                       details=lambda: log.read_text()[-2000:])
            os.kill(server.process.pid, signal.SIGTERM)
            signalled = time.monotonic()
            # the signal is handled on the server's next tick (0.1 s)
            health = wait_until(lambda: draining(server.url), 30, "the server's /health to say draining",
                                ignore=(httpx.TransportError,), watch={"the server": server.process},
                                details=lambda: log.read_text()[-2000:])
            assert health.status_code == 503, health.text
            assert health.json()["in_flight"] >= 1  # still working on the old requests
            refused = httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu mythology"]}, timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "2", refused.text
            assert "draining" in refused.json()["detail"]

            responses = [future.result() for future in pending]
        assert [r.status_code for r in responses] == [200] * 4  # every in-flight request was answered
        assert all(len(r.json()["result"]) == 64 for r in responses)
        assert server.process.wait(timeout=60) == 0, log.read_text()[-2000:]
        assert time.monotonic() - signalled < 90  # bounded by --drain-timeout
    finally:
        server.stop()
    assert "drained after" in log.read_text()


def test_sigterm_when_idle_exits_zero_at_once(tmp_path, bm25_index):
    server = SubprocessServer(["--index", str(bm25_index)], ready_timeout=120).start()
    try:
        assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu"]}).status_code == 200
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0
        assert time.monotonic() - started < 15
    finally:
        server.stop()
