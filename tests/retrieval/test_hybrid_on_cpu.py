"""Hybrid retrieval: the fusion functions (hypothesis properties), a real hybrid index folder built by
`build_index`, and BM25 + MiniLM indexes of the mini corpus's dense test subset (conftest's `dense_corpus`) fused."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_search.retrieval.hybrid import HybridOptions, HybridRetriever, reciprocal_rank_fusion, weighted_score_fusion
from verl_search.retrieval.index_builder import BuildOptions, build_index
from verl_search.retrieval.loader import resolve_index
from verl_search.retrieval.manifest import IndexMismatchError, Manifest

rankings = st.lists(st.lists(st.integers(0, 30), max_size=12, unique=True), min_size=1, max_size=4)


def _rank(ranking, row):
    return ranking.index(row) + 1 if row in ranking else None


@given(rankings, st.floats(0, 200))
def test_rrf_scores_every_row_once_by_the_formula_best_first(lists, k):
    fused = reciprocal_rank_fusion(lists, k)
    rows = [row for row, _ in fused]
    assert sorted(rows) == sorted({row for ranking in lists for row in ranking})  # nothing dropped, nothing twice
    for row, score in fused:
        expected = sum(1.0 / (k + _rank(r, row)) for r in lists if row in r)
        assert score == pytest.approx(expected)
    assert all(a[1] >= b[1] for a, b in zip(fused, fused[1:]))


@given(rankings, st.floats(0, 200))
def test_rrf_puts_a_row_that_is_better_placed_in_every_ranking_first(lists, k):
    """Pareto: a row at least as high in every ranking (absent = below all) and higher in one comes first."""
    position = {row: i for i, (row, _) in enumerate(reciprocal_rank_fusion(lists, k))}
    big = 10**6
    for a in position:
        for b in position:
            ranks = [(_rank(r, a) or big, _rank(r, b) or big) for r in lists]
            if all(x <= y for x, y in ranks) and any(x < y for x, y in ranks):
                assert position[a] < position[b]


@given(st.lists(st.integers(0, 30), max_size=12, unique=True), st.floats(0, 200))
def test_rrf_of_one_ranking_keeps_its_order(ranking, k):
    assert [row for row, _ in reciprocal_rank_fusion([ranking], k)] == ranking


@given(rankings)
def test_rrf_does_not_depend_on_the_order_of_the_rankings_except_for_ties(lists):
    forward = dict(reciprocal_rank_fusion(lists, 60))
    backward = dict(reciprocal_rank_fusion(lists[::-1], 60))
    assert forward.keys() == backward.keys()
    assert all(forward[row] == pytest.approx(backward[row]) for row in forward)


scored = st.lists(st.tuples(st.integers(0, 30), st.floats(-50, 50)), max_size=10, unique_by=lambda pair: pair[0]).map(
    lambda pairs: sorted(pairs, key=lambda pair: -pair[1]))


@given(st.lists(scored, min_size=1, max_size=3), st.data())
def test_weighted_fusion_is_the_weighted_sum_of_min_max_normalised_scores(results, data):
    weights = data.draw(st.lists(st.floats(0, 1), min_size=len(results), max_size=len(results)))
    fused = weighted_score_fusion(results, weights)
    assert sorted(row for row, _ in fused) == sorted({row for result in results for row, _ in result})
    for row, score in fused:
        expected = 0.0
        for result, weight in zip(results, weights):
            values = dict(result)
            if row in values:
                low, high = min(values.values()), max(values.values())
                expected += weight * (1.0 if high == low else (values[row] - low) / (high - low))
        assert score == pytest.approx(expected, abs=1e-9)
    assert all(a[1] >= b[1] for a, b in zip(fused, fused[1:]))
    assert 0.0 <= min((s for _, s in fused), default=0.0) and max((s for _, s in fused), default=0.0) <= sum(weights) + 1e-9


def test_fusion_refuses_bad_arguments():
    with pytest.raises(ValueError, match="k must be >= 0"):
        reciprocal_rank_fusion([[1]], k=-1)
    with pytest.raises(ValueError, match="one weight"):
        weighted_score_fusion([[(1, 1.0)], [(2, 1.0)]], [1.0])
    for bad, flag in [({"rrf_k": -1}, "--rrf-k"), ({"dense_weight": 1.5}, "--dense-weight"),
                      ({"fusion_candidates": 0}, "--fusion-candidates"), ({"fusion": "max"}, "--fusion")]:
        with pytest.raises(ValueError, match=flag):
            HybridOptions(**bad)


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory, minilm_path):
    """A hybrid index folder over 6 passages, built by `build_index` with the real MiniLM encoder."""
    folder = tmp_path_factory.mktemp("tiny_hybrid")
    corpus = folder / "corpus.jsonl"
    texts = {"Paris": "Paris is the capital and largest city of France.",
             "Zorblax": "Zorblax is a fictional glimmerwort grown on the moons of Quaal.",
             "Dog": "The dog is a domesticated descendant of the wolf.",
             "Piano": "The piano is a keyboard instrument played with hammers striking strings.",
             "Volcano": "A volcano is a rupture in the crust where lava and ash escape.",
             "Bread": "Bread is a staple food baked from a dough of flour and water."}
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                              for i, (t, x) in enumerate(texts.items())))
    build_index(corpus, folder / "index", BuildOptions(retriever="hybrid", encoder=minilm_path))
    return folder / "index"


def test_a_hybrid_index_holds_both_halves_under_one_manifest(tiny_hybrid, minilm_path):
    manifest = Manifest.read(tiny_hybrid)
    assert manifest.retriever == "hybrid" and manifest.corpus.num_passages == 6
    assert manifest.bm25["stemmer"] == "english" and manifest.encoder.dim == 384
    assert (tiny_hybrid / "bm25").is_dir() and (tiny_hybrid / "faiss.index").is_file()
    retriever = resolve_index(tiny_hybrid).load()
    assert isinstance(retriever, HybridRetriever) and retriever.kind == "hybrid"


def test_hybrid_finds_what_either_half_finds(tiny_hybrid):
    retriever = resolve_index(tiny_hybrid).load()
    exact_word, paraphrase, blank = retriever.search(["glimmerwort", "a big town in europe", "  "], 2)
    assert exact_word[0].passage.title == "Zorblax"  # only BM25 knows the made-up word well
    assert paraphrase[0].passage.title == "Paris"  # BM25 shares no word with it: the dense half answers
    assert blank == []
    assert exact_word[0].score == pytest.approx(2 / 61)  # first in both rankings: 1/(60+1) twice


def test_serving_one_half_of_a_hybrid_index(tiny_hybrid, bm25_index):
    spec = resolve_index(tiny_hybrid)
    spec.select("bm25")
    bm25 = spec.load()
    assert bm25.kind == "bm25" and bm25.search(["a big town in europe"], 2) == [[]]  # no shared word
    spec = resolve_index(tiny_hybrid)
    spec.select("dense")
    assert spec.load().kind == "dense"
    with pytest.raises(IndexMismatchError, match="is a bm25 index"):
        resolve_index(bm25_index).select("hybrid")


def test_weighted_fusion_and_a_small_candidate_list(tiny_hybrid):
    spec = resolve_index(tiny_hybrid)
    spec.hybrid = HybridOptions(fusion="weighted", dense_weight=1.0, fusion_candidates=1)
    [hits] = spec.load().search(["a big town in europe"], 3)
    assert [h.passage.title for h in hits][0] == "Paris" and len(hits) == 3  # candidates widen to topk
    assert hits[0].score == pytest.approx(1.0)


def test_hybrid_over_the_mini_corpus_is_rrf_of_its_halves(dense_corpus, dense_retriever, tmp_path):
    build_index(dense_corpus, tmp_path / "bm25", BuildOptions(retriever="bm25"))  # BM25 over the dense index's corpus
    bm25_retriever = resolve_index(tmp_path / "bm25").load()
    hybrid = HybridRetriever(bm25_retriever, dense_retriever, HybridOptions(fusion_candidates=20))
    queries = ["Lilu mythology masculine Akkadian spirit", "Who directed Inception?", "zzqxjv"]
    sparse, dense = bm25_retriever.search_rows(queries, 20), dense_retriever.search_rows(queries, 20)
    for query, hits, bm25_rows, dense_rows in zip(queries, hybrid.search(queries, 5), sparse, dense):
        expected = reciprocal_rank_fusion([[r for r, _ in bm25_rows], [r for r, _ in dense_rows]], 60)[:5]
        assert [(h.passage.id, h.score) for h in hits] == [(bm25_retriever.corpus.get(r).id, s) for r, s in expected]
    assert bm25_retriever.search(["zzqxjv"], 3) == [[]] and hybrid.search(["zzqxjv"], 3)[0]  # dense half answers


@pytest.mark.parametrize("flags, message", [
    (["--retriever", "hybrid"], "is a bm25 index; build a hybrid index"),
    (["--fusion", "weighted"], "apply to a hybrid index"),
    (["--rerank-candidates", "5"], "need --reranker DIR"),
    (["--reranker", "/nonexistent"], "is not a model folder"),
])
def test_serve_refuses_flags_its_index_cannot_use(bm25_index, flags, message, caplog):
    from verl_search import cli

    assert cli.main(["serve", "--index", str(bm25_index), *flags]) == 2  # before the port is bound
    assert message in caplog.text
