"""Large requests (Search-R1's trainer posts a whole GRPO step: 2,560 queries) on a real server.

A large request is answered in `max_batch_size` slices, and a single-query call that arrives while
it is in flight is interleaved with those slices instead of waiting for the whole request. BM25
over the mini corpus (a 2,560-query BM25 search takes about 1-2 s on 2 cores; the dense
variant would pay minutes of encoding in CI for the same scheduling logic).
"""

import asyncio
import json
import time

import httpx

from tests.conftest import MINI_QA
from tests.waiting import wait_until_async
from verl_search.server.app import create_app, index_service
from verl_search.server.batcher import fair_shares
from verl_search.server.settings import ServerSettings
from verl_search.server.local import ThreadServer

QUESTIONS = [json.loads(line)["question"] for line in MINI_QA.read_text(encoding="utf-8").splitlines()]


def _ids(rows):
    return [[hit["document"]["id"] for hit in row] for row in rows]


async def _big_and_single(url: str, big: list[str], single: str):
    """Post `big`, wait until its first slice is searched, then post `single`; return both answers
    and the moment (perf_counter) each arrived, plus when the single one was sent."""
    async with httpx.AsyncClient(timeout=120) as client:
        async def timed(queries):
            response = await client.post(f"{url}/retrieve", json={"queries": queries, "topk": 3})
            return response, time.perf_counter()

        big_task = asyncio.ensure_future(timed(big))

        async def first_slice_searched():
            return big_task.done() or (await client.get(f"{url}/health")).json()["batches"] > 0

        await wait_until_async(first_slice_searched, 60, "the first slice of the big request to be searched",
                               interval=0.005)
        if big_task.done():  # it failed (or took no time): nothing to overtake
            response, _ = big_task.result()
            raise AssertionError(f"the big request ended before the single one was sent: {response.status_code} "
                                 f"{response.text[:300]}")
        sent = time.perf_counter()
        single_response, single_done = await timed([single])
        big_response, big_done = await big_task
    return big_response, big_done, single_response, single_done, sent


def test_default_max_queries_takes_search_r1s_grpo_batch():
    assert ServerSettings().max_queries >= 4096  # 512 prompts x 5 rollouts = 2,560 in one request


def test_a_single_query_overtakes_a_2560_query_request_and_every_query_gets_its_own_hits(bm25_retriever):
    big = [q for q in QUESTIONS[:1280] for _ in range(2)]  # real questions, each twice in a row, as GRPO's rollouts
    single = "Lilu mythology"
    settings = ServerSettings(max_batch_size=64)
    with ThreadServer(create_app(index_service(bm25_retriever, settings))) as server:
        started = time.perf_counter()
        big_response, big_done, single_response, single_done, sent = asyncio.run(
            _big_and_single(server.url, big, single))
        health = httpx.get(f"{server.url}/health").json()
    assert big_response.status_code == 200 and single_response.status_code == 200
    big_seconds, single_seconds = big_done - started, single_done - sent
    assert single_done < big_done, (single_seconds, big_seconds)  # it did not wait for the whole request
    assert single_seconds < big_seconds / 4, (single_seconds, big_seconds)
    expected = bm25_retriever.search(big, 3)
    assert _ids(big_response.json()["result"]) == [[h.passage.id for h in row] for row in expected]
    assert _ids(single_response.json()["result"]) == [[h.passage.id for h in bm25_retriever.search([single], 3)[0]]]
    assert health["batches"] >= 2560 // 64  # sliced, not one 2,560-query call
    assert health["duplicates"] > 0 and health["search_seconds"] > 0


def test_micro_batching_off_runs_a_large_request_whole(bm25_retriever):
    settings = ServerSettings(max_batch_size=64, micro_batching=False)
    with ThreadServer(create_app(index_service(bm25_retriever, settings))) as server:
        response = httpx.post(f"{server.url}/retrieve", json={"queries": QUESTIONS[:300], "topk": 2}, timeout=60)
        health = httpx.get(f"{server.url}/health").json()
    assert response.status_code == 200 and len(response.json()["result"]) == 300
    assert health["batches"] == 1  # one search call per request: the peer-shaped baseline


def test_fair_shares_split_a_batch_max_min_fairly():
    cases = [
        ([2560, 1, 1], 256, [254, 1, 1]),  # singles ride along with a big request's slice
        ([2560, 2560], 256, [128, 128]),  # two big requests alternate halves
        ([10, 300], 256, [10, 246]),  # a small request's unused share goes to the big one
        ([1, 1, 1], 2, [1, 1, 0]),  # more jobs than slots: earliest first
        ([0, 5], 4, [0, 4]),  # a finished job gets nothing
    ]
    for remaining, capacity, expected in cases:
        assert fair_shares(remaining, capacity) == expected
