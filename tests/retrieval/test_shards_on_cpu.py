"""Sharded dense indexes (`index build --shards N`): the merged top-k equals the unsharded index's."""

import itertools
import json

import pytest

from tests.conftest import MINI_CORPUS, MINI_QA
from verl_search import cli
from verl_search.retrieval.dense import DenseRetriever
from verl_search.retrieval.index_builder import BuildOptions, build_index
from verl_search.retrieval.loader import resolve_index
from verl_search.retrieval.manifest import IndexMismatchError, Manifest
from verl_search.retrieval.shards import ShardedDenseRetriever, shard_bounds


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """The first 40 passages of the mini corpus (encoded in seconds)."""
    path = tmp_path_factory.mktemp("small") / "corpus.jsonl"
    with open(MINI_CORPUS, encoding="utf-8") as source:
        path.write_text("".join(itertools.islice(source, 40)), encoding="utf-8")
    return path


def test_shards_built_from_the_corpus_merge_to_the_unsharded_hits(small_corpus, minilm_path, tmp_path):
    import faiss

    build_index(small_corpus, tmp_path / "three", BuildOptions(retriever="dense", encoder=minilm_path, shards=3,
                                                                chunk_size=16))
    manifest = Manifest.read(tmp_path / "three")
    assert [(s.first_row, s.rows) for s in manifest.shards] == [(0, 14), (14, 13), (27, 13)]
    spec = resolve_index(tmp_path / "three")
    three = spec.load()
    assert isinstance(three, ShardedDenseRetriever) and three.num_passages == 40
    # the same vectors in one flat index, in row order
    whole = faiss.IndexFlatIP(manifest.encoder.dim)
    for shard in range(3):
        part = spec.load_shard(shard).index
        whole.add(part.reconstruct_n(0, part.ntotal))
    one = DenseRetriever(whole, three.encoder, three.corpus)
    questions = [json.loads(line)["question"] for line in itertools.islice(open(MINI_QA, encoding="utf-8"), 10)]
    for topk in (1, 5, 100):  # 100 > 40 passages: every row, in the same order
        expected = [[(h.passage.id, h.score) for h in q] for q in one.search(questions + [""], topk)]
        assert [[(h.passage.id, h.score) for h in q] for q in three.search(questions + [""], topk)] == expected


def test_shard_bounds_are_even_and_bad_counts_are_refused():
    assert shard_bounds(7, 7) == [(i, 1) for i in range(7)]
    with pytest.raises(ValueError, match="between 1 and the number of passages"):
        shard_bounds(3, 4)


@pytest.mark.parametrize("flags", [["--shards", "2"], ["--from-faiss", "x.index"]])
def test_bm25_with_shard_flags_exits_2(flags, tmp_path, caplog):
    argv = ["index", "build", "--corpus", str(MINI_CORPUS), "--out", str(tmp_path / "x"), *flags]
    assert cli.main(argv) == 2
    assert "dense indexes only" in caplog.text and not (tmp_path / "x").exists()


def test_a_sharded_index_served_with_another_backend_is_checked_against_shard_0(small_corpus, minilm_path, tmp_path):
    build_index(small_corpus, tmp_path / "two", BuildOptions(retriever="dense", encoder=minilm_path, shards=2))
    manifest_path = tmp_path / "two" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["encoder"]["backend"] = "onnx"  # as if built with ONNX Runtime; served below with torch
    manifest_path.write_text(json.dumps(manifest))
    assert isinstance(resolve_index(tmp_path / "two", encoder_backend="torch").load(), ShardedDenseRetriever)
    manifest["encoder"]["max_length"] = 4  # an encoder that embeds the passages unlike the stored vectors
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IndexMismatchError, match="embeds passages unlike the index"):
        resolve_index(tmp_path / "two", encoder_backend="torch").load()
