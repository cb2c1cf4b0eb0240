"""Calls to the paid web APIs: a Serper-compatible search API and a Jina-compatible page reader.

Formats followed (Serper's and Jina Reader's public documentation):

* search: `POST <search_url>` with header `X-API-KEY: <key>` and JSON body `{"q": query, "num": n}`;
  the answer's `"organic"` list holds the results, `{"title", "link", "snippet", "position", ...}`;
* reader: `GET <reader_url><page URL>` with `Authorization: Bearer <key>` (optional) and
  `Accept: application/json`; the answer is `{"code": 200, "data": {"title", "url", "content", ...}}`.

Every call passes a token bucket (`aiolimiter.AsyncLimiter`: `upstream_burst` tokens, refilled at
`upstream_rate` per second) and a semaphore (`upstream_concurrency` in flight), and is retried with
exponential backoff and full jitter (or the upstream's `Retry-After`) on 429, 5xx, timeouts and
connection errors, never past the request's deadline. What cannot be answered becomes an
`UpstreamError` that names the API, what it did and what to do, with the HTTP status the service
answers: 429 (with `Retry-After`) when the upstream or our own rate limit is the cause, else 424
(Failed Dependency). Never a 5xx: clients retry those (verl's search tool retries 500-504 ten times),
and every retry would be another paid call. Keys go in headers only and are never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter

import httpx
import orjson

from verl_search.server.web.options import WebOptions

logger = logging.getLogger(__name__)

SEARCH_API = "the search API"
READER_API = "the page reader"


class UpstreamError(Exception):
    """An upstream fault the service describes to its client.

    Attributes:
        status: the HTTP status the service answers (429 or 424).
        message: what happened and what to do (never the key).
        retry_after: seconds, for the `Retry-After` header of a 429.
    """

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds of a `Retry-After: <seconds>` header, or None (an HTTP date is ignored)."""
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None


def _snippet(payload: bytes) -> str:
    return payload[:200].decode("utf-8", "replace")


def parse_search_results(payload: bytes) -> list[dict]:
    """Serper's results: `{"title", "link", "snippet", "position"}` per organic result, in order.

    Raises:
        UpstreamError: 424, when the body is not JSON or has no `"organic"` list of results with a `"link"`.
    """
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise UpstreamError(424, f"{SEARCH_API} answered a body that is not JSON: {_snippet(payload)!r}") from None
    organic = data.get("organic") if isinstance(data, dict) else None
    if not isinstance(organic, list) or not all(isinstance(r, dict) and isinstance(r.get("link"), str) for r in organic):
        raise UpstreamError(424, f'{SEARCH_API} answered JSON without Serper\'s "organic" list of results with a '
                                 f'"link": {_snippet(payload)!r}')
    return [{"title": str(r.get("title") or ""), "link": r["link"], "snippet": str(r.get("snippet") or ""),
             "position": r.get("position") if isinstance(r.get("position"), int) else i + 1}
            for i, r in enumerate(organic)]


def parse_page(payload: bytes, url: str) -> dict:
    """Jina Reader's page: `{"title", "url", "content"}`.

    Raises:
        UpstreamError: 424, when the body is not JSON or has no `"data"` with a string `"content"`.
    """
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise UpstreamError(424, f"{READER_API} answered a body that is not JSON for {url}: {_snippet(payload)!r}") from None
    page = data.get("data") if isinstance(data, dict) else None
    if not isinstance(page, dict) or not isinstance(page.get("content"), str):
        raise UpstreamError(424, f'{READER_API} answered JSON without a "data" object with a "content" string for '
                                 f'{url}: {_snippet(payload)!r}')
    return {"title": str(page.get("title") or ""), "url": str(page.get("url") or url), "content": page["content"]}


class Upstream:
    """The search API and page reader behind one token bucket, one semaphore and one retry policy.

    Args:
        options: URLs, limits and retry policy.
        search_key: the search API key (sent as `X-API-KEY`).
        reader_key: the reader key (sent as `Authorization: Bearer`), or None to send none.

    Attributes (for `/health`): `calls` (HTTP attempts per API, `search` / `reader`), `retries`,
    `failures` (calls given up, per API).
    """

    def __init__(self, options: WebOptions, search_key: str, reader_key: str | None = None):
        from aiolimiter import AsyncLimiter

        self.options = options
        self._search_headers = {"X-API-KEY": search_key, "Content-Type": "application/json"}
        self._reader_headers = {"Accept": "application/json", **({"Authorization": f"Bearer {reader_key}"} if reader_key else {})}
        self._limiter = AsyncLimiter(options.upstream_burst, options.upstream_burst / options.upstream_rate)
        self._semaphore = asyncio.Semaphore(options.upstream_concurrency)
        self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=options.upstream_concurrency))
        self.calls: Counter = Counter()
        self.failures: Counter = Counter()
        self.retries = 0

    async def aclose(self) -> None:
        await self._client.aclose()

    async def search(self, query: str, num: int, deadline: float) -> list[dict]:
        """Serper's organic results for `query` (at most `num`), before `deadline` (`time.monotonic()`).

        Raises:
            UpstreamError: see the module docstring.
        """
        payload = await self._call("search", "POST", self.options.search_url, deadline,
                                   headers=self._search_headers,
                                   content=json.dumps({"q": query, "num": num}).encode())  # ASCII: lone surrogates escaped
        return parse_search_results(payload)

    async def read(self, url: str, deadline: float) -> dict:
        """The page at `url` as Jina's reader gives it: `{"title", "url", "content"}`.

        Raises:
            UpstreamError: see the module docstring.
        """
        payload = await self._call("reader", "GET", self.options.reader_url + url, deadline, headers=self._reader_headers)
        return parse_page(payload, url)

    async def _call(self, api: str, method: str, url: str, deadline: float, **kwargs) -> bytes:
        """The body of a 200 answer, after retries; `UpstreamError` otherwise."""
        name = SEARCH_API if api == "search" else READER_API
        options, attempts, last, retry_after = self.options, 0, "was not called before the deadline", None
        rate_limited = False
        for attempt in range(options.upstream_retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._limiter.acquire(), remaining)
            except asyncio.TimeoutError:
                self.failures[api] += 1
                raise UpstreamError(429, f"this server's own rate limit for {name} (--upstream-rate "
                                         f"{options.upstream_rate:g}/s) left no slot before the deadline; retry later",
                                    retry_after=1.0) from None
            async with self._semaphore:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                attempts += 1
                self.calls[api] += 1
                try:
                    response = await self._client.request(method, url, timeout=min(options.upstream_timeout, remaining),
                                                          **kwargs)
                except httpx.TimeoutException:
                    last, rate_limited, retry_after = "did not answer in time", False, None
                except httpx.TransportError as exc:
                    last, rate_limited, retry_after = f"could not be reached ({type(exc).__name__})", False, None
                else:
                    if response.status_code == 200:
                        return response.content
                    if response.status_code in (401, 403):
                        self.failures[api] += 1
                        env = options.search_key_env if api == "search" else options.reader_key_env
                        raise UpstreamError(424, f"{name} refused the key (HTTP {response.status_code}): check ${env}")
                    if response.status_code != 429 and response.status_code < 500:
                        self.failures[api] += 1
                        raise UpstreamError(424, f"{name} answered HTTP {response.status_code}: "
                                                 f"{_snippet(response.content)!r}")
                    rate_limited = response.status_code == 429
                    last, retry_after = f"answered HTTP {response.status_code}", _retry_after(response)
            if attempt == options.upstream_retries:
                break
            pause = retry_after if retry_after is not None else random.uniform(0, options.upstream_backoff * 2**attempt)
            if time.monotonic() + pause >= deadline:
                break
            self.retries += 1
            await asyncio.sleep(pause)
        self.failures[api] += 1
        budget = f"{attempts} attempt{'s' if attempts != 1 else ''} within the {options.request_deadline:g} s deadline"
        logger.warning("%s %s (%s)", name, last, budget)
        if rate_limited:
            return_after = retry_after if retry_after is not None else options.upstream_backoff * 2**attempts
            raise UpstreamError(429, f"{name} is rate limiting (HTTP 429, {budget}); retry later", retry_after=return_after)
        raise UpstreamError(424, f"{name} {last} ({budget})")
