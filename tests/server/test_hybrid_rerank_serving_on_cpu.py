"""Hybrid and reranked servers answer existing clients unchanged.

`verl-search serve` runs in a child process over a real hybrid index of the mini corpus
(tests/server/conftest.py's `hybrid_index`) with a real CrossEncoder (conftest's tiny random one: no
weights can be downloaded here). The clients of
Search-R1, verl 0.7 and slime (`tests/server/peer_clients.py`: each one's exact request body, HTTP
library and way of reading the answer) get every passage the server returns, in its order.
"""

import asyncio

import httpx
import pytest

from tests.server import peer_clients
from verl_search.server.local import SubprocessServer

QUERIES = ["Who directed Inception?", "Lilu mythology masculine Akkadian spirit"]


@pytest.fixture(scope="module")
def hybrid_server(hybrid_index):
    with SubprocessServer(["--index", str(hybrid_index)]) as server:
        yield server


@pytest.fixture(scope="module")
def reranked_server(hybrid_index, tiny_cross_encoder):
    with SubprocessServer(["--index", str(hybrid_index), "--reranker", str(tiny_cross_encoder),
                           "--rerank-candidates", "5"]) as server:
        yield server


def slime_client(url: str, queries: list[str], topk: int = 3) -> list[list[tuple[str, str]]]:
    """slime's `local_search` (one query per request, aiohttp, `return_scores: False`), once per query."""
    return [asyncio.run(peer_clients.slime(url, query, top_k=topk)) for query in queries]


CLIENTS = {"search_r1": peer_clients.search_r1, "verl_07": peer_clients.verl_07, "slime": slime_client}


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize("which", ["hybrid", "reranked"])
def test_existing_clients_work_unchanged(client, which, request):
    server = request.getfixturevalue(f"{which}_server")
    health = httpx.get(f"{server.url}/health", timeout=30).json()
    assert health["retriever"] == {"hybrid": "hybrid", "reranked": "hybrid+rerank"}[which]
    url = f"{server.url}/retrieve"
    inception, lilu = CLIENTS[client](url, QUERIES)
    assert len(inception) == 3 and len(lilu) == 3 and all(text.strip() for _, text in inception + lilu)
    assert [hit["document"]["contents"] for hit in httpx.post(url, json={"queries": QUERIES[1:], "topk": 3},
                                                              timeout=60).json()["result"][0]] == \
        [f"{title}\n{text}" for title, text in lilu]  # each client reads exactly the passages served, in order
    if which == "hybrid":  # the random cross-encoder puts any of the 5 candidates first
        assert lilu[0][0] == '"Lilu (mythology)"'


def test_reranked_server_returns_cross_encoder_scores_and_batches_across_requests(reranked_server):
    url = f"{reranked_server.url}/retrieve"
    alone = {q: httpx.post(url, json={"queries": [q], "topk": 3}, timeout=60).json()["result"][0] for q in QUERIES}
    scores = [hit["score"] for hit in alone[QUERIES[0]]]
    assert scores == sorted(scores, reverse=True) and not all(0 < s < 0.05 for s in scores)  # not RRF's scores
    plain = httpx.post(url, json={"queries": QUERIES, "topk": 3, "return_scores": False}, timeout=60).json()["result"]
    assert plain == [[hit["document"] for hit in alone[q]] for q in QUERIES]
    before = httpx.get(f"{reranked_server.url}/health").json()

    async def burst():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(url, json={"queries": [QUERIES[i % 2]], "topk": 3})
                                          for i in range(24)))

    answers = asyncio.run(burst())
    after = httpx.get(f"{reranked_server.url}/health").json()
    for i, answer in enumerate(answers):  # the same passages, in the same order; scores up to float noise (padding)
        hits, expected = answer.json()["result"][0], alone[QUERIES[i % 2]]
        assert [h["document"] for h in hits] == [h["document"] for h in expected], i
        assert [h["score"] for h in hits] == pytest.approx([h["score"] for h in expected], abs=1e-4)
    assert after["batches"] - before["batches"] < 24  # requests shared retriever (and cross-encoder) calls
