"""Hybrid retrieval: BM25 and dense search of one corpus, fused into one ranking per query.

BM25 finds passages that share the query's rare words; a dense encoder finds paraphrases. On the
mini corpus they miss different questions (docs/retrieval-service.md, "Hybrid retrieval"), and
fusing the two rankings keeps most of what either finds. A hybrid index folder
(`verl-search index build --retriever hybrid`) holds both indexes over one corpus under one
manifest; `serve` then answers each batch with one BM25 search and one dense search (one encoder
pass for the whole batch, as for a dense index), each asked for `max(fusion_candidates, topk)`
candidates, and fuses them by corpus row before any passage is read.

Two fusions:

* `reciprocal_rank_fusion` (default): a passage scores `sum 1 / (k + rank)` over the rankings
  that hold it (Cormack, Clarke & Buettcher, "Reciprocal Rank Fusion outperforms Condorcet and
  individual rank learning methods", SIGIR 2009; `k = 60` there). Only ranks count, so BM25's
  unbounded scores and the encoder's cosines need no calibration.
* `weighted_score_fusion`: each ranking's scores are min-max normalised to [0, 1] per query and
  summed with weights (`dense_weight` for the dense one, `1 - dense_weight` for BM25).

RRF with k = 60 is the default because it needs no score calibration. It is not the best choice for
every corpus: on the mini corpus, where BM25 is far ahead of MiniLM on two of three sources, none of
220 fusion settings (RRF k, weighted RRF, min-max or z-score CombSUM / CombMNZ, 5 to 100
candidates) reaches BM25 on every source (`benchmarks/bench_hybrid_fusion_grid.py`,
docs/benchmarks/hybrid.md).

No kept library does this for a server's hot path: `ranx` (fusion and evaluation of runs) pulls
numba, pandas, seaborn, fastparquet and ir-datasets into the retrieval service's install and
builds per-query dictionaries of strings; the two functions here are a few lines each and pinned
by property tests (`tests/retrieval/test_hybrid_on_cpu.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from verl_search.retrieval.base import Hit, ScoredRows, hits_of_rows

logger = logging.getLogger(__name__)

Fusion = Literal["rrf", "weighted"]


def _in_interleaved_order(rankings: Sequence[Sequence[int]]) -> list[int]:
    """Every row of `rankings` once, in round-robin order: rank 1 of each ranking, then rank 2, ...
    (the tie-break of both fusions: of two equal scores, the row some ranking put higher comes first,
    and at equal ranks the earlier ranking's)."""
    seen: dict[int, None] = {}
    for position in range(max((len(r) for r in rankings), default=0)):
        for ranking in rankings:
            if position < len(ranking):
                seen.setdefault(ranking[position], None)
    return list(seen)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], k: float = 60.0) -> ScoredRows:
    """Fuse rankings of corpus rows by reciprocal rank (Cormack et al. 2009).

    A row scores `sum over the rankings that hold it of 1 / (k + rank)`, ranks counted from 1; a
    row missing from a ranking gets nothing from it. A row listed twice in one ranking counts at its
    first (best) place.

    Args:
        rankings: one list of rows per retriever, best first.
        k: the damping constant (>= 0; default 60, the paper's): a larger `k` flattens the
            difference between the first ranks.

    Returns:
        every row of `rankings` once, as `(row, fused score)` pairs, best first; equal scores in
        round-robin order (rank 1 of each ranking in turn, then rank 2, ...).

    Raises:
        ValueError: if `k < 0`.

    >>> reciprocal_rank_fusion([[7, 3, 5], [3, 9]], k=60)  # doctest: +ELLIPSIS
    [(3, 0.0325...), (7, 0.0163...), (9, 0.0161...), (5, 0.0158...)]
    """
    if k < 0:
        raise ValueError(f"the RRF constant k must be >= 0, got {k}")
    scores: dict[int, float] = {}
    for ranking in rankings:
        first_rank: dict[int, int] = {}
        for rank, row in enumerate(ranking, start=1):
            first_rank.setdefault(row, rank)
        for row, rank in first_rank.items():
            scores[row] = scores.get(row, 0.0) + 1.0 / (k + rank)
    order = _in_interleaved_order(rankings)
    return sorted(((row, scores[row]) for row in order), key=lambda pair: -pair[1])


def weighted_score_fusion(results: Sequence[ScoredRows], weights: Sequence[float]) -> ScoredRows:
    """Fuse scored results by a weighted sum of min-max normalised scores.

    Each result's scores are mapped to [0, 1] (`(s - min) / (max - min)` over that query's list; a
    list whose scores are all equal maps them to 1); a row missing from a list gets 0 from it; the
    fused score is `sum weights[i] * normalised_i`.

    Args:
        results: one `(row, score)` list per retriever, best first (`search_rows` output).
        weights: one weight (>= 0) per list.

    Returns:
        every row of `results` once, `(row, fused score)` best first; ties in round-robin order as
        in `reciprocal_rank_fusion`.

    Raises:
        ValueError: if `weights` has another length than `results` or a negative weight.

    >>> weighted_score_fusion([[(1, 12.0), (2, 6.0), (3, 2.0)], [(2, 0.9), (4, 0.5)]], [0.5, 0.5])
    [(2, 0.7), (1, 0.5), (4, 0.0), (3, 0.0)]
    """
    if len(weights) != len(results) or any(w < 0 for w in weights):
        raise ValueError(f"need one weight >= 0 per result list ({len(results)}), got {list(weights)}")
    fused: dict[int, float] = {}
    for result, weight in zip(results, weights):
        if not result:
            continue
        scores = [score for _, score in result]
        low, high = min(scores), max(scores)
        seen: set[int] = set()
        for row, score in result:
            if row in seen:
                continue
            seen.add(row)
            normalised = 1.0 if high == low else (score - low) / (high - low)
            fused[row] = fused.get(row, 0.0) + weight * normalised
    order = _in_interleaved_order([[row for row, _ in result] for result in results])
    return sorted(((row, fused.get(row, 0.0)) for row in order), key=lambda pair: -pair[1])


@dataclass
class HybridOptions:
    """How `serve` fuses a hybrid index (flags of `serve`; ignored for a BM25 or dense index).

    Attributes:
        fusion: `"rrf"` (reciprocal rank fusion, default) or `"weighted"` (min-max normalised scores).
        rrf_k: RRF's constant `k` (default 60, Cormack et al. 2009); >= 0.
        dense_weight: weighted fusion: the dense score's weight, in [0, 1]; BM25's is `1 - dense_weight`
            (default 0.5).
        fusion_candidates: each retriever returns `max(fusion_candidates, topk)` candidates per query
            before fusion (default 50); >= 1.

    Raises:
        ValueError: on a value outside the ranges above, naming the flag.
    """

    fusion: Fusion = field(default="rrf", metadata={
        "help": "hybrid index: rrf (reciprocal rank fusion) or weighted (min-max normalised scores)"})
    rrf_k: float = field(default=60.0, metadata={"help": "hybrid index: the RRF constant k (Cormack et al. 2009)"})
    dense_weight: float = field(default=0.5, metadata={
        "help": "hybrid index, weighted fusion: weight of the dense score (BM25 gets 1 - this)"})
    fusion_candidates: int = field(default=50, metadata={
        "help": "hybrid index: candidates each retriever returns per query before fusion (at least topk)"})

    def __post_init__(self):
        if self.fusion not in ("rrf", "weighted"):
            raise ValueError(f"--fusion must be 'rrf' or 'weighted', got {self.fusion!r}")
        if self.rrf_k < 0:
            raise ValueError(f"--rrf-k must be >= 0, got {self.rrf_k}")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"--dense-weight must be between 0 and 1, got {self.dense_weight}")
        if self.fusion_candidates < 1:
            raise ValueError(f"--fusion-candidates must be >= 1, got {self.fusion_candidates}")


class RowRetriever(Protocol):
    """A retriever that can answer in corpus rows (`BM25Retriever`, `DenseRetriever`,
    `ShardedDenseRetriever`): `search_rows(queries, topk) -> list[ScoredRows]`, plus `corpus`."""

    corpus: object
    num_passages: int

    def search_rows(self, queries: list[str], topk: int) -> list[ScoredRows]: ...


class HybridRetriever:
    """BM25 + dense search over one corpus, fused per query (see the module docstring).

    Args:
        sparse: the BM25 retriever; dense: the dense retriever (one faiss index or shards); both over
            the same corpus (the passages are read from `dense.corpus`).
        options: fusion settings (default `HybridOptions()`: RRF, k 60, 50 candidates).

    Scores in the answer are the fused ones (RRF: at most `2 / (k + 1)`, about 0.033 at k 60;
    weighted: in [0, 1]). A blank query gets no hits; a query with no word in the BM25 vocabulary
    gets the dense ranking alone.

    Raises:
        ValueError: the two retrievers hold different numbers of passages.
    """

    kind = "hybrid"

    def __init__(self, sparse: RowRetriever, dense: RowRetriever, options: HybridOptions | None = None):
        if sparse.num_passages != dense.num_passages:
            raise ValueError(f"the BM25 index holds {sparse.num_passages} passages and the dense index "
                             f"{dense.num_passages}: a hybrid index needs both over one corpus; rebuild it")
        self.sparse, self.dense = sparse, dense
        self.options = options or HybridOptions()
        self.corpus = dense.corpus
        self.num_passages = dense.num_passages

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top-`topk` fused passages for each query (see `Retriever.search`); fused scores, best first."""
        return [hits_of_rows(self.corpus, rows) for rows in self.search_rows(queries, topk)]

    def search_rows(self, queries: list[str], topk: int) -> list[ScoredRows]:
        """`search` before the passages are read: `(row, fused score)` pairs. Raises ValueError if `topk < 1`."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        depth = max(self.options.fusion_candidates, topk)
        sparse = self.sparse.search_rows(queries, depth)
        dense = self.dense.search_rows(queries, depth)
        fused = []
        for bm25_rows, dense_rows in zip(sparse, dense):
            if self.options.fusion == "rrf":
                rows = reciprocal_rank_fusion([[r for r, _ in bm25_rows], [r for r, _ in dense_rows]], self.options.rrf_k)
            else:
                weight = self.options.dense_weight
                rows = weighted_score_fusion([bm25_rows, dense_rows], [1.0 - weight, weight])
            fused.append(rows[:topk])
        return fused
