"""The batch worker's wait under heavy load (`burst_gap_ms`, `max_burst_wait_ms`, `server.batcher`):
after a batch at least half of `max_batch_size` from several requests, it keeps gathering requests
while they arrive at most `burst_gap_ms` apart (up to `max_burst_wait_ms`); after a smaller batch,
or with the wait off, a request that finds the worker idle is searched at once.

Real BM25 index and real questions. The retriever is wrapped to record each batch and, for the first
one, to hold it until the test has queued the requests that make the half-full batch after it.
Arrivals are 0.5 s apart against gaps of 2 s, a wait cut at 0.75 s or none: margins of 0.25 s and
more, wide against a loaded machine's scheduling delays (milliseconds).
"""

import asyncio
import json
import threading

import pytest

from tests.conftest import MINI_QA
from tests.reliability.wrappers import RecordingRetriever
from tests.waiting import wait_until_async
from verl_search.server.batcher import MicroBatcher

BATCH = 8
SPACING = 0.5  # seconds between the arrivals after the heavy batch


class HeldRetriever(RecordingRetriever):
    """Records each batch (`RecordingRetriever`); the first `search` call sets `entered`, then waits until
    `release` is set."""

    def __init__(self, inner):
        super().__init__(inner)
        self.entered, self.release = threading.Event(), threading.Event()

    def search(self, queries, topk):
        self.entered.set()
        self.release.wait(timeout=60)
        return super().search(queries, topk)


@pytest.fixture(scope="module")
def questions():
    return list(dict.fromkeys(json.loads(line)["question"] for line in MINI_QA.read_text().splitlines()))[:32]


async def _then_spaced(batcher: MicroBatcher, retriever: HeldRetriever, first_batch: list[str], spaced: list[str]):
    """One query (held in the retriever) while `first_batch` single-query requests queue, then (once
    those are answered) the `spaced` requests `SPACING` s apart."""
    held = batcher.submit(["held"], 3)
    await wait_until_async(retriever.entered.is_set, 30, 'the worker to take "held" (it waits in the retriever)')
    queued = [batcher.submit([q], 3) for q in first_batch]
    retriever.release.set()
    await held
    await asyncio.gather(*queued)
    answers = []
    for query in spaced:
        answers.append(batcher.submit([query], 3))
        await asyncio.sleep(SPACING)  # paces the arrivals: the spacing is what the batcher's wait is tested against
    await asyncio.gather(*answers)


def _batches_after(retriever: HeldRetriever, first_batch: list[str]) -> list[list[str]]:
    """The batches searched after the one that held `first_batch`."""
    batches = [queries for queries, _ in retriever.calls]
    assert batches[0] == ["held"] and sorted(batches[1]) == sorted(first_batch), batches[:2]
    return batches[2:]


def _run(bm25_retriever, first_batch, spaced, **settings) -> list[list[str]]:
    retriever = HeldRetriever(bm25_retriever)
    batcher = MicroBatcher(retriever, max_batch_size=BATCH, max_wait_ms=0, **settings)
    try:
        asyncio.run(_then_spaced(batcher, retriever, first_batch, spaced))
    finally:
        batcher.close()
    return _batches_after(retriever, first_batch)


def test_after_a_half_full_batch_the_worker_gathers_requests_arriving_within_the_gap(bm25_retriever, questions):
    spaced = questions[BATCH // 2 : BATCH // 2 + 3]
    batches = _run(bm25_retriever, questions[: BATCH // 2], spaced, burst_gap_ms=2000, max_burst_wait_ms=20000)
    assert batches == [spaced]  # one batch: each arrival came within the gap of the one before


def test_the_wait_ends_at_max_burst_wait(bm25_retriever, questions):
    spaced = questions[BATCH // 2 : BATCH // 2 + 3]  # arrive at 0, 0.5 and 1 s; the wait ends at 0.75 s
    batches = _run(bm25_retriever, questions[: BATCH // 2], spaced, burst_gap_ms=2000, max_burst_wait_ms=1.5 * SPACING * 1000)
    assert batches == [spaced[:2], spaced[2:]]


@pytest.mark.parametrize("first_size, wait_ms", [(BATCH // 2 - 1, 20000), (BATCH // 2, 0)],
                         ids=["after a batch under half full", "wait off"])
def test_otherwise_a_request_that_finds_the_worker_idle_is_searched_at_once(bm25_retriever, questions, first_size, wait_ms):
    spaced = questions[BATCH : BATCH + 3]
    batches = _run(bm25_retriever, questions[:first_size], spaced, burst_gap_ms=2000, max_burst_wait_ms=wait_ms)
    assert batches == [[query] for query in spaced]
