"""Encoder backend selection (`--encoder-backend torch|onnx|openvino`): recorded in the manifest,
chosen at serve time, and another backend than the index's is checked against the index's own
stored vectors. Real MiniLM and the session's real dense index; the ONNX / OpenVINO runs skip when
their runtime is not installed (they need `[onnx]` / `[openvino]`, which pull another torch)."""

import importlib.util

import pytest

from verl_search.retrieval.dense import verify_backend
from verl_search.retrieval.encoder import SentenceEncoder
from verl_search.retrieval.index_builder import BuildOptions
from verl_search.retrieval.loader import resolve_index
from verl_search.retrieval.manifest import IndexMismatchError, Manifest


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_backend_is_recorded_and_chosen_per_serve(dense_index):
    assert Manifest.read(dense_index).encoder.backend == "torch"  # built with the default
    assert BuildOptions(retriever="dense", encoder="m", encoder_backend="openvino").encoder_settings().backend == "openvino"
    default = resolve_index(dense_index)
    other = resolve_index(dense_index, encoder_backend="openvino")
    assert default.encoder.backend == "torch" and other.encoder.backend == "openvino"
    assert default.fingerprint() != other.fingerprint()  # cached answers never cross backends


def test_unknown_or_missing_backend_is_a_clear_error(minilm_path):
    with pytest.raises(ValueError, match="encoder backend must be one of"):
        SentenceEncoder(minilm_path, backend="tensorrt")
    if _installed("onnxruntime") and _installed("optimum"):
        pytest.skip("onnxruntime is installed here: nothing is missing")
    with pytest.raises(ImportError, match=r'pip install "verl-search\[onnx\]"'):
        SentenceEncoder(minilm_path, backend="onnx")


def test_verify_backend_accepts_the_same_embeddings_and_refuses_others(dense_retriever, minilm_path):
    index, corpus = dense_retriever.index, dense_retriever.corpus
    assert verify_backend(index, dense_retriever.encoder, corpus) > 0.999
    truncated = SentenceEncoder(minilm_path, max_length=4, device="cpu")  # embeds something else
    with pytest.raises(IndexMismatchError, match="embeds passages unlike the index"):
        verify_backend(index, truncated, corpus)


@pytest.mark.skipif(not (_installed("openvino") and _installed("optimum.intel")), reason="needs [openvino]")
def test_openvino_backend_serves_the_torch_index_with_the_same_hits(dense_index, dense_retriever):
    retriever = resolve_index(dense_index, encoder_backend="openvino").load()  # verified on load
    queries = ["If Gallu is a demon Lilu is what?", "Who directed Inception?"]
    got = retriever.search(queries, 3)
    want = dense_retriever.search(queries, 3)
    assert [[h.passage.id for h in row] for row in got] == [[h.passage.id for h in row] for row in want]
