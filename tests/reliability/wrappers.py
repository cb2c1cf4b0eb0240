"""Test-only retriever wrappers (real retriever inside): one that records each batch, one that is slow."""

from __future__ import annotations

import threading
import time


class RecordingRetriever:
    """Delegates to `inner`; records `(queries, topk)` of every `search` call; sleeps `delay` s first.

    Satisfies `verl_search.retrieval.base.Retriever` (kind, num_passages, search)."""

    def __init__(self, inner, delay: float = 0.0):
        self.inner, self.delay = inner, delay
        self.kind, self.num_passages = inner.kind, inner.num_passages
        self.calls: list[tuple[list[str], int]] = []
        self.lock = threading.Lock()

    def search(self, queries, topk):
        with self.lock:
            self.calls.append((list(queries), topk))
        if self.delay:
            time.sleep(self.delay)
        return self.inner.search(queries, topk)

    def searched(self) -> list[str]:
        with self.lock:
            return [q for queries, _ in self.calls for q in queries]
