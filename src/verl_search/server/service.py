"""The index backend of the retrieval app: `RetrievalService` (a `server.backend.SearchBackend`).

`RetrievalService` holds the components of an app over a local index: `settings`, the query `cache`, the
`retriever` and its `batcher` once loaded, the corpus `pages` for `/access`, and the counters `/health`
reports; `server.app.index_service` builds one with its routes (ReSearch's, `/access`). Its routes receive
the batcher and the cache through `Depends(ready_batcher)` and `Depends(get_cache)` (below), the service and
its settings through `server.backend`'s dependencies, so a test swaps any of them with
`app.dependency_overrides`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Union

from fastapi import Depends, FastAPI

from verl_search.retrieval.base import Retriever
from verl_search.server.backend import get_service, ready_service
from verl_search.server.batcher import MicroBatcher
from verl_search.server.cache import QueryCache
from verl_search.server.schemas import HealthResponse
from verl_search.server.settings import ServerSettings

logger = logging.getLogger(__name__)

RetrieverSource = Union[Retriever, Callable[[], Retriever]]


class RetrievalService:
    """One index app's components and state.

    Args:
        settings: limits and batching.
        cache: the query cache (`QueryCache(settings.cache_mb, fingerprint)`; a disabled one when
            `cache_mb` is 0).
        pages: the served corpus's pages for `POST /access` (`server.access.CorpusPages`), or None.
        health_extras: returns fields added to `GET /health` (see `server.app.index_service`), or None.
        source: a loaded `Retriever` (ready once `start()` returns), or a zero-argument function that loads
            one in a background thread from `start()` on (None: nothing is loaded, the service stays `loading`).
        on_load_failure: called with the exception if loading fails (the CLI stops the server).
        routes: the app's routes beside `/retrieve` and `/health` (`SearchBackend.routes`).

    Attributes:
        status: `loading`, `ready` or `failed` (`error` then says why); `draining`: True once
            `drain()` was called (SIGTERM, see `server.serve`); `in_flight`: search requests
            (`/retrieve`, `/batch_search`, `/search`) being answered (`search`); `retriever`, `batcher`: None until loaded.
    """

    title = "verl-search retrieval service"
    description = "Search-R1-compatible passage retrieval (BM25 or dense faiss) with cross-request micro-batching."

    def __init__(self, settings: ServerSettings, cache: QueryCache, pages=None,
                 health_extras: Callable[[], dict] | None = None, source: RetrieverSource | None = None,
                 on_load_failure: Callable[[BaseException], None] | None = None,
                 routes: Sequence[Callable[[FastAPI], None]] = ()):
        self.settings = settings
        self.cache = cache
        self.pages = pages
        self.health_extras = health_extras
        self.status = "loading"
        self.draining = False
        self.in_flight = 0
        self.error: str | None = None
        self.retriever: Retriever | None = None
        self.batcher: MicroBatcher | None = None
        self.source, self.on_load_failure, self.routes = source, on_load_failure, tuple(routes)
        self.error_handlers: dict = {}  # its errors (a lost shard: RetrieverUnavailableError) are the app's

    def start(self) -> None:
        """Load `source` in a background thread (`load`): `/health` answers `loading` until it is in memory. A
        retriever already loaded is made ready here, before the app answers its first request."""
        if isinstance(self.source, Retriever):
            self.load(self.source, self.on_load_failure)
        elif self.source is not None:
            threading.Thread(target=self.load, args=(self.source, self.on_load_failure), name="index-loader",
                             daemon=True).start()

    async def aclose(self) -> None:
        self.close()

    def unready(self) -> str | None:
        """None once the index is loaded; else `index loading; ...` or `index failed: <error>`."""
        if self.status == "ready":
            return None
        return f"index {self.status}" + (f": {self.error}" if self.error else "; retry after /health is ready")

    async def retrieve(self, receive, queries: list[str], topk: int):
        """`/retrieve`: `search` through the app's cache and batcher; the cache's hits when it is on."""
        hits, from_cache = await self.search(receive, self.batcher, self.cache, queries, topk)
        return hits, from_cache if self.cache.enabled else None

    async def search(self, receive, batcher: MicroBatcher, cache: QueryCache, queries: list[str], topk: int,
                     fill: bool = False):
        """`search_through_cache`, counted in `in_flight` while it runs (a drain waits for it)."""
        self.in_flight += 1
        try:
            return await search_through_cache(receive, batcher, cache, queries, topk, fill)
        finally:
            self.in_flight -= 1

    def load(self, source: RetrieverSource, on_failure: Callable[[BaseException], None] | None) -> None:
        """Load the retriever (call `source` unless it is one) and start its batcher; on an
        exception, `status` becomes `failed` and `on_failure(exc)` is called (or the error logged)."""
        try:
            retriever = source if isinstance(source, Retriever) else source()
            self.batcher = MicroBatcher(
                retriever,
                micro_batching=self.settings.micro_batching,
                max_batch_size=self.settings.max_batch_size,
                max_wait_ms=self.settings.max_wait_ms,
                burst_gap_ms=self.settings.burst_gap_ms,
                max_burst_wait_ms=self.settings.max_burst_wait_ms,
            )
            self.retriever = retriever
            self.status = "ready"
            logger.info("index ready: %s retriever, %d passages", retriever.kind, retriever.num_passages)
        except BaseException as exc:
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            if on_failure is not None:
                on_failure(exc)  # the caller reports it (the CLI: one error line, exit 1)
            else:
                logger.error("loading the index failed: %s", self.error)

    def drain(self) -> None:
        """Refuse new requests (503 + Retry-After) and say `draining` in `/health`; requests
        already in flight are answered."""
        self.draining = True

    def close(self) -> None:
        """Stop the batcher's worker (the app's shutdown)."""
        if self.batcher is not None:
            self.batcher.close()

    async def health(self) -> dict:
        """The `/health` body: `HealthResponse`'s fields of this state (the cache's only when it is on) and
        `health_extras()`'s (run in a worker thread; an exception there is logged and its fields left out)."""
        payload = HealthResponse(**self.health_fields()).model_dump()
        if self.health_extras is not None:
            try:
                payload.update(await asyncio.to_thread(self.health_extras))
            except Exception as exc:  # the service answers whatever the extras' source does
                logger.warning("health extras failed: %s", exc)
        return payload

    def health_fields(self) -> dict:
        """The `/health` fields of this state (`HealthResponse`'s; the cache's only when it is on)."""
        fields = {"status": "draining" if self.draining else self.status, "error": self.error,
                  "in_flight": self.in_flight}
        if self.retriever is not None:
            batcher = self.batcher
            fields.update(retriever=self.retriever.kind, num_passages=self.retriever.num_passages,
                          batches=batcher.batches, queries=batcher.queries, duplicates=batcher.duplicates,
                          search_seconds=round(batcher.search_seconds, 3))
            if self.cache.enabled:
                fields.update(self.cache.stats())
        return fields


async def ready_batcher(service: RetrievalService = Depends(ready_service)) -> MicroBatcher:
    """The loaded retriever's micro-batcher (503 as `ready_service`)."""
    return service.batcher


async def get_cache(service: RetrievalService = Depends(get_service)) -> QueryCache:
    """The app's query cache (disabled: every lookup misses, nothing is stored)."""
    return service.cache


async def _disconnected(receive) -> None:
    """Return once the client has gone (the ASGI `http.disconnect` message; the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def search_unless_gone(receive, batcher: MicroBatcher, queries: list[str], topk: int, fill: bool = False):
    """The hits of `queries`, or None if the client disconnected first (its job is then dropped
    by the batcher: what is not searched yet never is). `receive`: the request's ASGI receive;
    `fill`: ReSearch's answer, `topk` passages for every query (`MicroBatcher.submit`)."""
    hits = batcher.submit(queries, topk, fill)
    gone = asyncio.ensure_future(_disconnected(receive))
    gone.add_done_callback(lambda _: hits.cancel())  # one callback, not asyncio.wait's per-request bookkeeping
    try:
        return await hits
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled():
            return None
        raise  # the handler itself was cancelled (server shutdown)
    finally:
        gone.cancel()


async def search_through_cache(receive, batcher: MicroBatcher, cache: QueryCache, queries: list[str], topk: int,
                               fill: bool = False):
    """Answer what `cache` holds, search only the misses (as `search_unless_gone`, `fill` likewise) and store them.

    Returns:
        `(hits or None, cache hits in this request)`: `len(queries)` lists of hits, or None if the
        client disconnected first. A disabled cache holds nothing, so every query is searched.
    """
    cached = cache.lookup(queries, topk, fill)
    missing = [i for i, row in enumerate(cached) if row is None]
    if not missing:
        return cached, len(queries)
    found = await search_unless_gone(receive, batcher, [queries[i] for i in missing], topk, fill)
    if found is None:
        return None, len(queries) - len(missing)
    cache.store([queries[i] for i in missing], topk, found, fill)
    for i, row in zip(missing, found):
        cached[i] = row
    return cached, len(queries) - len(missing)
