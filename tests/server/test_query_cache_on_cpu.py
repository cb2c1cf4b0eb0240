"""The exact-match query cache: unit cases on real BM25 hits, and a real server with `--cache-mb`."""

import httpx
import pytest

from verl_search.server.app import create_app, index_service
from verl_search.server.cache import QueryCache, entry_bytes, normalise_query
from verl_search.server.settings import ServerSettings
from verl_search.server.local import ThreadServer


def test_hits_misses_and_the_key(bm25_retriever):
    cache = QueryCache(max_mb=1, fingerprint="index-a")
    hits = bm25_retriever.search(["Lilu mythology"], 3)
    assert cache.lookup(["Lilu mythology"], 3) == [None]  # cold: a miss
    cache.store(["Lilu mythology"], 3, hits)
    assert cache.lookup(["  Lilu   mythology "], 3) == hits  # whitespace is normalised away
    assert cache.lookup(["lilu mythology"], 3) == [None]  # case is kept (a cased encoder differs)
    assert cache.lookup(["Lilu mythology"], 5) == [None]  # topk is part of the key
    other_index = QueryCache(max_mb=1, fingerprint="index-b")
    assert cache.key("q", 3) != other_index.key("q", 3)  # so is the index fingerprint
    assert (cache.hits, cache.misses) == (1, 3)
    assert normalise_query("a\u0301 b") == "\u00e1 b"  # NFC


def test_eviction_keeps_the_estimated_size_under_the_bound(bm25_retriever):
    queries = [f"Lilu mythology {i}" for i in range(40)]
    rows = bm25_retriever.search(queries, 3)
    one = entry_bytes(("Lilu mythology 10", 3, "f"), rows[10])
    cache = QueryCache(max_mb=10.5 * one / 2**20, fingerprint="f")  # room for about 10 entries
    cache.store(queries, 3, rows)
    assert cache.bytes <= cache.max_bytes and 8 <= cache.entries <= 11 and cache.evictions >= 29
    assert cache.lookup([queries[0]], 3) == [None]  # the oldest went first
    assert cache.lookup([queries[-1]], 3) == [rows[-1]]  # the newest stays
    cache.lookup([queries[-9]], 3)  # used now: survives the next evictions
    cache.store(["new one", "new two"], 3, bm25_retriever.search(["new one", "new two"], 3))
    assert cache.lookup([queries[-9]], 3) != [None]


def test_off_by_default_counts_nothing(bm25_retriever, bm25_server):
    cache = QueryCache(max_mb=ServerSettings().cache_mb)
    cache.store(["q"], 3, bm25_retriever.search(["q"], 3))
    assert not cache.enabled and cache.lookup(["q"], 3) == [None] and cache.hits == cache.misses == 0
    response = httpx.post(f"{bm25_server.url}/retrieve", json={"queries": ["Lilu mythology"]})
    assert "cache" not in response.headers["server-timing"]
    assert httpx.get(f"{bm25_server.url}/health").json()["cache_hits"] is None


def test_server_answers_repeats_from_the_cache(bm25_retriever):
    settings = ServerSettings(cache_mb=4)
    with ThreadServer(create_app(index_service(bm25_retriever, settings, fingerprint="mini-bm25"))) as server:
        url = f"{server.url}/retrieve"
        first = httpx.post(url, json={"queries": ["Lilu mythology", "Alû demon"], "topk": 3})
        second = httpx.post(url, json={"queries": ["Alû demon", "Lilu  mythology", "Nolan"], "topk": 3})
        health = httpx.get(f"{server.url}/health").json()
    assert 'cache;desc="hits=0 misses=2"' in first.headers["server-timing"]
    assert 'cache;desc="hits=2 misses=1"' in second.headers["server-timing"]
    a, b = first.json()["result"], second.json()["result"]
    assert b[0] == a[1] and b[1] == a[0]  # the cached answers are the searched ones
    assert health["cache_hits"] == 2 and health["cache_misses"] == 3 and health["cache_entries"] == 3
    assert health["queries"] == 3  # the retriever saw only the misses
    assert 0 < health["cache_mb"] < 4


def test_cache_mb_must_not_be_negative():
    with pytest.raises(ValueError, match="cache_mb"):
        ServerSettings(cache_mb=-1)
