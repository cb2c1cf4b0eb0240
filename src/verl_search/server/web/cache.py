"""The web backend's persistent cache: search results by normalised query, pages by URL, on disk.

`diskcache.Cache` (SQLite plus files, safe across threads and processes) with `diskcache.JSONDisk`,
so entries are stored as JSON, never pickles. It outlives the server: a restarted server, another
replica on the same machine, or the next training run answers a query already paid for without
calling the API. Bounded by `--web-cache-mb` (least recently stored out first) and
`--web-cache-days` (an entry older than that is fetched again).

A search key is the query normalised as the query cache does (`server.cache.normalise_query`: NFC,
whitespace collapsed, stripped), then case-folded: web search engines ignore case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_search.server.cache import normalise_query


def search_key(query: str) -> str:
    """The cache key of a web search.

    >>> search_key("  Who wrote\\tHAMLET ")
    'search:who wrote hamlet'
    """
    return "search:" + normalise_query(query).casefold()


def page_key(url: str) -> str:
    """The cache key of a page read."""
    return "page:" + url.strip()


class WebCache:
    """Get and set JSON values by key, counting hits and misses.

    Args:
        directory: the cache folder (created if missing).
        size_mb: bound in MiB.
        days: seconds an entry is served = `days * 86400`; 0: until evicted.

    Raises:
        OSError: the folder cannot be created or written (before the server binds its port).
    """

    def __init__(self, directory: str | Path, size_mb: float, days: float):
        import diskcache

        self.directory = Path(directory)
        self._cache = diskcache.Cache(str(self.directory), size_limit=int(size_mb * 2**20), disk=diskcache.JSONDisk,
                                      eviction_policy="least-recently-stored")
        self.expire = days * 86400 if days > 0 else None
        self.hits = self.misses = 0

    def get(self, key: str) -> Any | None:
        """The value stored at `key`, or None (not counted: callers count with `count`)."""
        return self._cache.get(key)

    def count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1

    def set(self, key: str, value: Any) -> None:
        self._cache.set(key, value, expire=self.expire)

    def stats(self) -> dict:
        """`cache_hits`, `cache_misses`, `cache_entries`, `cache_mb` (on disk), the `/health` fields."""
        return {"cache_hits": self.hits, "cache_misses": self.misses, "cache_entries": len(self._cache),
                "cache_mb": round(self._cache.volume() / 2**20, 3)}

    def close(self) -> None:
        self._cache.close()
