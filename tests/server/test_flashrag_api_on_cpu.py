"""ReSearch's `/batch_search` and `/search` (its `scripts/serving/retriever_serving.py`) on a real uvicorn server
(127.0.0.1) over the BM25 mini index: the wire format ReSearch's rollout and serving script use, the hits of
ReSearch's retriever (`k` passages for every query, blank ones included), validation."""

import httpx
import pytest


def post(server, path, body):
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def test_batch_search_returns_flashrags_documents_with_the_retrieve_hits(bm25_server, bm25_retriever):
    queries = ["Lilu mythology", "Alû demon"]
    response = post(bm25_server, "/batch_search", {"query": queries, "top_n": 5})
    assert response.status_code == 200
    body = response.json()
    expected = bm25_retriever.search(queries, 5)
    assert [[doc["id"] for doc in row] for row in body] == [[h.passage.id for h in row] for row in expected]
    assert all(set(doc) == {"id", "contents"} for row in body for doc in row)
    # ReSearch's own parsing (vllm_rollout.py, `batch_search`): the passages' contents joined per query
    text = ["\n\n".join(doc["contents"] for doc in row) for row in body]
    assert text[0].startswith(expected[0][0].passage.contents)


def test_return_score_gives_documents_then_scores(bm25_server, bm25_retriever):
    documents, scores = post(bm25_server, "/batch_search", {"query": ["Lilu mythology"], "top_n": 3,
                                                             "return_score": True}).json()
    expected = bm25_retriever.search(["Lilu mythology"], 3)[0]
    assert [d["id"] for d in documents[0]] == [h.passage.id for h in expected]
    assert scores[0] == pytest.approx([h.score for h in expected])
    single, single_scores = post(bm25_server, "/search", {"query": "Lilu mythology", "top_n": 3,
                                                          "return_score": True}).json()
    assert single == documents[0] and single_scores == pytest.approx(scores[0])


def test_search_defaults_to_flashrags_top_n_and_no_scores(bm25_server):
    documents = post(bm25_server, "/search", {"query": "Lilu mythology"}).json()
    assert len(documents) == 10 and set(documents[0]) == {"id", "contents"}



def test_batch_search_answers_k_passages_as_researchs_retriever(bm25_server, bm25_retriever):
    # bm25s retrieve(k=top_n) answers every query with top_n passages: "zebra" matches one passage, "" none
    body = post(bm25_server, "/batch_search", {"query": ["zebra", "", "Lilu mythology"], "top_n": 10,
                                               "return_score": True}).json()
    documents, scores = body
    expected = bm25_retriever.search_filled(["zebra", "", "Lilu mythology"], 10)
    assert [len(row) for row in documents] == [10, 10, 10]
    assert [[d["id"] for d in row] for row in documents] == [[h.passage.id for h in row] for row in expected]
    assert scores[0][0] > 0 and set(scores[0][1:]) == {0.0} and set(scores[1]) == {0.0}
    # Search-R1's /retrieve keeps pyserini's answer: the matching passage only, nothing for a blank query
    retrieve = httpx.post(f"{bm25_server.url}/retrieve", json={"queries": ["zebra", ""], "topk": 10}, timeout=30).json()
    assert [len(row) for row in retrieve["result"]] == [1, 0]
    assert post(bm25_server, "/search", {"query": "zebra", "top_n": 4}).json() == documents[0][:4]


@pytest.mark.parametrize("path, body, status, field, message", [
    ("/search", {"query": "   "}, 400, None, "query is blank"),
    ("/batch_search", {"query": []}, 422, "query", "at least 1 item"),
    ("/batch_search", {"query": "one string"}, 422, "query", "valid array"),
    ("/batch_search", {"query": ["a"], "top_n": 101}, 422, "top_n", "max_topk=100"),
    ("/batch_search", {"query": ["a"], "top_n": 0}, 422, "top_n", "greater than or equal to 1"),
    ("/batch_search", {"query": ["a"], "topk": 3}, 422, "topk", "Extra inputs"),  # /retrieve's name is a typo here
    ("/search", {"query": "a" * 5000}, 422, "query", "max_query_chars"),
])
def test_bad_input_is_a_4xx_naming_the_field(bm25_server, path, body, status, field, message):
    response = post(bm25_server, path, body)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    if field is None:
        assert message in detail
    else:
        assert any(error["loc"][-1] == field and message in error["msg"] for error in detail), detail


def test_the_routes_are_in_the_openapi_page(bm25_server):
    paths = httpx.get(f"{bm25_server.url}/openapi.json", timeout=30).json()["paths"]
    assert {"/retrieve", "/batch_search", "/search"} <= set(paths)
    schema = paths["/batch_search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["title"] == "BatchSearchRequest" and {"query", "top_n", "return_score"} <= set(schema["properties"])


def test_filled_and_plain_requests_of_one_batch_get_their_own_answers(bm25_retriever):
    # one micro-batch holding a /retrieve job and a /batch_search job for the same query
    import asyncio

    from verl_search.server.batcher import MicroBatcher

    batcher = MicroBatcher(bm25_retriever, max_wait_ms=50)

    async def both():
        return await asyncio.gather(batcher.search(["zebra", ""], 6), batcher.search(["zebra", ""], 6, fill=True))

    try:
        plain, filled = asyncio.run(both())
    finally:
        batcher.close()
    assert [len(row) for row in plain] == [1, 0] and [len(row) for row in filled] == [6, 6]
    assert filled == bm25_retriever.search_filled(["zebra", ""], 6)


def test_the_query_cache_keeps_filled_answers_apart(bm25_retriever):
    from verl_search.server.cache import QueryCache

    cache = QueryCache(max_mb=1)
    cache.store(["zebra"], 6, bm25_retriever.search(["zebra"], 6))
    assert cache.lookup(["zebra"], 6, fill=True) == [None]
    cache.store(["zebra"], 6, bm25_retriever.search_filled(["zebra"], 6), fill=True)
    assert [len(row) for row in cache.lookup(["zebra"], 6) + cache.lookup(["zebra"], 6, fill=True)] == [1, 6]
