"""The web backend's service: `/retrieve`, `/access` and `/health` over `WebBackend` (`serve --backend web`).

Same wire format and input rules as the index server (`server.app`): `/retrieve` takes Search-R1's
`{"queries", "topk", "return_scores"}` and answers `{"result": [[{"document": {"id", "contents"},
"score"}]]}` (the document alone with `"return_scores": false`), 422 on bad input naming the field.
`/access` takes `{"urls": [...]}` or `{"ids": [...]}` (a web result's id is its URL).

Upstream faults are described, never a 5xx (see `server.web.upstream`): 429 with `Retry-After` when rate
limited, 424 otherwise, the message naming the failed query or URL. A whole request is bounded by
`--request-deadline` seconds. `/health` adds the cache's and the upstream's counters.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from verl_search.process.env import read_env
from verl_search.server.access import ACCESS_PATH, check_access_request, encode_access_response
from verl_search.server.app import RETRIEVE_PATH
from verl_search.server.schemas import AccessRequest, AccessResponse, HealthResponse, RetrieveResponse, encode_retrieve_response
from verl_search.server.settings import ServerSettings
from verl_search.server.validation import (
    RETRIEVE_REQUEST_OPENAPI,
    check_retrieve_limits,
    parse_retrieve_request,
    validation_error,
)
from verl_search.server.web.backend import WebBackend
from verl_search.server.web.options import WebOptions
from verl_search.server.web.upstream import UpstreamError

logger = logging.getLogger(__name__)


class _WebService:
    """State for `server.serve.draining_server`: `draining`, `in_flight`, `drain()`."""

    def __init__(self):
        self.draining, self.in_flight = False, 0

    def drain(self) -> None:
        self.draining = True


def _upstream_response(error: UpstreamError) -> JSONResponse:
    headers = {"Retry-After": str(max(1, math.ceil(error.retry_after or 1)))} if error.status == 429 else None
    return JSONResponse({"detail": error.message}, status_code=error.status, headers=headers)


def _is_http_url(value: str) -> bool:
    """`value` is an http(s) URL that can be requested (UTF-8, parsed by httpx)."""
    try:
        value.encode("utf-8")
        return value.startswith(("http://", "https://")) and bool(httpx.URL(value).host)
    except (UnicodeEncodeError, httpx.InvalidURL):
        return False


def create_web_app(backend: WebBackend, settings: ServerSettings | None = None, request_deadline: float = 30.0) -> FastAPI:
    """Build the web backend's app.

    Args:
        backend: the cache and upstream APIs (closed with the app).
        settings: the request limits (`max_topk`, `max_queries`, `max_query_chars`, `default_topk`);
            the batching fields do not apply.
        request_deadline: seconds for one request, retries included.

    Returns:
        a FastAPI app; serve it with uvicorn.
    """
    settings = settings or ServerSettings()
    service = _WebService()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await backend.upstream.aclose()
        backend.cache.close()

    app = FastAPI(title="verl-search web search service", lifespan=lifespan,
                  description="Search-R1-compatible /retrieve and /access over a web search API and page reader.")
    app.state.service = service
    app.add_exception_handler(RequestValidationError, validation_error)

    async def bounded(work):
        """`await work(deadline)` within the request deadline; an `UpstreamError` becomes its answer."""
        if service.draining:
            raise HTTPException(503, "server is draining (shutting down); retry shortly", {"Retry-After": "2"})
        service.in_flight += 1
        try:
            return await asyncio.wait_for(work(time.monotonic() + request_deadline), request_deadline + 1.0)
        except asyncio.TimeoutError:
            raise UpstreamError(424, f"no upstream answer within the {request_deadline:g} s request deadline") from None
        finally:
            service.in_flight -= 1

    @app.exception_handler(UpstreamError)
    async def upstream_error(request: Request, exc: UpstreamError):
        return _upstream_response(exc)

    @app.post(RETRIEVE_PATH, response_model=RetrieveResponse, openapi_extra=RETRIEVE_REQUEST_OPENAPI,
              responses={422: {}, 424: {}, 429: {}})
    async def retrieve(request: Request):
        """Top-k web results per query (Search-R1 wire format); 422 on bad input; 424/429 when the
        search API fails (never 5xx)."""
        body = parse_retrieve_request(await request.body())
        topk = check_retrieve_limits(body, settings)
        hits = await bounded(lambda deadline: backend.search(list(body.queries), topk, deadline))
        return Response(encode_retrieve_response(hits, body.return_scores), media_type="application/json")

    @app.post(ACCESS_PATH, response_model=AccessResponse, responses={422: {}, 424: {}, 429: {}})
    async def access(body: AccessRequest):
        """The text of each page, by `urls` (or `ids`: a web result's id is its URL)."""
        values = check_access_request(body, settings, ("urls", "ids"))
        for position, value in enumerate(values):
            if not _is_http_url(value):
                raise HTTPException(422, [{"loc": ["body", body.field, position], "type": "value_error",
                                           "msg": f"{body.field}[{position}] {value[:200]!r} is not an http(s) URL "
                                                  "(on the web backend a result's id is its URL)"}])
        pages = await bounded(lambda deadline: backend.read(values, deadline))
        return encode_access_response(pages)

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health():
        """`ready` (200), or `draining` (503) after SIGTERM; with the web cache's `cache_*` counters
        and `upstream_calls`, `upstream_retries`, `upstream_failures`, `coalesced`."""
        status = "draining" if service.draining else "ready"
        stats = backend.stats()
        body = HealthResponse(status=status, retriever=backend.kind, in_flight=service.in_flight,
                              **{k: v for k, v in stats.items() if k.startswith("cache_")})
        payload = {**body.model_dump(), **{k: v for k, v in stats.items() if not k.startswith("cache_")}}
        return JSONResponse(payload, status_code=200 if status == "ready" else 503)

    return app


def read_keys(options: WebOptions, environ=None) -> tuple[str, str | None]:
    """The search key (required) and the reader key (or None) from the environment variables named
    by `options`.

    Raises:
        ValueError: the search key's variable is unset or empty (names the variable and the fix).
    """
    environ = os.environ if environ is None else environ
    search_key = environ.get(options.search_key_env, "").strip()
    if not search_key:
        raise ValueError(f"--backend web needs a search API key in ${options.search_key_env} (Serper: serper.dev); "
                         f"export {options.search_key_env}=... before starting, or name another variable with "
                         "--search-key-env")
    return search_key, environ.get(options.reader_key_env, "").strip() or None


def build_backend(options: WebOptions) -> WebBackend:
    """The backend of `options`: keys from the environment, the cache folder opened.

    Raises:
        ValueError: no search key (see `read_keys`); OSError: the cache folder cannot be written.
    """
    from verl_search.process.extras import require_extra
    from verl_search.server.web.cache import WebCache
    from verl_search.server.web.upstream import Upstream

    require_extra("web")
    search_key, reader_key = read_keys(options)
    directory = Path(options.web_cache_dir) if options.web_cache_dir else read_env().cache_dir / "web"
    cache = WebCache(directory, options.web_cache_mb, options.web_cache_days)
    logger.info("web backend: search %s, reader %s (key %s), cache %s", options.search_url, options.reader_url,
                "set" if reader_key else "not set", directory)
    return WebBackend(Upstream(options, search_key, reader_key), cache)


def serve_web(host: str, port: int, log_level: str, drain_timeout: float, settings: ServerSettings,
              options: WebOptions) -> int:
    """`verl-search serve --backend web`: check the key and the cache before binding the port, then
    serve until stopped (SIGTERM drains, as the index server). Returns the exit code (0).

    Raises:
        ValueError, OSError: see `build_backend`.
    """
    import uvicorn

    from verl_search.server.serve import draining_server

    app = create_web_app(build_backend(options), settings, options.request_deadline)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=max(1.0, drain_timeout))
    draining_server(config, app.state.service, drain_timeout).run()
    return 0
