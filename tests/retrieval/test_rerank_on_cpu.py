"""The rerank stage with a real sentence-transformers CrossEncoder.

No cross-encoder weights can be downloaded here, so the tests use a tiny randomly initialised one
(conftest's `tiny_cross_encoder`: BERT, 2 layers, hidden 32, the real MiniLM tokenizer); its scores
mean nothing, which is what makes them a check: they reorder BM25's candidates, and the order must be exactly the one
sentence-transformers' own `CrossEncoder.predict` gives.
"""

import pytest

from verl_search.retrieval.rerank import CrossEncoderReranker, RerankingRetriever, RerankOptions, pair_text

QUERIES = ["Lilu mythology masculine Akkadian spirit", "Who directed Inception?", "capital of France", ""]


class CountingReranker(CrossEncoderReranker):
    """The real reranker, counting the pairs of each `score` call (to see requests share one)."""

    calls: list

    def score(self, pairs):
        self.calls.append(len(pairs))
        return super().score(pairs)


def test_reranked_order_and_scores_are_the_cross_encoders(bm25_retriever, tiny_cross_encoder):
    from sentence_transformers import CrossEncoder

    reranked = RerankingRetriever(bm25_retriever, CrossEncoderReranker(tiny_cross_encoder, batch_size=4), candidates=10)
    direct = CrossEncoder(str(tiny_cross_encoder), device="cpu", local_files_only=True)
    first_stage = bm25_retriever.search(QUERIES, 10)
    results = reranked.search(QUERIES, 3)
    assert reranked.kind == "bm25+rerank" and results[3] == []  # a blank query: no candidates, no hits
    changed = 0
    for query, candidates, hits in zip(QUERIES[:3], first_stage, results):
        scores = direct.predict([(query, pair_text(hit.passage)) for hit in candidates], show_progress_bar=False)
        assert len(set(scores.round(4).tolist())) == len(candidates)  # distinct scores: the order is well defined
        expected = sorted(range(len(candidates)), key=lambda i: -scores[i])[:3]
        assert [h.passage.id for h in hits] == [candidates[i].passage.id for i in expected]
        assert [h.score for h in hits] == pytest.approx([float(scores[i]) for i in expected], abs=1e-4)
        changed += [h.passage.id for h in hits] != [h.passage.id for h in candidates[:3]]
    assert changed  # the random cross-encoder does reorder BM25's top 3


def test_one_cross_encoder_call_per_batch_and_topk_above_the_candidates(bm25_retriever, tiny_cross_encoder):
    reranker = CountingReranker(tiny_cross_encoder)
    reranker.calls = []
    reranked = RerankingRetriever(bm25_retriever, reranker, candidates=2)
    results = reranked.search(QUERIES[:3], 5)  # topk 5 > 2 candidates: 5 are retrieved and scored
    assert [len(hits) for hits in results] == [5, 5, 5]
    assert reranker.calls == [15]  # every pair of the batch in one predict call (sub-batches of batch_size inside)


def test_rerank_options_and_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="--rerank-candidates"):
        RerankOptions(rerank_candidates=0)
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        CrossEncoderReranker(tmp_path)
