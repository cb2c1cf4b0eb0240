"""The `/retrieve` service on a real uvicorn server (127.0.0.1, free port) over real indexes."""

import asyncio
import threading

import httpx
import pytest

from tests.waiting import wait_until
from verl_search.retrieval.base import RetrieverUnavailableError
from verl_search.server.app import create_app, index_service
from verl_search.server.health import wait_until_ready
from verl_search.server.settings import ServerSettings
from verl_search.server.local import ThreadServer


def post(server, body, **kwargs):
    return httpx.post(f"{server.url}/retrieve", timeout=30, **({"json": body} if body is not None else kwargs))


def test_wire_format_with_scores(bm25_server, bm25_retriever):
    response = post(bm25_server, {"queries": ["Lilu mythology", "Alû demon"], "topk": 3, "return_scores": True})
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == 2 and all(len(hits) == 3 for hits in result)
    first = result[0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    expected = bm25_retriever.search(["Lilu mythology"], 3)[0]
    assert [h["document"]["id"] for h in result[0]] == [h.passage.id for h in expected]
    assert first["score"] == pytest.approx(expected[0].score)


def test_wire_format_without_scores_is_the_documents_alone(bm25_server):
    response = post(bm25_server, {"queries": ["Lilu mythology"], "topk": 2, "return_scores": False})
    assert response.status_code == 200  # Search-R1's server answers 500 here
    hits = response.json()["result"][0]
    assert len(hits) == 2 and set(hits[0]) == {"id", "contents"}


def test_defaults_topk_and_blank_query(bm25_server):
    result = post(bm25_server, {"queries": ["Lilu mythology", ""]}).json()["result"]
    assert len(result[0]) == 3  # default_topk
    assert result[1] == []  # a blank query gets no hits (documented)


@pytest.mark.parametrize(
    "body, field, message",
    [
        ({"queries": [], "topk": 3}, "queries", "at least 1 item"),  # empty queries
        ({"queries": ["a"], "topk": 0}, "topk", "greater than or equal to 1"),  # topk < 1
        ({"queries": ["a"], "topk": 101}, "topk", "max_topk=100"),  # above the server maximum
        ({"queries": ["a"] * 4097}, "queries", "max_queries=4096"),  # too many queries
        ({"queries": ["x" * 4097]}, "queries", "max_query_chars=4096"),  # a query too long
        ({"queries": "not a list"}, "queries", "valid array"),  # wrong type (pydantic names JSON types)
        ({"queries": [1, 2]}, "queries", "valid string"),  # wrong element type
        ({"queries": ["a"], "topk": "3"}, "topk", "valid integer"),  # strings are not coerced
        ({"queries": ["a"], "return_scores": "yes"}, "return_scores", "valid boolean"),
        ({"queries": ["a"], "top_k": 5}, "top_k", "Extra inputs are not permitted"),  # typo of topk
        ({"topk": 3}, "queries", "Field required"),  # missing queries
    ],
)
def test_bad_input_is_a_422_naming_the_field(bm25_server, body, field, message):
    response = post(bm25_server, body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(field in [str(part) for part in d["loc"]] and message in d["msg"] for d in detail), detail


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"null"])
def test_malformed_json_is_a_422(bm25_server, raw):
    response = post(bm25_server, None, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422


def test_server_keeps_serving_after_bad_input(bm25_server):
    for body in ({"queries": []}, {"queries": ["a"], "topk": -5}, {"queries": [None]}):
        assert post(bm25_server, body).status_code == 422
    assert post(bm25_server, {"queries": ["Lilu mythology"], "topk": 1}).status_code == 200
    assert httpx.get(f"{bm25_server.url}/health").json()["status"] == "ready"


def test_openapi_page_documents_retrieve(bm25_server):
    spec = httpx.get(f"{bm25_server.url}/openapi.json").json()
    assert "/retrieve" in spec["paths"] and "/health" in spec["paths"]
    # the route reads its body itself (parse_retrieve_request); the request schema is still documented
    body = spec["paths"]["/retrieve"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"queries", "topk", "return_scores"} <= set(body["properties"])
    assert httpx.get(f"{bm25_server.url}/docs").status_code == 200


def test_an_app_mounted_under_a_prefix_answers_through_the_fastapi_route(bm25_retriever):
    # `POST /retrieve` is answered by the app's own middleware ahead of FastAPI's router; under a prefix the
    # middleware sees `/search/retrieve` and passes it on, and the documented FastAPI route answers the same
    from fastapi import FastAPI

    inner = create_app(index_service(bm25_retriever))
    outer = FastAPI(lifespan=lambda _: inner.router.lifespan_context(inner))  # a mount's lifespan is its parent's to run
    outer.mount("/search", inner)
    server = ThreadServer(outer)  # the outer app has no /health: start it, then wait for the mounted app's
    server._thread.start()
    try:
        wait_until_ready(f"{server.url}/search", timeout=30, is_alive=server._thread.is_alive)
        body = {"queries": ["Lilu mythology"], "topk": 2}
        mounted = httpx.post(f"{server.url}/search/retrieve", json=body, timeout=30)
        assert mounted.status_code == 200 and mounted.headers["server-timing"].startswith("retrieve;dur=")
        expected = bm25_retriever.search(["Lilu mythology"], 2)[0]
        assert [h["document"]["id"] for h in mounted.json()["result"][0]] == [h.passage.id for h in expected]
        bad = httpx.post(f"{server.url}/search/retrieve", json={"queries": ["a"], "top_k": 2}, timeout=30)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "top_k"]
    finally:
        server.stop()


def test_health_says_loading_until_the_index_is_loaded(bm25_retriever):
    release = threading.Event()

    def slow_loader():
        release.wait(30)
        return bm25_retriever

    server = ThreadServer(create_app(index_service(slow_loader)))
    server._thread.start()
    try:
        response = wait_until(lambda: httpx.get(f"{server.url}/health", timeout=10), 30, "the server to listen",
                              ignore=(httpx.TransportError,), watch={"the server thread": server._thread})
        assert response.status_code == 503 and response.json()["status"] == "loading"
        early = post(server, {"queries": ["Lilu"]})
        assert early.status_code == 503 and "loading" in early.json()["detail"]
        release.set()
        body = wait_until_ready(server.url, timeout=30)
        assert body["retriever"] == "bm25" and body["num_passages"] == 9993
    finally:
        release.set()
        server.stop()


def test_failed_load_is_reported_by_health():
    def broken_loader():
        raise FileNotFoundError("no such index")

    server = ThreadServer(create_app(index_service(broken_loader)), ready_timeout=30)
    with pytest.raises(RuntimeError, match="failed to load its index: FileNotFoundError: no such index"):
        server.start()
    server.stop()


class _LosesAShardOnce:
    """A retriever whose first search fails as a sharded one does when a shard replica is lost."""

    def __init__(self, retriever):
        self.kind, self.num_passages, self._retriever, self.failed = "dense", retriever.num_passages, retriever, 0

    def search(self, queries, topk):
        if not self.failed:
            self.failed += 1
            raise RetrieverUnavailableError("shard 1 of 2 did not answer (RayActorError); retry shortly")
        return self._retriever.search(queries, topk)


def test_a_lost_shard_is_a_503_with_retry_after_and_the_retry_is_answered(bm25_retriever):
    from verl_search.tools.client import SearchClientConfig, search

    flaky = _LosesAShardOnce(bm25_retriever)
    with ThreadServer(create_app(index_service(flaky))) as server:
        lost = post(server, {"queries": ["Lilu"], "topk": 3})
        assert lost.status_code == 503 and lost.headers["retry-after"] == "1"
        assert lost.json() == {"detail": "shard 1 of 2 did not answer (RayActorError); retry shortly"}
        answered = post(server, {"queries": ["Lilu"], "topk": 3})
        assert answered.status_code == 200
        assert answered.json()["result"][0] == [
            {"document": {"id": h.passage.id, "contents": h.passage.contents}, "score": pytest.approx(h.score)}
            for h in bm25_retriever.search(["Lilu"], 3)[0]]
        flaky.failed = 0  # the tool's client retries a 503 and gets the answer
        outcome = asyncio.run(search(["Lilu"], SearchClientConfig(retrieval_service_url=f"{server.url}/retrieve")))
        assert outcome.error is None and outcome.attempts == 2


async def _concurrent(url, queries, topk=3):
    async with httpx.AsyncClient(timeout=60) as client:
        responses = await asyncio.gather(*[client.post(f"{url}/retrieve", json={"queries": [q], "topk": topk}) for q in queries])
    return [r.json()["result"][0] for r in responses]


@pytest.mark.parametrize("micro_batching", [True, False])
def test_concurrent_requests_are_coalesced_and_answered_exactly(dense_retriever, micro_batching):
    queries = [f"who founded the city number {i}" for i in range(48)] + ["Lilu mythology", ""]
    settings = ServerSettings(micro_batching=micro_batching, max_wait_ms=20)
    with ThreadServer(create_app(index_service(dense_retriever, settings))) as server:
        before = httpx.get(f"{server.url}/health").json()
        results = asyncio.run(_concurrent(server.url, queries))
        after = httpx.get(f"{server.url}/health").json()
    expected = dense_retriever.search(queries, 3)
    assert [[h["document"]["id"] for h in hits] for hits in results] == [[h.passage.id for h in hits] for hits in expected]
    batches = after["batches"] - before["batches"]
    if micro_batching:
        assert batches < len(queries) / 4  # 50 single-query requests, a handful of batches
    else:
        assert batches == len(queries)
