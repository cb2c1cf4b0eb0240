"""Search as ReSearch's retriever answers it: exactly `topk` passages for every query, blank ones included.

ReSearch (Agent-RL/ReSearch, branch `re-search`, commit 4bdb872) serves its vendored FlashRAG retriever with
its own `scripts/serving/retriever_serving.py`; its `/batch_search` hands the whole batch to
`retriever.batch_search(query, top_n)` (`src/flashrag/retriever/retriever.py`), which never drops a query:

* BM25 (`BM25Retriever._batch_search`, bm25s backend): `searcher.retrieve(query_tokens, k=num)` returns `k`
  passages per query, matching ones first, then passages of score 0; an empty query scores 0 everywhere and
  still gets `k` passages (bm25s' `_get_top_k_results`: "The query is empty. This will result in a zero score
  for all documents.").
* Dense (`DenseRetriever._batch_search`): every query, the empty string included, is encoded and searched,
  `index.search(emb, k=num)`.

`/retrieve` keeps Search-R1's behaviour (`Retriever.search`): its pyserini BM25 returns only passages holding a
query word, and a blank query gets no passages. `server.flashrag` (ReSearch's `/batch_search` and `/search`) calls
`search_filled` instead.
"""

from __future__ import annotations

import logging

from verl_search.retrieval.base import Hit, Retriever, hits_of_rows

logger = logging.getLogger(__name__)


def search_filled(retriever: Retriever, queries: list[str], topk: int) -> list[list[Hit]]:
    """`min(topk, retriever.num_passages)` hits for each of `queries`, as ReSearch's retriever returns them.

    A retriever with its own `search_filled(queries, topk)` (`retrieval.bm25.BM25Retriever`: bm25s' `k` rows,
    zero scores included) answers itself. Otherwise `retriever.search` answers, and a blank query is then
    encoded and searched like any other when the retriever is a plain dense one (`kind == "dense"` with an
    `encoder` and a faiss `index`: `retrieval.dense.DenseRetriever`); on other retrievers (hybrid, reranked,
    sharded) a blank query keeps its empty list.

    Args:
        retriever: a loaded `Retriever`.
        queries: the batch (any strings, blank ones included).
        topk: passages per query, >= 1.

    Returns:
        `len(queries)` lists of hits, best first.

    Raises:
        ValueError: if `topk < 1`.
    """
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    own = getattr(retriever, "search_filled", None)
    if callable(own):
        return own(queries, topk)
    hits = retriever.search(queries, topk)
    blank = [i for i, query in enumerate(queries) if not query.strip()]
    encoder, index = getattr(retriever, "encoder", None), getattr(retriever, "index", None)
    if blank and retriever.kind == "dense" and encoder is not None and index is not None:
        from verl_search.retrieval.dense import search_faiss  # lazy: faiss is the [dense] extra

        scores, rows = search_faiss(index, encoder.encode_queries([queries[i] for i in blank]), topk)
        for position, query_index in enumerate(blank):
            pairs = zip(rows[position].tolist(), scores[position].tolist())
            hits[query_index] = hits_of_rows(retriever.corpus, [(row, score) for row, score in pairs if row >= 0])
    return hits
