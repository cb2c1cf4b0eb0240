"""FlashRAG's `/batch_search` and `/search` on a real uvicorn server (127.0.0.1) over the BM25 mini index: the
wire format ReSearch's rollout and FlashRAG's serving script use, the same hits as `/retrieve`, validation."""

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
    assert post(bm25_server, "/batch_search", {"query": ["Lilu mythology", ""]}).json()[1] == []  # blank: no hits


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
