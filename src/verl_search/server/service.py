"""The state of one retrieval app (`app.state.service`) and the dependencies its routes receive it through.

`RetrievalService` holds the app's components: `settings`, the query `cache`, the `retriever` and
its `batcher` once loaded, the corpus `pages` for `/access`, and the counters `/health` reports.
Routes never read it directly: they declare `Depends(ready_batcher)`, `Depends(get_cache)`, ... (the
functions below), so a test swaps any of them with `app.dependency_overrides` (FastAPI docs,
"Testing Dependencies with Overrides"). The dependencies are `async def` on purpose: FastAPI runs a
plain `def` dependency in its thread pool, a thread hop per dependency per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Union

from fastapi import Depends, HTTPException, Request

from verl_search.retrieval.base import Retriever
from verl_search.server.batcher import MicroBatcher
from verl_search.server.cache import QueryCache
from verl_search.server.settings import ServerSettings

logger = logging.getLogger(__name__)

RetrieverSource = Union[Retriever, Callable[[], Retriever]]


class RetrievalService:
    """One app's components and state.

    Args:
        settings: limits and batching.
        cache: the query cache (`QueryCache(settings.cache_mb, fingerprint)`; a disabled one when
            `cache_mb` is 0).
        pages: the served corpus's pages for `POST /access` (`server.access.CorpusPages`), or None.
        health_extras: returns fields added to `GET /health` (see `server.app.create_app`), or None.

    Attributes:
        status: `loading`, `ready` or `failed` (`error` then says why); `draining`: True once
            `drain()` was called (SIGTERM, see `server.serve`); `in_flight`: search requests
            (`/retrieve`, `/batch_search`, `/search`) being answered (`search`); `retriever`, `batcher`: None until loaded.
    """

    def __init__(self, settings: ServerSettings, cache: QueryCache, pages=None,
                 health_extras: Callable[[], dict] | None = None):
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

    async def search(self, receive, batcher: MicroBatcher, cache: QueryCache, queries: list[str], topk: int):
        """`search_through_cache`, counted in `in_flight` while it runs (a drain waits for it)."""
        self.in_flight += 1
        try:
            return await search_through_cache(receive, batcher, cache, queries, topk)
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

    def health(self) -> dict:
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


async def get_service(request: Request) -> RetrievalService:
    """The app's `RetrievalService` (`app.state.service`), in any state."""
    return request.app.state.service


async def ready_service(service: RetrievalService = Depends(get_service)) -> RetrievalService:
    """The service, once it can answer.

    Raises:
        HTTPException: 503 + `Retry-After` while loading, after a failed load (naming the error),
            or when draining.
    """
    if service.draining:
        raise HTTPException(status_code=503, detail="server is draining (shutting down); retry shortly",
                            headers={"Retry-After": "2"})
    if service.status != "ready":
        detail = f"index {service.status}" + (f": {service.error}" if service.error else "; retry after /health is ready")
        raise HTTPException(status_code=503, detail=detail, headers={"Retry-After": "1"})
    return service


async def ready_batcher(service: RetrievalService = Depends(ready_service)) -> MicroBatcher:
    """The loaded retriever's micro-batcher (503 as `ready_service`)."""
    return service.batcher


async def get_cache(service: RetrievalService = Depends(get_service)) -> QueryCache:
    """The app's query cache (disabled: every lookup misses, nothing is stored)."""
    return service.cache


async def get_settings(service: RetrievalService = Depends(get_service)) -> ServerSettings:
    """The app's limits and batching."""
    return service.settings


async def _disconnected(receive) -> None:
    """Return once the client has gone (the ASGI `http.disconnect` message; the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def search_unless_gone(receive, batcher: MicroBatcher, queries: list[str], topk: int):
    """The hits of `queries`, or None if the client disconnected first (its job is then dropped
    by the batcher: what is not searched yet never is). `receive`: the request's ASGI receive."""
    hits = batcher.submit(queries, topk)
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


async def search_through_cache(receive, batcher: MicroBatcher, cache: QueryCache, queries: list[str], topk: int):
    """Answer what `cache` holds, search only the misses (as `search_unless_gone`) and store them.

    Returns:
        `(hits or None, cache hits in this request)`: `len(queries)` lists of hits, or None if the
        client disconnected first. A disabled cache holds nothing, so every query is searched.
    """
    cached = cache.lookup(queries, topk)
    missing = [i for i, row in enumerate(cached) if row is None]
    if not missing:
        return cached, len(queries)
    found = await search_unless_gone(receive, batcher, [queries[i] for i in missing], topk)
    if found is None:
        return None, len(queries) - len(missing)
    cache.store([queries[i] for i in missing], topk, found)
    for i, row in zip(missing, found):
        cached[i] = row
    return cached, len(queries) - len(missing)
