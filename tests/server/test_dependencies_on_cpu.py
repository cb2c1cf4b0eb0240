"""Every route of `create_app` gets the backend and its components through FastAPI's `Depends`
(`server.backend`: `get_service`, `ready_service`, `get_settings`; the index's `server.service.get_cache`), so
`app.dependency_overrides` swaps them for `/retrieve`, `/access` and `/health` alike (FastAPI docs, "Testing
Dependencies with Overrides")."""

import httpx
import pytest
from fastapi import HTTPException

from verl_search.server.access import CorpusPages
from verl_search.server.app import create_app, index_service
from verl_search.server.backend import SearchBackend, get_service, ready_service
from verl_search.server.local import ThreadServer
from verl_search.server.service import get_cache
from verl_search.server.settings import ServerSettings


def test_a_backend_given_through_the_dependency_answers_retrieve(bm25_retriever):
    app = create_app(index_service(bm25_retriever))  # cache off: no cache entry in Server-Timing
    cached = index_service(bm25_retriever, ServerSettings(cache_mb=1))
    cached.load(bm25_retriever, None)
    with ThreadServer(app) as server:
        first = httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu mythology"], "topk": 2})
        assert "cache;" not in first.headers["server-timing"]
        app.dependency_overrides[get_service] = lambda: cached
        answers = [httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu mythology"], "topk": 2}) for _ in range(2)]
    cached.close()
    assert [a.headers["server-timing"].split("cache;")[1] for a in answers] == [
        'desc="hits=0 misses=1"', 'desc="hits=1 misses=0"']
    assert answers[1].json() == first.json()  # the same wire answer, from the swapped-in backend's cache
    assert (cached.cache.hits, cached.cache.misses, cached.cache.entries) == (1, 1, 1)


def test_the_index_routes_take_the_cache_from_its_dependency(bm25_retriever):
    app = create_app(index_service(bm25_retriever, ServerSettings(cache_mb=1)))
    with ThreadServer(app) as server:
        body = {"query": ["Lilu mythology"], "top_n": 2}
        first = httpx.post(f"{server.url}/batch_search", json=body)
        swapped = index_service(bm25_retriever, ServerSettings(cache_mb=1)).cache
        app.dependency_overrides[get_cache] = lambda: swapped
        second = httpx.post(f"{server.url}/batch_search", json=body)
    assert first.json() == second.json()
    assert (app.state.service.cache.misses, swapped.misses, swapped.entries) == (1, 1, 1)


def test_one_readiness_dependency_guards_retrieve_and_access(bm25_retriever):
    def refuse():
        raise HTTPException(503, "swapped out", {"Retry-After": "7"})

    app = create_app(index_service(bm25_retriever, pages=CorpusPages()))
    with ThreadServer(app) as server:
        app.dependency_overrides[ready_service] = refuse
        retrieve = httpx.post(f"{server.url}/retrieve", json={"queries": ["Lilu"]})
        access = httpx.post(f"{server.url}/access", json={"ids": ["1"]})
        app.dependency_overrides[get_service] = lambda: index_service(bm25_retriever)  # a backend that loaded nothing
        health = httpx.get(f"{server.url}/health")
    for response in (retrieve, access):
        assert (response.status_code, response.json(), response.headers["retry-after"]) == (503, {"detail": "swapped out"}, "7")
    assert (health.status_code, health.json()["status"]) == (503, "loading")


def test_create_app_takes_a_backend_and_names_the_wrapper_for_a_retriever(bm25_retriever):
    assert isinstance(index_service(bm25_retriever), SearchBackend)
    with pytest.raises(TypeError, match=r"create_app\(index_service\(retriever, settings\)\)"):
        create_app(bm25_retriever)
