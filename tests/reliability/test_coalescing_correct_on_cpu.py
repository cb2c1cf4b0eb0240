"""256 concurrent single-query requests with distinct queries and different
`topk` values, coalesced by the real server over the real BM25 index (and 64 over the real dense
MiniLM + faiss index: one MiniLM query costs ~0.2 s on 2 busy cores): each gets exactly the hits
the in-process retriever gives for its own query alone (no mix-up between coalesced requests)."""

import asyncio
import json

import aiohttp
import pytest

from tests.conftest import MINI_QA
from tests.reliability.wrappers import RecordingRetriever
from verl_search.server.app import create_app, index_service
from verl_search.server.settings import ServerSettings
from verl_search.server.local import ThreadServer

N = 256


async def _fire(url: str, bodies: list[dict]) -> list[dict]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=len(bodies))) as session:
        async def one(body):
            async with session.post(f"{url}/retrieve", json=body, timeout=aiohttp.ClientTimeout(total=120)) as response:
                assert response.status == 200, await response.text()
                return json.loads(await response.read())
        return await asyncio.gather(*[one(body) for body in bodies])


@pytest.mark.parametrize("kind, n", [("bm25", N), ("dense", 64)])
def test_each_coalesced_request_gets_its_own_hits(request, kind, n):
    retriever = request.getfixturevalue(f"{kind}_retriever")
    questions = [json.loads(line)["question"] for line in MINI_QA.read_text().splitlines()]
    queries = list(dict.fromkeys(questions))[:n]
    assert len(queries) == n
    topks = [1 + (i * 7) % 10 for i in range(n)]  # 1..10, mixed within every batch
    expected = [[(h.passage.id, h.score) for h in retriever.search([q], k)[0]] for q, k in zip(queries, topks)]

    recorder = RecordingRetriever(retriever)
    with ThreadServer(create_app(index_service(recorder, ServerSettings(max_wait_ms=20)))) as server:
        bodies = [{"queries": [q], "topk": k, "return_scores": True} for q, k in zip(queries, topks)]
        results = asyncio.run(_fire(server.url, bodies))

    mixed = [call for call in recorder.calls if len(call[0]) > 1]
    assert mixed and len(recorder.calls) < n / 4, len(recorder.calls)  # requests really were coalesced
    assert len(recorder.searched()) == n and set(recorder.searched()) == set(queries)  # each searched once
    for query, topk, want, body in zip(queries, topks, expected, results):
        got = body["result"][0]
        assert len(got) == topk, query
        assert [hit["document"]["id"] for hit in got] == [pid for pid, _ in want], query
        assert all(abs(hit["score"] - score) < 1e-4 for hit, (_, score) in zip(got, want)), query
