"""Every route of `create_app` gets its components through FastAPI's `Depends` (`server.service`), so
`app.dependency_overrides` swaps them for `/retrieve`, `/access` and `/health` alike (FastAPI docs,
"Testing Dependencies with Overrides")."""

import httpx
from fastapi import HTTPException

from verl_search.server.access import CorpusPages
from verl_search.server.app import create_app
from verl_search.server.cache import QueryCache
from verl_search.server.service import get_cache, get_service, ready_service
from verl_search.server.local import ThreadServer


def test_a_cache_given_through_the_dependency_answers_retrieve(bm25_retriever):
    app = create_app(bm25_retriever)  # cache off: no cache entry in Server-Timing
    with ThreadServer(app) as server:
        first = httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu mythology"], "topk": 2})
        assert "cache;" not in first.headers["server-timing"]
        cache = QueryCache(max_mb=1)
        app.dependency_overrides[get_cache] = lambda: cache
        answers = [httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu mythology"], "topk": 2}) for _ in range(2)]
    assert [a.headers["server-timing"].split("cache;")[1] for a in answers] == [
        'desc="hits=0 misses=1"', 'desc="hits=1 misses=0"']
    assert answers[1].json() == first.json()  # the same wire answer, from the swapped-in cache
    assert (cache.hits, cache.misses, cache.entries) == (1, 1, 1)


def test_one_readiness_dependency_guards_retrieve_and_access(bm25_retriever):
    def refuse():
        raise HTTPException(503, "swapped out", {"Retry-After": "7"})

    app = create_app(bm25_retriever, pages=CorpusPages())
    with ThreadServer(app) as server:
        app.dependency_overrides[ready_service] = refuse
        retrieve = httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu"]})
        access = httpx.post(f"{server.url}/access", json={"ids": ["1"]})
        app.dependency_overrides[get_service] = lambda: app.state.service.__class__(
            app.state.service.settings, QueryCache(0))  # a service that has loaded nothing
        health = httpx.get(f"{server.url}/health")
    for response in (retrieve, access):
        assert (response.status_code, response.json(), response.headers["retry-after"]) == (503, {"detail": "swapped out"}, "7")
    assert (health.status_code, health.json()["status"]) == (503, "loading")
