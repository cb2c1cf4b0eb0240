"""The web backend of the retrieval app: `WebService` (a `server.backend.SearchBackend`), `serve --backend web`.

`server.app.create_app(WebService(...))` answers the same routes as over an index, with the same wire format,
input rules and limits: `/retrieve` takes Search-R1's `{"queries", "topk", "return_scores"}` and answers
`{"result": [[{"document": {"id", "contents"}, "score"}]]}` (the document alone with `"return_scores": false`),
422 on bad input naming the field. Its own route, `/access`, takes `{"urls": [...]}` or `{"ids": [...]}` (a
web result's id is its URL).

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
from pathlib import Path

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from verl_search.runtime.env import read_env
from verl_search.server.access import ACCESS_PATH, check_access_request, encode_access_response
from verl_search.server.backend import ready_service
from verl_search.server.schemas import AccessRequest, AccessResponse, HealthResponse
from verl_search.server.settings import ServerSettings
from verl_search.server.web.backend import WebBackend
from verl_search.server.web.options import WebOptions
from verl_search.server.web.upstream import UpstreamError

logger = logging.getLogger(__name__)


async def upstream_error(request: Request | None, error: UpstreamError) -> JSONResponse:
    """An upstream failure's answer: its status (424, or 429 with `Retry-After`) and message."""
    headers = {"Retry-After": str(max(1, math.ceil(error.retry_after or 1)))} if error.status == 429 else None
    return JSONResponse({"detail": error.message}, status_code=error.status, headers=headers)


def _is_http_url(value: str) -> bool:
    """`value` is an http(s) URL that can be requested (UTF-8, parsed by httpx)."""
    try:
        value.encode("utf-8")
        return value.startswith(("http://", "https://")) and bool(httpx.URL(value).host)
    except (UnicodeEncodeError, httpx.InvalidURL):
        return False


class WebService:
    """A web search API and page reader as the retrieval app's backend.

    Args:
        backend: the cache and upstream APIs (closed with the app).
        settings: the request limits (`max_topk`, `max_queries`, `max_query_chars`, `default_topk`);
            the batching fields do not apply (default `ServerSettings()`).
        request_deadline: seconds for one request, retries included (default 30).
    """

    title = "verl-search web search service"
    description = "Search-R1-compatible /retrieve and /access over a web search API and page reader."

    def __init__(self, backend: WebBackend, settings: ServerSettings | None = None, request_deadline: float = 30.0):
        self.backend = backend
        self.settings = settings or ServerSettings()
        self.request_deadline = request_deadline
        self.draining, self.in_flight = False, 0
        self.routes = (add_web_access_route,)
        self.error_handlers = {UpstreamError: upstream_error}

    def start(self) -> None:
        """Nothing to load."""

    async def aclose(self) -> None:
        await self.backend.upstream.aclose()
        self.backend.cache.close()

    def drain(self) -> None:
        self.draining = True

    def unready(self) -> str | None:
        return None

    async def bounded(self, work):
        """`await work(deadline)` within the request deadline, counted in `in_flight`.

        Raises:
            UpstreamError: 424 when the deadline passed; what `work` raised.
        """
        self.in_flight += 1
        try:
            return await asyncio.wait_for(work(time.monotonic() + self.request_deadline), self.request_deadline + 1.0)
        except asyncio.TimeoutError:
            raise UpstreamError(424, f"no upstream answer within the {self.request_deadline:g} s request deadline") from None
        finally:
            self.in_flight -= 1

    async def retrieve(self, receive, queries: list[str], topk: int):
        """Top-k web results per query (no query cache of the app's: the web cache is the backend's own)."""
        return await self.bounded(lambda deadline: self.backend.search(queries, topk, deadline)), None

    async def health(self) -> dict:
        """`ready`, or `draining` after SIGTERM; with the web cache's `cache_*` counters and `upstream_calls`,
        `upstream_retries`, `upstream_failures`, `coalesced`."""
        stats = self.backend.stats()
        body = HealthResponse(status="draining" if self.draining else "ready", retriever=self.backend.kind,
                              in_flight=self.in_flight, **{k: v for k, v in stats.items() if k.startswith("cache_")})
        return {**body.model_dump(), **{k: v for k, v in stats.items() if not k.startswith("cache_")}}


async def access(body: AccessRequest, service: WebService = Depends(ready_service)):
    """The text of each page, by `urls` (or `ids`: a web result's id is its URL); 422 on bad input; 424/429
    when the reader fails (never 5xx)."""
    values = check_access_request(body, service.settings, ("urls", "ids"))
    for position, value in enumerate(values):
        if not _is_http_url(value):
            raise HTTPException(422, [{"loc": ["body", body.field, position], "type": "value_error",
                                       "msg": f"{body.field}[{position}] {value[:200]!r} is not an http(s) URL "
                                              "(on the web backend a result's id is its URL)"}])
    pages = await service.bounded(lambda deadline: service.backend.read(values, deadline))
    return encode_access_response(pages)


def add_web_access_route(app: FastAPI) -> None:
    """Add the web backend's `POST /access` (pages by URL) to a `create_app` app."""
    app.post(ACCESS_PATH, response_model=AccessResponse, responses={422: {}, 424: {}, 429: {}})(access)


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
    from verl_search.runtime.extras import require_extra
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

    from verl_search.server.app import create_app
    from verl_search.server.serve import draining_server

    app = create_app(WebService(build_backend(options), settings, options.request_deadline))
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=max(1.0, drain_timeout))
    draining_server(config, app.state.service, drain_timeout).run()
    return 0
