"""The retrieval service: `create_app(retriever, settings)` returns a FastAPI app.

Nothing loads on import. The retriever (or a function that loads it) is handed to `create_app`;
a loader runs in a background thread started by the app's lifespan, so `GET /health` answers
`loading` (HTTP 503) until the index is in memory and `ready` (200) after, and a trainer that
waits for `/health` never starts against a half-loaded server.

The app's components (settings, query cache, retriever, micro-batcher, corpus pages) live in one
`server.service.RetrievalService` at `app.state.service`; every route receives what it uses through
FastAPI's `Depends` (`ready_batcher`, `get_cache`, `get_settings`, `get_service`), so a test swaps any
of them with `app.dependency_overrides`. The `/retrieve` body is read and validated by
`validation.parse_retrieve_request` (one pydantic-core call), not by a FastAPI body parameter.

Endpoints: `POST /retrieve` (Search-R1 wire format, see `schemas`), `POST /batch_search` and
`POST /search` (FlashRAG's, which ReSearch's rollout calls; see `server.flashrag`), `GET /health`,
`POST /access` (page access by id or title, when `create_app` gets `pages`; see `server.access`), and
the OpenAPI page at `/docs`.

Under faults: a request whose client disconnects before its batch runs is dropped unsearched (the
handler watches for the ASGI disconnect and cancels its job); after `RetrievalService.drain()`
(SIGTERM in `server.serve`) new requests get 503 + `Retry-After` while those in flight are
answered; a 422 is never turned into a 500 by what it echoes (NaN, lone surrogates, 1 MB strings
are made safe); a shard that cannot answer is a 503 (`validation`, the one home of requests and their errors).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from verl_search.retrieval.base import RetrieverUnavailableError
from verl_search.server.access import CorpusPages, add_access_route
from verl_search.server.batcher import MicroBatcher
from verl_search.server.cache import QueryCache
from verl_search.server.flashrag import add_flashrag_routes
from verl_search.server.schemas import HealthResponse, RetrieveResponse, encode_retrieve_response
from verl_search.server.service import (
    RetrievalService,
    RetrieverSource,
    get_cache,
    get_service,
    get_settings,
    ready_batcher,
)
from verl_search.server.settings import ServerSettings
from verl_search.server.validation import (
    RETRIEVE_REQUEST_OPENAPI,
    check_retrieve_limits,
    parse_retrieve_request,
    read_body,
    retriever_unavailable,
    validation_error,
)

logger = logging.getLogger(__name__)

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


def create_app(
    retriever: RetrieverSource,
    settings: ServerSettings | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
    fingerprint: str = "",
    health_extras: Callable[[], dict] | None = None,
    pages: CorpusPages | None = None,
) -> FastAPI:
    """Build the retrieval app.

    Args:
        retriever: a loaded `Retriever`, or a zero-argument function that loads one (run in a
            background thread at startup, e.g. `IndexSpec.load`).
        settings: limits and batching (default `ServerSettings()`).
        on_load_failure: called with the exception if loading fails (the CLI stops the server).
        fingerprint: the index fingerprint, part of every query-cache key (`IndexSpec.fingerprint`).
        health_extras: returns fields added to `GET /health` (run in a worker thread; Ray Serve
            replicas add the replicas up, see `server.ray_serve`); an exception there is logged and
            the fields are left out.
        pages: the served corpus's pages, for `POST /access` (`server.access`; filled by the loader);
            None: no `/access` route.

    Returns:
        a FastAPI app (its state: `app.state.service`); serve it with uvicorn.
    """
    settings = settings or ServerSettings()
    service = RetrievalService(settings, QueryCache(settings.cache_mb, fingerprint), pages, health_extras)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = threading.Thread(target=service.load, args=(retriever, on_load_failure), name="index-loader", daemon=True)
        loader.start()
        yield
        service.close()

    app = FastAPI(
        title="verl-search retrieval service",
        description="Search-R1-compatible passage retrieval (BM25 or dense faiss) with cross-request micro-batching.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(RetrieverUnavailableError, retriever_unavailable)
    app.add_middleware(_StampArrival)
    app.post(RETRIEVE_PATH, response_model=RetrieveResponse, openapi_extra=RETRIEVE_REQUEST_OPENAPI)(retrieve)
    app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})(health)
    add_flashrag_routes(app)
    if pages is not None:
        add_access_route(app)
    return app


async def retrieve(
    request: Request,
    batcher: MicroBatcher = Depends(ready_batcher),
    cache: QueryCache = Depends(get_cache),
    settings: ServerSettings = Depends(get_settings),
    service: RetrievalService = Depends(get_service),
) -> Response:
    """Top-k passages for each query. Blank queries get an empty list. 422 on bad input; 503 while
    the index loads, after it failed, or while the server drains.

    The `Server-Timing: retrieve;dur=<ms>` header gives the server's time for the request, from
    its arrival at the app (before the body is read and validated) to the response, so clients
    can tell their own overhead from the server's. With the query cache on, a second entry
    `cache;desc="hits=H misses=M"` says how many of the request's queries it answered.
    A client that disconnects before its answer gets none (499 in the access log) and its
    queries not searched yet never are.
    """
    raw = await read_body(request.receive)
    if raw is None:  # the client gave up before sending its body
        return Response(status_code=499)
    body = parse_retrieve_request(raw)
    topk = check_retrieve_limits(body, settings)
    hits, from_cache = await service.search(request.receive, batcher, cache, list(body.queries), topk)
    if hits is None:  # the client gave up: nobody reads an answer
        return Response(status_code=499)
    timing = f"retrieve;dur={(time.perf_counter() - request.scope[ARRIVAL_KEY]) * 1000:.3f}"
    if cache.enabled:
        timing += f', cache;desc="hits={from_cache} misses={len(body.queries) - from_cache}"'
    content = encode_retrieve_response(hits, body.return_scores)
    return Response(content, media_type="application/json", headers={"Server-Timing": timing})


async def health(service: RetrievalService = Depends(get_service)) -> JSONResponse:
    """`ready` (200) once the index is loaded; `loading` or `failed` (503) before; `draining` (503)
    after SIGTERM, while in-flight requests finish. Counters: see `HealthResponse`."""
    payload = HealthResponse(**service.health()).model_dump()
    if service.health_extras is not None:
        try:
            payload.update(await asyncio.to_thread(service.health_extras))
        except Exception as exc:  # the service answers whatever the extras' source does
            logger.warning("health extras failed: %s", exc)
    return JSONResponse(payload, status_code=200 if payload["status"] == "ready" else 503)
