"""What the retrieval app serves: the `SearchBackend` protocol, and the dependencies every route receives it through.

`server.app.create_app(backend)` builds one FastAPI app over any backend: the routes every backend answers
(`POST /retrieve` in Search-R1's wire format, `GET /health`), request validation and limits
(`server.validation`), the `Server-Timing` header, draining and the app's lifespan are the app's; what is
searched, what `/health` reports and the backend's own routes are the backend's. Two backends ship:

* the index (`server.service.RetrievalService`, built by `server.app.index_service`): a local BM25, dense or
  hybrid retriever behind the micro-batcher and the query cache, with ReSearch's routes and `/access`;
* the web (`server.web.service.WebService`, `serve --backend web`): a web search API and a page reader.

Routes never read `app.state.service` directly: they declare `Depends(get_service)`, `Depends(ready_service)`
or `Depends(get_settings)`, so a test swaps any of them with `app.dependency_overrides` (FastAPI docs,
"Testing Dependencies with Overrides"). The dependencies are `async def` on purpose: FastAPI runs a plain
`def` dependency in its thread pool, a thread hop per dependency per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from fastapi import Depends, FastAPI, HTTPException, Request

from verl_search.server.settings import ServerSettings


@runtime_checkable
class SearchBackend(Protocol):
    """A backend of the retrieval app.

    Attributes:
        title, description: the OpenAPI page's (`/docs`).
        settings: the request limits (`max_topk`, `max_queries`, `max_query_chars`, `default_topk`) every
            route checks; the index also batches and caches by them.
        draining: True once `drain()` was called (SIGTERM, `server.serve.draining_server`): new requests get
            503 + `Retry-After`, those in flight are answered.
        in_flight: search requests being answered (a drain waits for them).
        routes: functions that add the backend's own routes to the app (`add(app)`), after `/retrieve` and
            `/health`.
        error_handlers: exception class -> FastAPI exception handler, for the errors the backend raises
            (the web: an upstream API's failure is a 424 or 429, never a 5xx).
    """

    title: str
    description: str
    settings: ServerSettings
    draining: bool
    in_flight: int
    routes: Sequence[Callable[[FastAPI], None]]
    error_handlers: Mapping[type[Exception], Callable]

    def start(self) -> None:
        """Called once at the app's startup, before any request (the index starts loading here)."""

    async def aclose(self) -> None:
        """Called once at the app's shutdown (close pools, caches, worker threads)."""

    def drain(self) -> None:
        """Refuse new requests from now on (`draining`)."""

    def unready(self) -> str | None:
        """Why the backend cannot answer yet (the 503's message), or None when it can."""

    async def retrieve(self, receive, queries: list[str], topk: int) -> tuple[list[list] | None, int | None]:
        """The top-k hits of each query, for `/retrieve`.

        Args:
            receive: the request's ASGI `receive`: a backend may watch it and stop when the client is gone.
            queries: the request's queries (validated: count and length within `settings`).
            topk: hits per query (within `settings.max_topk`).

        Returns:
            `(hits, cache_hits)`: `len(queries)` lists of `retrieval.base.Hit` (or None when the client
            disconnected first), and how many queries a cache answered (None: the backend has no cache on).
        """

    async def health(self) -> dict:
        """The `GET /health` body (`schemas.HealthResponse`'s fields and the backend's own); its `status`
        is `ready` (HTTP 200) or another state (503)."""


async def get_service(request: Request) -> SearchBackend:
    """The app's backend (`app.state.service`), in any state."""
    return request.app.state.service


async def ready_service(service: SearchBackend = Depends(get_service)) -> SearchBackend:
    """The backend, once it can answer.

    Raises:
        HTTPException: 503 + `Retry-After: 2` when draining; 503 + `Retry-After: 1` with `service.unready()`'s
            message while it cannot answer (the index: loading, or a failed load naming the error).
    """
    if service.draining:
        raise HTTPException(status_code=503, detail="server is draining (shutting down); retry shortly",
                            headers={"Retry-After": "2"})
    reason = service.unready()
    if reason is not None:
        raise HTTPException(status_code=503, detail=reason, headers={"Retry-After": "1"})
    return service


async def get_settings(service: SearchBackend = Depends(get_service)) -> ServerSettings:
    """The backend's request limits (and, for the index, its batching)."""
    return service.settings
