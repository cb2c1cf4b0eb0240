"""BM25 retrieval on `bm25s` (pure Python + numpy/scipy sparse; no pyserini, no Java).

Tokenisation follows bm25s' defaults for English: lower-casing, the regex `\\w\\w+` splitter,
English stop words and the Snowball English stemmer (`PyStemmer`). The same settings are stored
in the manifest and used for the corpus and for queries. Scores are Lucene-variant BM25
(`k1=0.9, b=0.4`, the values Search-R1 / pyserini use by default).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from verl_search.retrieval.base import Hit, ScoredRows, hits_of_rows
from verl_search.retrieval.corpus import JsonlCorpus

logger = logging.getLogger(__name__)

DEFAULT_BM25_PARAMS = {"method": "lucene", "k1": 0.9, "b": 0.4, "stopwords": "en", "stemmer": "english"}


def _require_bm25s():
    try:
        import bm25s
    except ImportError as exc:  # pragma: no cover - bm25s is a base dependency
        raise ImportError("BM25 retrieval needs bm25s: pip install bm25s PyStemmer") from exc
    return bm25s


def make_stemmer(language: str | None):
    """A PyStemmer stemmer for `language` (`None` or `""` for no stemming).

    Raises:
        ImportError: if PyStemmer is missing, with the install command.
    """
    if not language:
        return None
    try:
        import Stemmer
    except ImportError as exc:
        raise ImportError("BM25 stemming needs PyStemmer: pip install PyStemmer") from exc
    return Stemmer.Stemmer(language)


def build_bm25(texts: Iterable[str], out_dir: str | os.PathLike, params: dict | None = None) -> dict:
    """Index `texts` (passage `contents`, in corpus row order) with bm25s and save to `out_dir`.

    Memory: bm25s holds the tokenised corpus while indexing (about 1 GB per million passages).

    Returns:
        the parameters used (stored in the manifest).
    """
    bm25s = _require_bm25s()
    params = {**DEFAULT_BM25_PARAMS, **(params or {})}
    tokens = bm25s.tokenize(
        list(texts), stopwords=params["stopwords"], stemmer=make_stemmer(params["stemmer"]), show_progress=True
    )
    model = bm25s.BM25(method=params["method"], k1=params["k1"], b=params["b"])
    model.index(tokens, show_progress=True)
    model.save(str(out_dir), show_progress=False)
    return params


class BM25Retriever:
    """Batch BM25 search over a bm25s index folder and a `JsonlCorpus`.

    Args:
        index_dir: the folder `bm25s.BM25.save` wrote; loaded memory-mapped (`mmap=True`), so
            the score matrix stays on disk until pages are touched.
        corpus: passage lookup by row.
        params: tokenisation parameters from the manifest (`DEFAULT_BM25_PARAMS` if omitted).
        n_threads: bm25s scoring threads (0: the calling thread only).

    Raises:
        ValueError: if the index and the corpus differ in number of passages.
    """

    kind = "bm25"

    def __init__(self, index_dir: str | os.PathLike, corpus: JsonlCorpus, params: dict | None = None, n_threads: int = 0):
        bm25s = _require_bm25s()
        self.params = {**DEFAULT_BM25_PARAMS, **(params or {})}
        self._model = bm25s.BM25.load(str(Path(index_dir)), mmap=True, show_progress=False)
        self._vocab = self._model.vocab_dict
        self._stemmer = make_stemmer(self.params["stemmer"])
        self.corpus = corpus
        self.num_passages = int(self._model.scores["num_docs"])
        self.n_threads = n_threads
        if self.num_passages != len(corpus):
            raise ValueError(
                f"BM25 index {index_dir} has {self.num_passages} passages but corpus {corpus.path} has "
                f"{len(corpus)}; rebuild the index over this corpus"
            )

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top-`topk` passages for each query (see `Retriever.search`); BM25 scores, best first."""
        return [hits_of_rows(self.corpus, rows) for rows in self.search_rows(queries, topk)]

    def search_filled(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Exactly `min(topk, num_passages)` passages for every query, as bm25s' `retrieve(k=topk)` returns
        them: ReSearch's retriever (`src/flashrag/retriever/retriever.py`, `BM25Retriever._batch_search`,
        branch `re-search`), which its `/batch_search` serves. Passages the query matches come first, then
        passages of score 0 in bm25s' own order; a blank query, or one with no word in the vocabulary, gets
        `topk` passages of score 0 (bm25s scores an empty query 0 everywhere).

        `search` keeps Search-R1's behaviour instead (its pyserini BM25 returns only matching passages).

        Raises:
            ValueError: if `topk < 1`.
        """
        return [hits_of_rows(self.corpus, rows) for rows in self._retrieve(queries, topk, fill=True)]

    def search_rows(self, queries: list[str], topk: int) -> list[ScoredRows]:
        """Like `search`, but corpus rows and BM25 scores, with no passage looked up (hybrid fusion
        reads the passages of the fused top-k only).

        Returns:
            `len(queries)` lists of at most `topk` `(row, score)` pairs, best first, scores > 0: fewer
            than `topk` when fewer passages hold a query word (as pyserini, Search-R1's BM25).

        Raises:
            ValueError: if `topk < 1`.
        """
        return self._retrieve(queries, topk, fill=False)

    def _retrieve(self, queries: list[str], topk: int, fill: bool) -> list[ScoredRows]:
        """bm25s' top-`topk` rows per query; `fill`: all of them (zero scores included), else the
        rows with score > 0 only (a query with no known word is not searched)."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        bm25s = _require_bm25s()
        k = min(topk, self.num_passages)
        results: list[ScoredRows] = [[] for _ in queries]
        tokens = bm25s.tokenize(
            queries, stopwords=self.params["stopwords"], stemmer=self._stemmer, return_ids=False, show_progress=False
        )
        # Only known words count (bm25s drops the others); with no known word every passage scores 0.
        tokens = [[t for t in terms if t in self._vocab] for terms in tokens]
        searched = [i for i, terms in enumerate(tokens) if fill or terms]
        if not searched:
            return results
        rows, scores = self._model.retrieve(
            [tokens[i] for i in searched], k=k, show_progress=False, n_threads=self.n_threads
        )
        for position, query_index in enumerate(searched):
            pairs = zip(rows[position].tolist(), scores[position].tolist())
            results[query_index] = [(int(row), float(score)) for row, score in pairs if fill or score > 0.0]
        return results
