"""The retrieval contract: a passage, a scored hit, and the batch-first `Retriever` protocol.

Every retriever answers a *batch* of queries at once (`search(queries, topk)`), because the
server coalesces concurrent requests into one batch (one encoder pass, one faiss search).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

#: one query's result before the passages are looked up: `(corpus row, score)` pairs, best first
ScoredRows = list[tuple[int, float]]


def split_contents(contents: str) -> tuple[str, str]:
    """Split a Search-R1 / FlashRAG `contents` string into `(title, text)`.

    The corpus format (wiki-18, `search_r1/search/retrieval_server.py`) puts the title, in double
    quotes, on the first line and the passage text after the first newline::

        >>> split_contents('"Paris"\\nParis is the capital of France.')
        ('Paris', 'Paris is the capital of France.')
        >>> split_contents('no title line')
        ('', 'no title line')

    A `contents` without a newline has no title: the whole string is the text.
    """
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    return title.strip().strip('"'), text


@dataclass(frozen=True)
class Passage:
    """One corpus passage: `id` (string, as in the corpus file) and `contents` (title line + text)."""

    id: str
    contents: str

    @property
    def title(self) -> str:
        """The passage title without its quotes (`""` when `contents` has no title line)."""
        return split_contents(self.contents)[0]

    @property
    def text(self) -> str:
        """The passage text after the title line."""
        return split_contents(self.contents)[1]


@dataclass(frozen=True)
class Hit:
    """A retrieved passage and its score (BM25 score, or inner product for dense retrievers)."""

    passage: Passage
    score: float


class RetrieverUnavailableError(RuntimeError):
    """A part of the retriever cannot answer now (a shard replica lost with its node, a shard that timed
    out): the whole search fails and may be retried; a search never answers from the shards that are
    left. The retrieval server answers it with 503 and `Retry-After`."""


@runtime_checkable
class Retriever(Protocol):
    """What the server and the evaluation code need from a retriever.

    Attributes:
        kind: `"bm25"`, `"dense"` or `"hybrid"` (`retrieval.hybrid`); `"+rerank"` is appended when a
            cross-encoder reorders the hits (`retrieval.rerank`).
        num_passages: number of passages in the corpus (an upper bound for `topk`).
    """

    kind: str
    num_passages: int

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Return, for each of `len(queries)` queries, at most `topk` hits, best first.

        A query that is blank (empty or whitespace only) gets an empty list, so do queries with no
        term in the BM25 vocabulary. `topk` above `num_passages` returns `num_passages` hits.

        Raises:
            ValueError: if `topk < 1`.
        """
        ...


def hits_of_rows(corpus, scored_rows: Iterable[tuple[int, float]]) -> list[Hit]:
    """The `Hit`s of `(row, score)` pairs, in their order; `corpus.get(row)` looks each passage up
    (a `retrieval.corpus.JsonlCorpus`)."""
    return [Hit(passage=corpus.get(int(row)), score=float(score)) for row, score in scored_rows]
