"""The retrieval service: `create_app(settings, retriever)` returns a FastAPI app.

Nothing loads on import. The retriever (or a function that loads it) is handed to `create_app`;
a loader runs in a background thread started by the app's lifespan, so `GET /health` answers
`loading` (HTTP 503) until the index is in memory and `ready` (200) after, and a trainer that
waits for `/health` never starts against a half-loaded server. `POST /retrieve` is answered by the
`_RetrieveRoute` middleware (503 unless ready; the body is validated by `parse_retrieve_request`),
ahead of FastAPI's routing; the FastAPI route runs the same handler and documents it.

Endpoints: `POST /retrieve` (Search-R1 wire format, see `schemas`), `GET /health`, `POST /access`
(page access by id or title, when `create_app` gets `pages`; see `server.access`), and the
OpenAPI page at `/docs`.

Under faults: a request whose client disconnects before its batch runs is dropped unsearched (the
handler watches for the ASGI disconnect and cancels its job); after `_Service.drain()` (SIGTERM in
`server.serve`) new requests get 503 + `Retry-After` while those in flight are answered; a 422 is
never turned into a 500 by what it echoes (NaN, lone surrogates, 1 MB strings are made safe).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Union

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from verl_search.retrieval.base import Retriever
from verl_search.server.access import CorpusPages, add_access_route
from verl_search.server.batcher import MicroBatcher
from verl_search.server.cache import QueryCache
from verl_search.server.schemas import HealthResponse, RetrieveRequest, RetrieveResponse, encode_retrieve_response
from verl_search.server.settings import ServerSettings

logger = logging.getLogger(__name__)

RetrieverSource = Union[Retriever, Callable[[], Retriever]]
ARRIVAL_KEY = "verl_search.arrival"
RETRIEVE_PATH = "/retrieve"


class _RetrieveRoute:
    """ASGI middleware: answers `POST /retrieve` itself and passes every other request on.

    It sits where user middleware does (inside Starlette's `ServerErrorMiddleware`, so an
    unexpected exception is still a logged 500) and calls the route's own handler, skipping
    FastAPI's exception middleware, router, request/response wrappers and endpoint machinery.
    With the batcher's one wake-up per batch, this took the event loop's CPU per request at 256
    single-query clients from 0.76 to 0.27 ms (per-thread CPU from `/proc`, docs/benchmarks/retrieval-server.md), CPU
    the encoder's threads share on a small machine. The FastAPI route runs the same handler for a
    `/retrieve` this does not match (an app mounted under a prefix) and documents it in OpenAPI.
    Every request is stamped with `perf_counter()` at `ARRIVAL_KEY` (for `Server-Timing`).
    """

    def __init__(self, app, handler: Callable):
        self.app = app
        self.handler = handler

    async def __call__(self, scope, receive, send):
        scope[ARRIVAL_KEY] = time.perf_counter()
        if scope["type"] == "http" and scope["path"] == RETRIEVE_PATH and scope["method"] == "POST":
            response = await self.handler(scope, receive)
            await response(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class _Service:
    """State of one app: `status` is `loading`, `ready` or `failed`; `draining` once `drain()` was
    called (SIGTERM, see `server.serve`); `in_flight`: `/retrieve` requests being answered."""

    def __init__(self, settings: ServerSettings, fingerprint: str = ""):
        self.settings = settings
        self.cache = QueryCache(settings.cache_mb, fingerprint)
        self.status = "loading"
        self.draining = False
        self.in_flight = 0
        self.error: str | None = None
        self.retriever: Retriever | None = None
        self.batcher: MicroBatcher | None = None

    def load(self, source: RetrieverSource, on_failure: Callable[[BaseException], None] | None) -> None:
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
        """Refuse new `/retrieve` requests (503 + Retry-After) and say `draining` in `/health`;
        requests already in flight are answered."""
        self.draining = True


async def _disconnected(receive) -> None:
    """Return once the client has gone (the ASGI `http.disconnect` message; the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _search_unless_gone(receive, batcher: MicroBatcher, queries: list[str], topk: int):
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


async def _search_with_cache(receive, batcher: MicroBatcher, cache: QueryCache, queries: list[str], topk: int):
    """Like `_search_unless_gone`, but answer what `cache` holds and search only the misses
    (then store them). Returns `(hits or None, cache hits in this request)`."""
    cached = cache.lookup(queries, topk)
    missing = [i for i, row in enumerate(cached) if row is None]
    if not missing:
        return cached, len(queries)
    found = await _search_unless_gone(receive, batcher, [queries[i] for i in missing], topk)
    if found is None:
        return None, len(queries) - len(missing)
    cache.store([queries[i] for i in missing], topk, found)
    for i, row in zip(missing, found):
        cached[i] = row
    return cached, len(queries) - len(missing)


#: the OpenAPI request body of `/retrieve` (the route reads the body itself, see `parse_retrieve_request`)
RETRIEVE_REQUEST_OPENAPI = {"requestBody": {
    "required": True, "content": {"application/json": {"schema": RetrieveRequest.model_json_schema()}}}}


async def _read_body(receive) -> bytes | None:
    """The whole request body from ASGI `receive`, or None if the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_retrieve_request(body: bytes) -> RetrieveRequest:
    """A `/retrieve` body, validated by pydantic straight from the JSON bytes.

    This is what FastAPI would do with a `body: RetrieveRequest` parameter, in one pydantic-core
    call instead of `json.loads`, then validation, then the dependency machinery: about 15% less
    server CPU per request (`benchmarks/bench_http_overhead.py`).

    Raises:
        RequestValidationError: a 422 shaped like FastAPI's own (`loc` starts with `"body"`),
            for bad JSON or a body that breaks the `RetrieveRequest` contract.
    """
    try:
        return RetrieveRequest.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            error["loc"] = ("body", *error["loc"])
            if isinstance(error.get("input"), bytes):  # bad JSON echoes the raw body, maybe not UTF-8
                error["input"] = error["input"].decode("utf-8", "replace")
        raise RequestValidationError(errors) from None


def _unprocessable(field: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors, naming the field."""
    return HTTPException(status_code=422, detail=[{"loc": ["body", field], "msg": message, "type": "value_error"}])


def _json_safe(value, limit: int = 200):
    """`value` made encodable as strict ASCII JSON: non-finite floats become strings, long strings and
    containers are cut to `limit` characters / items (a 1 MB query is not echoed back in a 422)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "..."
    if isinstance(value, dict):
        return {_json_safe(str(k), limit): _json_safe(v, limit) for k, v in list(value.items())[:limit]}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, limit) for v in list(value)[:limit]]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _json_safe(repr(value), limit)


def check_retrieve_limits(body: RetrieveRequest, settings: ServerSettings) -> int:
    """The `topk` of a parsed `/retrieve` body (the server's default when omitted), within `settings`.

    Raises:
        HTTPException: 422 naming the field when `topk`, the number of queries or a query's length
            is above the server's limit.
    """
    topk = settings.default_topk if body.topk is None else body.topk
    if topk > settings.max_topk:
        raise _unprocessable("topk", f"topk is {topk}; this server allows at most max_topk={settings.max_topk}")
    if len(body.queries) > settings.max_queries:
        raise _unprocessable(
            "queries",
            f"{len(body.queries)} queries in one request; at most max_queries={settings.max_queries}: split the request",
        )
    for position, query in enumerate(body.queries):
        if len(query) > settings.max_query_chars:
            raise _unprocessable(
                "queries",
                f"queries[{position}] has {len(query)} characters; at most max_query_chars={settings.max_query_chars}",
            )
    return topk


async def validation_error(request: Request | None, exc: RequestValidationError) -> Response:
    """FastAPI's 422 body (`{"detail": [{"loc", "msg", "type", "input", ...}]}`), but never a 500:
    the echoed input may hold NaN, infinities or lone surrogates, which FastAPI's own handler
    cannot encode. Encoded as ASCII JSON (surrogates as `\\udXXX` escapes)."""
    detail = _json_safe(jsonable_encoder(exc.errors(), custom_encoder={float: lambda f: f}))
    return Response(json.dumps({"detail": detail}, ensure_ascii=True), status_code=422, media_type="application/json")


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
        a FastAPI app; serve it with uvicorn.
    """
    settings = settings or ServerSettings()
    service = _Service(settings, fingerprint)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = threading.Thread(target=service.load, args=(retriever, on_load_failure), name="index-loader", daemon=True)
        loader.start()
        yield
        if service.batcher is not None:
            service.batcher.close()

    app = FastAPI(
        title="verl-search retrieval service",
        description="Search-R1-compatible passage retrieval (BM25 or dense faiss) with cross-request micro-batching.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.add_exception_handler(RequestValidationError, validation_error)

    def get_batcher() -> MicroBatcher:
        """The service's batcher; HTTP 503 (+ `Retry-After`) while loading, after a failed load, or
        when draining."""
        if service.draining:
            raise HTTPException(status_code=503, detail="server is draining (shutting down); retry shortly",
                                headers={"Retry-After": "2"})
        if service.status != "ready":
            detail = f"index {service.status}" + (f": {service.error}" if service.error else "; retry after /health is ready")
            raise HTTPException(status_code=503, detail=detail, headers={"Retry-After": "1"})
        return service.batcher

    async def answer(scope, receive) -> Response:
        """The `/retrieve` response for the request of ASGI `scope`/`receive` (see `retrieve`)."""
        try:
            return await search(scope, receive)
        except HTTPException as exc:
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        except RequestValidationError as exc:
            return await validation_error(None, exc)

    async def search(scope, receive) -> Response:
        batcher = get_batcher()
        raw = await _read_body(receive)
        if raw is None:  # the client gave up before sending its body
            return Response(status_code=499)
        body = parse_retrieve_request(raw)
        topk = check_retrieve_limits(body, settings)
        service.in_flight += 1
        try:
            if service.cache.enabled:
                hits, from_cache = await _search_with_cache(receive, batcher, service.cache, list(body.queries), topk)
            else:
                hits = await _search_unless_gone(receive, batcher, list(body.queries), topk)
        finally:
            service.in_flight -= 1
        if hits is None:  # the client gave up: nobody reads an answer
            return Response(status_code=499)
        timing = f"retrieve;dur={(time.perf_counter() - scope[ARRIVAL_KEY]) * 1000:.3f}"
        if service.cache.enabled:
            timing += f', cache;desc="hits={from_cache} misses={len(body.queries) - from_cache}"'
        content = encode_retrieve_response(hits, body.return_scores)
        return Response(content, media_type="application/json", headers={"Server-Timing": timing})

    app.add_middleware(_RetrieveRoute, handler=answer)
    if pages is not None:
        add_access_route(app, service, pages)

    @app.post(RETRIEVE_PATH, response_model=RetrieveResponse, openapi_extra=RETRIEVE_REQUEST_OPENAPI)
    async def retrieve(request: Request):
        """Top-k passages for each query. Blank queries get an empty list. 422 on bad input.

        The `Server-Timing: retrieve;dur=<ms>` header gives the server's time for the request, from
        its arrival at the app (before the body is read and validated) to the response, so clients
        can tell their own overhead from the server's. With the query cache on, a second entry
        `cache;desc="hits=H misses=M"` says how many of the request's queries it answered.

        `_RetrieveRoute` answers a plain `POST /retrieve` before it gets here; this runs the same
        handler for an app mounted under a prefix.
        """
        return await answer(request.scope, request.receive)

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health():
        """`ready` (200) once the index is loaded; `loading` or `failed` (503) before; `draining` (503)
        after SIGTERM, while in-flight requests finish."""
        status = "draining" if service.draining else service.status
        body = HealthResponse(status=status, error=service.error, in_flight=service.in_flight)
        if service.retriever is not None:
            body.retriever, body.num_passages = service.retriever.kind, service.retriever.num_passages
            batcher = service.batcher
            body.batches, body.queries, body.duplicates = batcher.batches, batcher.queries, batcher.duplicates
            body.search_seconds = round(batcher.search_seconds, 3)
            if service.cache.enabled:
                for name, value in service.cache.stats().items():
                    setattr(body, name, value)
        payload = body.model_dump()
        if health_extras is not None:
            try:
                payload.update(await asyncio.to_thread(health_extras))
            except Exception as exc:  # the service answers whatever the extras' source does
                logger.warning("health extras failed: %s", exc)
        return JSONResponse(payload, status_code=200 if status == "ready" else 503)

    return app
