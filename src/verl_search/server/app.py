"""The retrieval app: `create_app(backend)` returns a FastAPI app over a `server.backend.SearchBackend`.

One app for every backend: the index (`index_service(retriever, settings)`, below) and the web
(`server.web.service.WebService`). The app owns what they share: `POST /retrieve` (Search-R1 wire format,
see `schemas`), read and validated by `validation.parse_retrieve_request` (one pydantic-core call, not a
FastAPI body parameter) and checked against the backend's limits; `GET /health`; the `Server-Timing`
header; draining (after SIGTERM, `server.serve`, new requests get 503 + `Retry-After` while those in flight
are answered); a 422 that is never turned into a 500 by what it echoes (NaN, lone surrogates, 1 MB strings
are made safe); a retriever that cannot answer now (a lost shard) as a 503; the OpenAPI page at `/docs`.
The backend adds its own routes: over an index, `POST /batch_search` and `POST /search` (ReSearch's API, which
ReSearch's rollout calls; `server.flashrag`) and `POST /access` (page access by id or title, when
`index_service` gets `pages`; `server.access`).

Nothing loads on import. The index's retriever (or a function that loads it) is loaded in a background
thread started by the app's lifespan, so `GET /health` answers `loading` (HTTP 503) until the index is in
memory and `ready` (200) after, and a trainer that waits for `/health` never starts against a half-loaded
server. Over an index, a request whose client disconnects before its batch runs is dropped unsearched (the
service watches for the ASGI disconnect and cancels its job).

Every route receives the backend through FastAPI's `Depends` (`server.backend.get_service`, `ready_service`,
`get_settings`; the index's routes also `server.service.ready_batcher` and `get_cache`), so a test swaps any
of them with `app.dependency_overrides`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from verl_search.retrieval.base import RetrieverUnavailableError
from verl_search.server.access import CorpusPages, add_access_route
from verl_search.server.backend import SearchBackend, get_service, get_settings, ready_service
from verl_search.server.cache import QueryCache
from verl_search.server.flashrag import add_research_routes
from verl_search.server.schemas import HealthResponse, RetrieveResponse, encode_retrieve_response
from verl_search.server.service import RetrievalService, RetrieverSource
from verl_search.server.settings import ServerSettings
from verl_search.server.validation import (
    RETRIEVE_REQUEST_OPENAPI,
    check_retrieve_limits,
    parse_retrieve_request,
    read_body,
    retriever_unavailable,
    validation_error,
)

ARRIVAL_KEY = "verl_search.arrival"
RETRIEVE_PATH = "/retrieve"


class _StampArrival:
    """ASGI middleware: stamps every request with `perf_counter()` at `scope[ARRIVAL_KEY]`, before
    anything else runs, for `/retrieve`'s `Server-Timing` header."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        scope[ARRIVAL_KEY] = time.perf_counter()
        await self.app(scope, receive, send)


def index_service(
    retriever: RetrieverSource,
    settings: ServerSettings | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
    fingerprint: str = "",
    health_extras: Callable[[], dict] | None = None,
    pages: CorpusPages | None = None,
) -> RetrievalService:
    """The index backend: `create_app(index_service(retriever, settings))` serves a local index.

    Args:
        retriever: a loaded `Retriever`, or a zero-argument function that loads one (run in a
            background thread at the app's startup, e.g. `IndexSpec.load`).
        settings: limits and batching (default `ServerSettings()`).
        on_load_failure: called with the exception if loading fails (the CLI stops the server).
        fingerprint: the index fingerprint, part of every query-cache key (`IndexSpec.fingerprint`).
        health_extras: returns fields added to `GET /health` (run in a worker thread; Ray Serve
            replicas add the replicas up, see `server.ray_serve`); an exception there is logged and
            the fields are left out.
        pages: the served corpus's pages, for `POST /access` (`server.access`; filled by the loader);
            None: no `/access` route.

    Returns:
        a `RetrievalService` with ReSearch's routes, and `/access` when `pages` is given.
    """
    settings = settings or ServerSettings()
    routes = (add_research_routes, *((add_access_route,) if pages is not None else ()))
    return RetrievalService(settings, QueryCache(settings.cache_mb, fingerprint), pages, health_extras,
                            source=retriever, on_load_failure=on_load_failure, routes=routes)


def create_app(backend: SearchBackend) -> FastAPI:
    """Build the retrieval app over `backend`.

    Args:
        backend: what is searched (`index_service(...)` or `server.web.service.WebService`); started and
            closed with the app (its lifespan), its own routes and error handlers added.

    Returns:
        a FastAPI app (its state: `app.state.service`, the backend); serve it with uvicorn.

    Raises:
        TypeError: `backend` is not a `SearchBackend` (a retriever: wrap it with `index_service`).
    """
    if not isinstance(backend, SearchBackend):
        raise TypeError(f"create_app takes a SearchBackend, not {type(backend).__name__}: serve a retriever "
                        "with create_app(index_service(retriever, settings))")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        backend.start()
        yield
        await backend.aclose()

    app = FastAPI(title=backend.title, description=backend.description, lifespan=lifespan)
    app.state.service = backend
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(RetrieverUnavailableError, retriever_unavailable)
    for error, handler in backend.error_handlers.items():
        app.add_exception_handler(error, handler)
    app.add_middleware(_StampArrival)
    app.post(RETRIEVE_PATH, response_model=RetrieveResponse, openapi_extra=RETRIEVE_REQUEST_OPENAPI,
             responses={422: {}, 503: {}})(retrieve)
    app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})(health)
    for add_routes in backend.routes:
        add_routes(app)
    return app


async def retrieve(
    request: Request,
    service: SearchBackend = Depends(ready_service),
    settings: ServerSettings = Depends(get_settings),
) -> Response:
    """Top-k passages for each query. Blank queries get an empty list. 422 on bad input; 503 while
    the index loads, after it failed, or while the server drains; the backend's own errors (the web:
    424 or 429 when its search API fails).

    The `Server-Timing: retrieve;dur=<ms>` header gives the server's time for the request, from
    its arrival at the app (before the body is read and validated) to the response, so clients
    can tell their own overhead from the server's. With a query cache on, a second entry
    `cache;desc="hits=H misses=M"` says how many of the request's queries it answered.
    A client that disconnects before its answer gets none (499 in the access log).
    """
    raw = await read_body(request.receive)
    if raw is None:  # the client gave up before sending its body
        return Response(status_code=499)
    body = parse_retrieve_request(raw)
    topk = check_retrieve_limits(body, settings)
    hits, from_cache = await service.retrieve(request.receive, list(body.queries), topk)
    if hits is None:  # the client gave up: nobody reads an answer
        return Response(status_code=499)
    timing = f"retrieve;dur={(time.perf_counter() - request.scope[ARRIVAL_KEY]) * 1000:.3f}"
    if from_cache is not None:
        timing += f', cache;desc="hits={from_cache} misses={len(body.queries) - from_cache}"'
    content = encode_retrieve_response(hits, body.return_scores)
    return Response(content, media_type="application/json", headers={"Server-Timing": timing})


async def health(service: SearchBackend = Depends(get_service)) -> JSONResponse:
    """`ready` (200) once the backend can answer; `loading` or `failed` (503) before; `draining` (503)
    after SIGTERM, while in-flight requests finish. Counters: see `HealthResponse` and the backend's."""
    payload = await service.health()
    return JSONResponse(payload, status_code=200 if payload["status"] == "ready" else 503)
