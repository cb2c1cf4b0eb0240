"""`WebBackend`: web search results and web pages in the retrieval service's shapes, cache first.

* `search(queries, topk, deadline)`: one list of hits per query, each hit a
  `retrieval.base.Hit(Passage(id=<link>, contents='"<title>"\\n<snippet>'), score=1/<position>)`, so
  `/retrieve` answers `{"document": {"id", "contents"}, "score"}` as for a local index (Serper gives
  no relevance score: the score is the reciprocal of Google's rank). A blank query gets no hits and
  no upstream call.
* `read(urls, deadline)`: one `PageDocument` dict per URL (`contents` = `"<title>"` line + the
  reader's text).

Each query or URL is answered from the cache when it can be; otherwise one upstream call is made and
its answer stored, and concurrent requests for the same key (GRPO's rollouts of one question often
search the very same words at once) wait for that one call instead of making their own. A search
asks the API for `max(topk, 10)` results (a call costs the same up to 10), and a cached answer
serves any smaller `topk` (or any `topk` when the API had no more results).
"""

from __future__ import annotations

import asyncio

from verl_search.retrieval.base import Hit, Passage
from verl_search.server.web.cache import WebCache, page_key, search_key
from verl_search.server.web.upstream import Upstream, UpstreamError

#: results asked of the search API at least (Serper's default page; the price is per call)
MIN_RESULTS = 10


class WebBackend:
    """Cache, single flight and the upstream APIs, for `server.web.service`.

    Args:
        upstream: the API client.
        cache: the on-disk cache.

    Attributes (for `/health`): `coalesced`: lookups that waited for another request's upstream call.
    """

    kind = "web"

    def __init__(self, upstream: Upstream, cache: WebCache):
        self.upstream, self.cache = upstream, cache
        self.coalesced = 0
        self._in_flight: dict[str, asyncio.Future] = {}

    async def _cached(self, key: str, usable, fetch):
        """The cached value at `key` if `usable(value)`, else `await fetch()` (stored, shared with
        concurrent callers of the same key). Raises what `fetch` raised; if the caller that was
        fetching is cancelled (its client left), a waiter looks again and fetches itself."""
        while True:
            value = self.cache.get(key)
            if value is not None and usable(value):
                self.cache.count(hit=True)
                return value
            self.cache.count(hit=False)
            shared = self._in_flight.get(key)
            if shared is None:
                break
            self.coalesced += 1
            value, error = await asyncio.shield(shared)
            if error is not None:
                raise error
            if value is not None:
                return value
        shared = self._in_flight[key] = asyncio.get_running_loop().create_future()
        value, error = None, None
        try:
            value = await fetch()
            self.cache.set(key, value)
        except Exception as exc:  # waiters raise it too
            error = exc
        finally:  # a cancelled fetch leaves (None, None): the waiters look again
            del self._in_flight[key]
            shared.set_result((value, error))
        if error is not None:
            raise error
        return value

    async def _search_one(self, query: str, topk: int, deadline: float) -> list[Hit]:
        if not query.strip():
            return []
        num = max(topk, MIN_RESULTS)

        async def fetch():
            return {"num": num, "results": await self.upstream.search(query, num, deadline)}

        entry = await self._cached(search_key(query), lambda e: len(e["results"]) >= topk or len(e["results"]) < e["num"],
                                   fetch)
        return [Hit(Passage(id=r["link"], contents=f'"{r["title"]}"\n{r["snippet"]}'), 1.0 / max(1, r["position"]))
                for r in entry["results"][:topk]]

    async def search(self, queries: list[str], topk: int, deadline: float) -> list[list[Hit]]:
        """`len(queries)` lists of at most `topk` hits, best first (see the module docstring).

        Args:
            deadline: `time.monotonic()` by which upstream calls stop retrying.

        Raises:
            UpstreamError: when any query could not be answered: the message names each failed query
                by position (the others were cached and cost nothing on a retry); 429 if any failure
                was a rate limit, else 424.
        """
        found = await asyncio.gather(*(self._search_one(q, topk, deadline) for q in queries), return_exceptions=True)
        failed = [(i, r) for i, r in enumerate(found) if isinstance(r, BaseException)]
        if failed:
            raise _combine("queries", failed)
        return found

    async def read(self, urls: list[str], deadline: float) -> list[dict]:
        """One `PageDocument` dict per URL.

        Raises:
            UpstreamError: as `search`, naming each failed URL by position.
        """

        async def one(url: str) -> dict:
            page = await self._cached(page_key(url), lambda _: True, lambda: self.upstream.read(url, deadline))
            title = page["title"] or url
            return {"id": url, "title": title, "contents": f'"{title}"\n{page["content"]}', "url": page["url"],
                    "passage_ids": [url]}

        found = await asyncio.gather(*(one(url) for url in urls), return_exceptions=True)
        failed = [(i, r) for i, r in enumerate(found) if isinstance(r, BaseException)]
        if failed:
            raise _combine("urls", failed)
        return found

    def stats(self) -> dict:
        """The cache's counters and the upstream's: `upstream_calls` (per API), `upstream_retries`,
        `upstream_failures` (per API), `coalesced`."""
        return {**self.cache.stats(), "upstream_calls": dict(self.upstream.calls), "upstream_retries": self.upstream.retries,
                "upstream_failures": dict(self.upstream.failures), "coalesced": self.coalesced}


def _combine(field: str, failed: list[tuple[int, BaseException]]) -> UpstreamError:
    """One `UpstreamError` for the failed positions of a request (an unexpected exception is re-raised)."""
    for _, error in failed:
        if not isinstance(error, UpstreamError):
            raise error
    status = 429 if any(error.status == 429 for _, error in failed) else 424
    retry_after = max((error.retry_after or 0.0 for _, error in failed), default=0.0) or None
    message = "; ".join(f"{field}[{i}]: {error.message}" for i, error in failed[:5])
    if len(failed) > 5:
        message += f"; and {len(failed) - 5} more"
    return UpstreamError(status, message, retry_after)
