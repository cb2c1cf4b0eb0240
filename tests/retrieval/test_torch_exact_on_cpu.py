"""Exact search in torch (`--search-backend torch`): faiss Flat's ids on the mini dense index, on the CPU.

The GPU half (fp16 vectors split across the visible GPUs) runs the same code with `device="cuda"`; it is measured by
`benchmarks/gpu_check.sh` on a machine with a GPU. Here the half-precision path runs on the CPU in bf16 and fp16.
"""

import itertools
import json
import shutil

import numpy as np
import pytest

from tests.conftest import MINI_QA
from verl_search.retrieval.dense import DenseRetriever
from verl_search.retrieval.loader import resolve_index
from verl_search.retrieval.manifest import IndexMismatchError
from verl_search.retrieval.torch_exact import TorchExactIndex, read_flat_vectors
from verl_search.server.serve import ServeOptions, resolve_served_index


def _same_up_to_ties(expected_rows, expected_scores, rows, tie=1e-5):
    """Row lists equal at every position whose faiss score is at least `tie` from its neighbours' scores."""
    for want, got, scores in zip(expected_rows, rows, expected_scores):
        gaps = np.abs(np.diff(scores))
        tied = np.concatenate([[False], gaps < tie]) | np.concatenate([gaps < tie, [False]])
        assert want[~tied].tolist() == got[~tied].tolist()


@pytest.fixture(scope="module")
def questions():
    return [json.loads(line)["question"] for line in itertools.islice(open(MINI_QA, encoding="utf-8"), 64)]


def test_torch_search_returns_faiss_flat_ids_on_the_mini_dense_index(dense_index, dense_retriever, questions):
    flat = dense_retriever.index  # the faiss IndexFlatIP the default backend serves
    vectors = dense_retriever.encoder.encode_queries(questions)
    exact = TorchExactIndex.from_faiss_file(dense_index / "faiss.index", device="cpu")
    assert (exact.ntotal, exact.d) == (flat.ntotal, flat.d)
    for topk in (1, 5, 50):
        want_scores, want_rows = flat.search(vectors, topk)
        scores, rows = exact.search(vectors, topk)
        assert scores.shape == rows.shape == (len(questions), topk) and rows.dtype == np.int64
        np.testing.assert_allclose(scores, want_scores, atol=1e-5)
        _same_up_to_ties(want_rows, want_scores, rows)
    # through the retriever: the same passages, a blank query answered with none
    torch_retriever = DenseRetriever(exact, dense_retriever.encoder, dense_retriever.corpus)
    want = [[hit.passage.id for hit in hits] for hits in dense_retriever.search(questions[:16] + [" "], 5)]
    assert [[hit.passage.id for hit in hits] for hits in torch_retriever.search(questions[:16] + [" "], 5)] == want


def test_chunks_blocks_and_half_precision_keep_the_ids(dense_index, dense_retriever, questions):
    import torch

    vectors = dense_retriever.encoder.encode_queries(questions)
    want_scores, want_rows = dense_retriever.index.search(vectors, 10)
    # 7-query chunks and 500-element score blocks: many blocks per chunk, merged
    scores, rows = TorchExactIndex.from_faiss(dense_retriever.index, device="cpu", block_elements=500,
                                              query_chunk=7).search(vectors, 10)
    _same_up_to_ties(want_rows, want_scores, rows)
    for dtype in (torch.bfloat16, torch.float16):  # candidates re-scored in fp32 from the rounded vectors
        half = TorchExactIndex.from_faiss_file(dense_index / "faiss.index", device="cpu", dtype=dtype,
                                               block_elements=4096)
        scores, rows = half.search(vectors, 10)
        assert (rows[:, :3] == want_rows[:, :3]).mean() > 0.97
        np.testing.assert_allclose(scores, want_scores, atol=5e-3)
        assert np.abs(half.reconstruct_n(0, 5) - dense_retriever.index.reconstruct_n(0, 5)).max() < 1e-2


def test_rows_split_across_devices_merge_to_the_same_ids(dense_retriever, questions, monkeypatch):
    from verl_search.retrieval import torch_exact

    # three "devices", all the CPU: the split and the merge that several GPUs run, without faking CUDA
    monkeypatch.setattr(torch_exact, "torch_devices", lambda device=None: ["cpu", "cpu", "cpu"])
    vectors = dense_retriever.encoder.encode_queries(questions[:16])
    split = TorchExactIndex.from_faiss(dense_retriever.index, block_elements=3000)
    assert [(first, len(part)) for first, part, _ in split.shards] == [(0, 714), (714, 713), (1427, 713)]
    want_scores, want_rows = dense_retriever.index.search(vectors, 20)
    scores, rows = split.search(vectors, 20)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    _same_up_to_ties(want_rows, want_scores, rows)
    assert np.array_equal(split.reconstruct_n(710, 10), dense_retriever.index.reconstruct_n(710, 10))


def test_l2_and_k_past_the_rows_answer_as_faiss():
    import faiss

    rng = np.random.default_rng(0)
    data = rng.normal(size=(300, 16)).astype(np.float32)
    queries = data[:40] + rng.normal(scale=0.1, size=(40, 16)).astype(np.float32)
    flat = faiss.IndexFlatL2(16)
    flat.add(data)
    exact = TorchExactIndex.from_faiss(flat, device="cpu", block_elements=1000)
    assert exact.metric == "l2"
    for topk in (4, 305):  # past 300 rows: row -1 and faiss's fill score
        want_scores, want_rows = flat.search(queries, topk)
        scores, rows = exact.search(queries, topk)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-3)
        _same_up_to_ties(want_rows, want_scores, rows)
    with pytest.raises(ValueError, match=r"shape \(n, 16\)"):
        exact.search(queries[:, :8], 3)


def test_a_file_that_is_no_flat_index_is_refused(tmp_path):
    import faiss

    hnsw = faiss.IndexHNSWFlat(8, 4)
    hnsw.add(np.ones((10, 8), dtype=np.float32))
    faiss.write_index(hnsw, str(tmp_path / "hnsw.index"))
    with pytest.raises(ValueError, match="not a Flat inner-product or L2 index.*--search-backend faiss"):
        read_flat_vectors(tmp_path / "hnsw.index")
    flat = faiss.IndexFlatIP(8)
    flat.add(np.ones((10, 8), dtype=np.float32))
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    vectors, metric = read_flat_vectors(tmp_path / "flat.index")
    assert metric == "ip" and vectors.shape == (10, 8) and float(vectors.sum()) == 80.0
    (tmp_path / "cut.index").write_bytes((tmp_path / "flat.index").read_bytes()[:-4])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_flat_vectors(tmp_path / "cut.index")


def test_serve_search_backend_torch_loads_the_torch_index(dense_index, bm25_index, tmp_path):
    spec = resolve_served_index(ServeOptions(index=str(dense_index), search_backend="torch", cpu=True))
    assert spec.search_backend == "torch"
    loaded = spec.open_vectors(dense_index / "faiss.index")
    assert isinstance(loaded, TorchExactIndex) and loaded.devices == ["cpu"]
    with pytest.raises(ValueError, match="applies to dense indexes"):
        resolve_served_index(ServeOptions(index=str(bm25_index), search_backend="torch"))
    hnsw_folder = tmp_path / "hnsw"  # a manifest that records another factory is refused before loading
    shutil.copytree(dense_index, hnsw_folder)
    manifest = json.loads((hnsw_folder / "manifest.json").read_text())
    (hnsw_folder / "manifest.json").write_text(json.dumps({**manifest, "faiss_factory": "HNSW32"}))
    with pytest.raises(IndexMismatchError, match="--search-backend faiss"):
        resolve_index(hnsw_folder, search_backend="torch")


def test_cuda_without_a_gpu_names_the_fix():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: benchmarks/gpu_check.sh measures the CUDA path")
    with pytest.raises(RuntimeError, match="torch sees no GPU; serve with --cpu"):
        TorchExactIndex(np.ones((4, 2), dtype=np.float32), device="cuda")
