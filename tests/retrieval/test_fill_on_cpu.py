"""`retrieval.fill.search_filled` against the reference it names: ReSearch's retriever (branch `re-search`,
`src/flashrag/retriever/retriever.py`) answers every query with bm25s' `retrieve(k=...)`, `k` passages whatever
matches, and encodes an empty query like any other (dense); `Retriever.search` keeps Search-R1's (pyserini:
only the passages holding a query word, none for a blank query)."""

import numpy as np
import pytest

from verl_search.retrieval.fill import search_filled


def bm25s_reference(retriever, queries, k):
    """What bm25s itself returns for `queries` on the same index: tokenised as the index was (bm25s' `tokenize`,
    English stop words, Snowball stemmer), words outside the vocabulary dropped as bm25s' `get_tokens_ids`
    drops them, then `retrieve(k=k)`: `(rows, scores)`, each of shape `(len(queries), k)`."""
    import bm25s

    tokens = bm25s.tokenize(queries, stopwords="en", stemmer=retriever._stemmer, return_ids=False,
                            show_progress=False)
    tokens = [[t for t in terms if t in retriever._model.vocab_dict] for terms in tokens]
    return retriever._model.retrieve(tokens, k=k, show_progress=False)


def test_bm25_returns_k_passages_in_bm25s_order_when_few_words_match(bm25_retriever):
    # "zebra" is in one mini-wiki passage: Search-R1's /retrieve gets 1 hit, ReSearch's retriever 10
    queries = ["zebra", "Lilu mythology", "qwxzzy unknownword"]
    filled = search_filled(bm25_retriever, queries, 10)
    rows, scores = bm25s_reference(bm25_retriever, queries, 10)
    assert [len(row) for row in filled] == [10, 10, 10]
    for position, hits in enumerate(filled):
        assert [int(h.passage.id) for h in hits] == rows[position].tolist()  # mini-wiki ids are corpus rows
        assert [h.score for h in hits] == pytest.approx(scores[position].tolist())
    assert filled[0][0].score > 0 and all(h.score == 0.0 for h in filled[0][1:])
    assert all(h.score == 0.0 for h in filled[2])  # no word in the vocabulary: score 0 everywhere
    plain = bm25_retriever.search(queries, 10)
    assert [len(row) for row in plain] == [1, 10, 0]  # Search-R1's (pyserini) behaviour kept on /retrieve
    assert [h.passage.id for h in plain[0]] == [filled[0][0].passage.id]


def test_bm25_empty_query_gets_k_zero_score_passages_as_bm25s_returns_them(bm25_retriever):
    filled = search_filled(bm25_retriever, ["", "   ", "zebra"], 5)
    rows, scores = bm25s_reference(bm25_retriever, ["", "   "], 5)
    for position in (0, 1):
        assert [int(h.passage.id) for h in filled[position]] == rows[position].tolist()
        assert np.all(scores[position] == 0) and all(h.score == 0.0 for h in filled[position])
    assert len(filled[2]) == 5
    assert bm25_retriever.search([""], 5) == [[]]  # /retrieve: a blank query gets no hits


def test_topk_is_capped_by_the_corpus_and_checked(bm25_retriever):
    assert len(search_filled(bm25_retriever, ["zebra"], bm25_retriever.num_passages + 5)[0]) == bm25_retriever.num_passages
    with pytest.raises(ValueError, match="topk must be >= 1, got 0"):
        search_filled(bm25_retriever, ["zebra"], 0)


def test_dense_empty_query_is_encoded_and_searched(dense_retriever):
    # ReSearch's DenseRetriever._batch_search encodes every query, the empty string included
    from verl_search.retrieval.dense import search_faiss

    filled = search_filled(dense_retriever, ["", "Lilu mythology"], 4)
    scores, rows = search_faiss(dense_retriever.index, dense_retriever.encoder.encode_queries([""]), 4)
    assert [h.passage.id for h in filled[0]] == [dense_retriever.corpus.get(int(r)).id for r in rows[0]]
    assert [h.score for h in filled[0]] == pytest.approx(scores[0].tolist(), abs=1e-5)
    assert filled[1] == dense_retriever.search(["Lilu mythology"], 4)[0]
    assert dense_retriever.search([""], 4) == [[]]
