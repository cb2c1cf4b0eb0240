"""The rerank stage: a cross-encoder reorders each query's first candidates.

A cross-encoder reads the query and a passage together and scores the pair; it is slower than
BM25 or a bi-encoder (one forward pass per pair, not per query) and better at ordering a short
list. Search-R1's `retrieval_rerank_server.py` (and FlashRAG) retrieve 10 passages with e5 and
keep the cross-encoder's best 3 (`cross-encoder/ms-marco-MiniLM-L12-v2`). Here any retriever (BM25,
dense, hybrid) can be wrapped: `RerankingRetriever.search` retrieves `max(candidates, topk)`
passages per query for the whole batch the server's micro-batcher hands it, scores every
(query, passage) pair of the batch with sentence-transformers' `CrossEncoder.predict` in
sub-batches of `batch_size` pairs (pairs of several requests share a forward pass), and returns each
query's `topk` best by that score.

A passage is shown to the cross-encoder as `(Title: T) text`, the form Search-R1's rerank server
gives it (`(Title: T)` left out when the passage has no title line).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from verl_search.retrieval.base import Hit, Passage, Retriever

logger = logging.getLogger(__name__)


@dataclass
class RerankOptions:
    """The rerank stage of `serve` (off unless `reranker` is set).

    Attributes:
        reranker: a sentence-transformers `CrossEncoder` folder (e.g. a local copy of
            `cross-encoder/ms-marco-MiniLM-L12-v2`); `None` (default): no reranking.
        rerank_candidates: passages retrieved per query and scored by the cross-encoder (default 10,
            Search-R1's); a request's `topk` above it retrieves `topk`. >= 1.
        rerank_batch_size: (query, passage) pairs per cross-encoder forward pass (default 32). >= 1.
        rerank_max_length: cross-encoder input limit in tokens (default: the model's own).

    Raises:
        ValueError: a value below 1, naming the flag.
    """

    reranker: str | None = field(default=None, metadata={
        "help": "a sentence-transformers CrossEncoder folder: rerank each query's candidates with it"})
    rerank_candidates: int = field(default=10, metadata={
        "help": "with --reranker: passages retrieved per query and scored (at least topk)"})
    rerank_batch_size: int = field(default=32, metadata={
        "help": "with --reranker: (query, passage) pairs per cross-encoder forward pass"})
    rerank_max_length: int | None = field(default=None, metadata={
        "help": "with --reranker: cross-encoder input limit in tokens (default: the model's)"})

    def __post_init__(self):
        for name in ("rerank_candidates", "rerank_batch_size", "rerank_max_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def pair_text(passage: Passage) -> str:
    """The passage as the cross-encoder reads it: `(Title: T) text`, or the text alone without a title.

    >>> pair_text(Passage("1", '"Paris"\\nParis is the capital of France.'))
    '(Title: Paris) Paris is the capital of France.'
    """
    title, text = passage.title, passage.text
    return f"(Title: {title}) {text}" if title else text


def check_reranker_folder(path: str | os.PathLike) -> Path:
    """`path` as a `Path` if it holds a model (`config.json`).

    Raises:
        FileNotFoundError: it does not, naming the flag and the fix.
    """
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"--reranker {folder} is not a model folder (no config.json); pass a local "
                                "sentence-transformers CrossEncoder folder")
    return folder


class CrossEncoderReranker:
    """A sentence-transformers `CrossEncoder` loaded from a local folder, scoring (query, passage) pairs.

    Args:
        path: the CrossEncoder folder (nothing is fetched from a hub).
        batch_size: pairs per forward pass (default 32).
        max_length: input limit in tokens (default: the model's own).
        device: `"cpu"`, `"cuda"`, ...; default: a GPU when torch sees one.

    Raises:
        FileNotFoundError: `path` is not a folder with a `config.json`.
        ImportError: sentence-transformers is missing (the `[dense]` extra).
    """

    def __init__(self, path: str | os.PathLike, batch_size: int = 32, max_length: int | None = None,
                 device: str | None = None):
        folder = check_reranker_folder(path)
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            from verl_search.runtime.extras import install_line

            raise ImportError(f"reranking needs sentence-transformers: {install_line('dense')}") from exc
        from verl_search.retrieval.encoder import default_device

        self.path = str(folder)
        self.batch_size = batch_size
        self.model = CrossEncoder(self.path, device=device or default_device(), local_files_only=True,
                                  max_length=max_length)

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Scores of `(query, passage text)` pairs, float32 of shape `(len(pairs),)`, higher is better:
        `CrossEncoder.predict` with the model's own activation (the logit for ms-marco models)."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        scores = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)
        return np.asarray(scores, dtype=np.float32).reshape(len(pairs))


class RerankingRetriever:
    """A retriever whose hits a cross-encoder reorders (see the module docstring).

    Args:
        retriever: the first stage (any `Retriever`).
        reranker: scores the pairs (`CrossEncoderReranker`, or anything with its `score`).
        candidates: passages per query from the first stage (at least the request's `topk`); >= 1.

    `kind` is the first stage's plus `"+rerank"`; hit scores are the cross-encoder's. Equal scores
    keep the first stage's order.

    Raises:
        ValueError: `candidates < 1`.
    """

    def __init__(self, retriever: Retriever, reranker: CrossEncoderReranker, candidates: int = 10):
        if candidates < 1:
            raise ValueError(f"rerank candidates must be >= 1, got {candidates}")
        self.retriever, self.reranker, self.candidates = retriever, reranker, candidates
        self.kind = f"{retriever.kind}+rerank"
        self.num_passages = retriever.num_passages

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top-`topk` passages per query in the cross-encoder's order, with its scores (see `Retriever.search`).

        Raises:
            ValueError: if `topk < 1`.
        """
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        first = self.retriever.search(queries, max(self.candidates, topk))
        pairs = [(query, pair_text(hit.passage)) for query, hits in zip(queries, first) for hit in hits]
        scores = self.reranker.score(pairs).tolist()
        results, start = [], 0
        for hits in first:
            own = scores[start : start + len(hits)]
            start += len(hits)
            order = sorted(range(len(hits)), key=lambda i: -own[i])[:topk]
            results.append([Hit(passage=hits[i].passage, score=float(own[i])) for i in order])
        return results
