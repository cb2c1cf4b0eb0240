"""Async client of the `/retrieve` and `/access` service, shared by `SearchTool`, `AccessTool` and the
Search-R1 agent loop.

One place for connection pooling, concurrency limits, retries, deadlines and failure handling:

* one `aiohttp.ClientSession` per event loop and service URL (connections are pooled and reused
  by every trajectory of a rollout worker), created on first use, never at import. aiohttp, not
  httpx: with 256 concurrent calls on 2 cores httpx spent 6.5 ms of CPU per call in its
  pure-Python HTTP stack, aiohttp (C parser) 0.3 ms; the tool runs inside every rollout step.
  aiohttp is installed with verl (its reward loop and Ray use it);
* a semaphore per event loop and URL caps in-flight requests (`max_concurrency`);
* retries with exponential backoff and full jitter on connection errors, timeouts and HTTP 5xx,
  never on 4xx (a bad request stays bad), and never past `deadline` seconds for the whole call
  (the old verl tool retried up to 10 times linearly with blocking `requests`: about 345 s);
* `search` and `access` never raise for a network or server failure: it returns a `SearchOutcome` with `error`
  set, which callers turn into an observation (`search failed: ...`) and a metric.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import aiohttp

from verl_search.agent_protocol.vocabulary import (
    ACCESS_ERRORS,
    DEFAULT_TOPK,
    FAILED_ACCESSES,
    FAILED_SEARCHES,
    NUM_ACCESSES,
    NUM_SEARCHES,
    SEARCH_ERRORS,
)
from verl_search.runtime.env import DEFAULT_URL
from verl_search.server.schemas import AccessRequest, RetrieveRequest, parse_access_response, parse_retrieve_response

logger = logging.getLogger(__name__)


@dataclass
class SearchClientConfig:
    """How to reach the retrieval service.

    Attributes:
        retrieval_service_url: full URL of the endpoint, e.g. `http://127.0.0.1:8000/retrieve`.
        topk: passages per query (default 3).
        timeout: seconds per HTTP attempt (default 5).
        max_retries: retries after the first attempt, on connection errors / timeouts / 5xx (default 3).
        deadline: seconds for the whole call, retries and backoff included (default 20).
        max_concurrency: requests in flight per event loop and URL (default 64).
        backoff: first backoff in seconds, doubled each retry, full jitter (default 0.2).
        max_backoff: cap of one backoff, in seconds (default 2).
        access_service_url: the `/access` endpoint (the `access` tool); default: the retrieval URL
            with its last path segment `retrieve` replaced by `access`.
    """

    retrieval_service_url: str = DEFAULT_URL
    topk: int = DEFAULT_TOPK
    timeout: float = 5.0
    max_retries: int = 3
    deadline: float = 20.0
    max_concurrency: int = 64
    backoff: float = 0.2
    max_backoff: float = 2.0
    access_service_url: str | None = None

    def __post_init__(self):
        checks = {
            "topk": self.topk >= 1,
            "timeout": self.timeout > 0,
            "max_retries": self.max_retries >= 0,
            "deadline": self.deadline > 0,
            "max_concurrency": self.max_concurrency >= 1,
            "backoff": self.backoff >= 0,
            "max_backoff": self.max_backoff >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"search client config: {name}={getattr(self, name)!r} is out of range")
        if not self.retrieval_service_url.startswith(("http://", "https://")):
            raise ValueError(
                f"retrieval_service_url={self.retrieval_service_url!r} must be an http(s) URL such as "
                "http://127.0.0.1:8000/retrieve"
            )

    @property
    def access_url(self) -> str:
        """The `/access` endpoint: `access_service_url`, or the retrieval URL ending in `/access`."""
        if self.access_service_url:
            return self.access_service_url
        base, _, last = self.retrieval_service_url.rstrip("/").rpartition("/")
        return f"{base}/access" if last == "retrieve" else f"{self.retrieval_service_url.rstrip('/')}/access"

    @classmethod
    def from_dict(cls, config: dict) -> "SearchClientConfig":
        """Pick this class's keys out of a larger config dict (other keys are the caller's)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})


@dataclass
class SearchOutcome:
    """What one `search` call gave.

    Attributes:
        hits: per query, the documents as `{"id", "contents"}` dicts (empty on failure).
        pages: `access` only: per value, its page (`server.schemas.PageDocument` dicts).
        error: `None` on success, else a short reason (`"HTTP 422: ..."`, `"timeout after 3 attempts"`).
        attempts: HTTP attempts made.
        latency: seconds the call took, retries included.
        server_time: seconds the server reports for the last attempt (`Server-Timing`), if any.
    """

    hits: list[list[dict]] = field(default_factory=list)
    pages: list[dict] = field(default_factory=list)
    error: str | None = None
    attempts: int = 0
    latency: float = 0.0
    server_time: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class _LoopResources:
    """The session and semaphore of one event loop and URL.

    The session is closed when its loop shuts down: `_lifetime` is an async generator, and
    `asyncio.run` (and any loop run with `run_until_complete`) closes live async generators in
    `loop.shutdown_asyncgens()`, which runs its `finally`.
    """

    def __init__(self, max_concurrency: int):
        self.client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max_concurrency))
        self.semaphore = asyncio.Semaphore(max_concurrency)
        self.lifetime = self._lifetime()

    async def _lifetime(self):
        try:
            yield
        finally:
            await self.client.close()


# Per event loop, per (url, max_concurrency). Weak keys: a closed and collected loop frees its clients.
_RESOURCES: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()


async def _resources(config: SearchClientConfig) -> _LoopResources:
    loop = asyncio.get_running_loop()
    per_loop = _RESOURCES.setdefault(loop, {})
    key = (config.retrieval_service_url, config.max_concurrency)
    if key not in per_loop:
        resources = per_loop[key] = _LoopResources(config.max_concurrency)
        await resources.lifetime.__anext__()  # registers the generator with the loop
    return per_loop[key]


class _Retryable(Exception):
    pass


async def search(queries: list[str], config: SearchClientConfig, topk: int | None = None) -> SearchOutcome:
    """POST `queries` to the retrieval service; never raises on network or server failure.

    Args:
        queries: query strings (one request; the server's per-request limit applies).
        config: where and how to call.
        topk: passages per query (default `config.topk`).

    Returns:
        a `SearchOutcome`; `outcome.hits[i]` are the documents of `queries[i]`.
    """
    started = time.monotonic()
    try:
        body = RetrieveRequest(queries=queries, topk=topk or config.topk, return_scores=False).model_dump()
    except ValueError as exc:
        return SearchOutcome(error=f"invalid query: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}")
    return await _post("search", config.retrieval_service_url, body, config, started,
                       lambda payload: {"hits": parse_retrieve_response(payload, len(queries))})


async def access(field: str, values: list[str], config: SearchClientConfig) -> SearchOutcome:
    """POST `{field: values}` to the service's `/access` (`config.access_url`); never raises on
    network or server failure, with the same retries and deadline as `search`.

    Args:
        field: `ids`, `titles` or `urls` (see `server.schemas.AccessRequest`).
        values: what to read (one request).
        config: where and how to call.

    Returns:
        a `SearchOutcome`; `outcome.pages[i]` is the page of `values[i]` (`PageDocument` dicts).
    """
    started = time.monotonic()
    try:
        body = AccessRequest(**{field: values}).model_dump(exclude_none=True)
    except ValueError as exc:
        return SearchOutcome(error=f"invalid request: {exc}")
    return await _post("access", config.access_url, body, config, started,
                       lambda payload: {"pages": parse_access_response(payload, len(values))})


async def _post(what: str, url: str, body: dict, config: SearchClientConfig, started: float,
                parse: Callable[[bytes], dict]) -> SearchOutcome:
    """POST `body` to `url` with `config`'s retries, backoff and deadline (counted from `started`,
    a `time.monotonic()`); `parse(payload)` gives the outcome's fields of a 200 answer. A failure
    that exhausted the retries is logged as `{what} failed: ...`."""
    deadline = started + config.deadline
    resources = await _resources(config)
    attempts, last_error = 0, "not attempted"
    async with resources.semaphore:
        for attempt in range(config.max_retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            try:
                timeout = aiohttp.ClientTimeout(total=min(config.timeout, remaining))
                async with resources.client.post(url, json=body, timeout=timeout) as response:
                    payload = await response.read()
                if response.status >= 500:
                    raise _Retryable(f"HTTP {response.status}: {payload[:200].decode(errors='replace')}")
                if response.status != 200:
                    return SearchOutcome(error=f"HTTP {response.status}: {_detail(payload)}", attempts=attempts,
                                         latency=time.monotonic() - started)
                return SearchOutcome(**parse(payload), attempts=attempts, latency=time.monotonic() - started,
                                     server_time=_server_time(response.headers))
            except (aiohttp.ClientError, asyncio.TimeoutError, _Retryable) as exc:
                last_error = _describe(exc)
            except ValueError as exc:  # unparseable body from something that is not our server
                return SearchOutcome(error=f"bad response: {exc}", attempts=attempts, latency=time.monotonic() - started)
            if attempt < config.max_retries:
                pause = random.uniform(0, min(config.max_backoff, config.backoff * 2**attempt))
                if time.monotonic() + pause >= deadline:
                    break
                await asyncio.sleep(pause)
    error = f"{last_error} ({attempts} attempt{'s' if attempts != 1 else ''}, deadline {config.deadline:g} s)"
    logger.warning("%s failed: %s", what, error)
    return SearchOutcome(error=error, attempts=attempts, latency=time.monotonic() - started)


def _server_time(headers) -> float | None:
    """Seconds from a `Server-Timing: retrieve;dur=<ms>` header, or None."""
    for part in headers.get("server-timing", "").split(";"):
        if part.strip().startswith("dur="):
            try:
                return float(part.strip()[4:]) / 1000.0
            except ValueError:
                return None
    return None


def _describe(exc: Exception) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "cannot connect to the retrieval service"
    return str(exc) or type(exc).__name__


def _detail(payload: bytes) -> str:
    try:
        detail = json.loads(payload).get("detail")
    except (ValueError, AttributeError):
        return payload[:200].decode(errors="replace")
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail)[:300]
    return str(detail)[:300]


def record_search(agent_data: Any, outcome: SearchOutcome) -> None:
    """Count a search in the trajectory's `extra_fields` (read by the reward and the metrics).

    Keys (`verl_search.agent_protocol.vocabulary`): `num_searches`, `failed_searches` (ints) and `search_errors`
    (list of reasons). Does nothing when `agent_data` has no `extra_fields`.
    """
    _record(agent_data, outcome, NUM_SEARCHES, FAILED_SEARCHES, SEARCH_ERRORS)


def record_access(agent_data: Any, outcome: SearchOutcome) -> None:
    """Count a page access like `record_search`, under `num_accesses`, `failed_accesses`, `access_errors`."""
    _record(agent_data, outcome, NUM_ACCESSES, FAILED_ACCESSES, ACCESS_ERRORS)


def _record(agent_data: Any, outcome: SearchOutcome, calls: str, failed: str, errors: str) -> None:
    extra = getattr(agent_data, "extra_fields", None)
    if extra is None:
        return
    extra[calls] = int(extra.get(calls, 0)) + 1
    extra[failed] = int(extra.get(failed, 0)) + int(not outcome.ok)
    if not outcome.ok:
        extra[errors] = [*extra.get(errors, []), outcome.error]
