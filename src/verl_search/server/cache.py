"""An exact-match query cache for `/retrieve`, bounded in megabytes, least recently used out first.

GRPO samples n rollouts per question, and those rollouts often send the very same search: a hit
here never reaches the batch worker. The key is `(normalised query, topk, index fingerprint)`:

* the query is normalised only in ways that cannot change any retriever's answer: Unicode NFC,
  whitespace runs collapsed to one space, stripped (casing is kept: a cased encoder would embed
  `Paris` and `paris` differently);
* `topk` is part of the key (a top-3 answer is not a top-5 answer);
* the index fingerprint (`IndexSpec.fingerprint`: corpus SHA-256, encoder and its backend, faiss
  factory, BM25 parameters) keeps answers of one index from ever being served for another.

Off by default (`--cache-mb 0`). Sizes are estimates of the Python objects held (the strings of
the key and of each hit plus a fixed overhead per hit), not exact `sys.getsizeof` sums.
Thread safe (one lock); the server uses it from its event loop only.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

#: bytes counted per cached entry and per hit on top of their strings (dict slot, tuples, Hit, Passage)
ENTRY_OVERHEAD = 200
HIT_OVERHEAD = 150

_SPACES = re.compile(r"\s+")


def normalise_query(query: str) -> str:
    """The cache form of a query: NFC, whitespace runs as one space, stripped; case kept.

    >>> normalise_query("  who  wrote\\tHamlet ")
    'who wrote Hamlet'
    """
    return _SPACES.sub(" ", unicodedata.normalize("NFC", query)).strip()


def entry_bytes(key: tuple, hits: Sequence[Any]) -> int:
    """Estimated bytes held by one entry: its query string, each hit's id and contents, overheads.

    `hits` are `verl_search.retrieval.base.Hit`s (duck-typed: `.passage.id`, `.passage.contents`).
    """
    return (ENTRY_OVERHEAD + len(key[0]) + len(key[2])
            + sum(HIT_OVERHEAD + len(h.passage.id) + len(h.passage.contents) for h in hits))


class QueryCache:
    """LRU map from `(normalised query, topk, fingerprint, fill)` to a query's hits.

    Args:
        max_mb: bound in MiB (2**20 bytes) of estimated size; `<= 0` disables the cache (every
            lookup misses, nothing is stored, nothing is counted).
        fingerprint: the index fingerprint, part of every key.

    Attributes (for `/health`):
        hits, misses: lookups answered / not answered from the cache; `entries`; `bytes`:
        estimated size now; `evictions`: entries dropped to stay under `max_mb`.
    """

    def __init__(self, max_mb: float, fingerprint: str = ""):
        self.max_bytes = int(max_mb * 2**20)
        self.fingerprint = fingerprint
        self.hits = self.misses = self.evictions = self.bytes = 0
        self._entries: OrderedDict[tuple, tuple[list, int]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    def key(self, query: str, topk: int, fill: bool = False) -> tuple[str, int, str, bool]:
        """The cache key of `query` asked with `topk`; `fill`: asked through ReSearch's routes
        (`retrieval.fill.search_filled`, `topk` passages for every query), another answer."""
        return normalise_query(query), topk, self.fingerprint, fill

    def lookup(self, queries: Sequence[str], topk: int, fill: bool = False) -> list[list | None]:
        """Per query, its cached hits (most recently used now), or None on a miss (counted)."""
        if not self.enabled:
            return [None] * len(queries)
        found: list[list | None] = []
        with self._lock:
            for query in queries:
                key = self.key(query, topk, fill)
                entry = self._entries.get(key)
                if entry is None:
                    self.misses += 1
                    found.append(None)
                else:
                    self.hits += 1
                    self._entries.move_to_end(key)
                    found.append(entry[0])
        return found

    def store(self, queries: Sequence[str], topk: int, hits: Sequence[list], fill: bool = False) -> None:
        """Remember `hits[i]` for `queries[i]` asked with `topk`; evict least recently used entries
        until the estimated size is at most `max_mb` (an entry larger than the bound is not kept)."""
        if not self.enabled:
            return
        with self._lock:
            for query, row in zip(queries, hits):
                key = self.key(query, topk, fill)
                size = entry_bytes(key, row)
                if size > self.max_bytes:
                    continue
                old = self._entries.pop(key, None)
                if old is not None:
                    self.bytes -= old[1]
                self._entries[key] = (list(row), size)
                self.bytes += size
                while self.bytes > self.max_bytes:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self.bytes -= dropped
                    self.evictions += 1

    def stats(self) -> dict:
        """`cache_hits`, `cache_misses`, `cache_entries`, `cache_mb` (estimated), `cache_evictions`."""
        return {"cache_hits": self.hits, "cache_misses": self.misses, "cache_entries": self.entries,
                "cache_mb": round(self.bytes / 2**20, 3), "cache_evictions": self.evictions}
