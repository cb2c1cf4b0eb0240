"""Encoder backend selection (`--encoder-backend torch|onnx|openvino|openvino-int8`): recorded in the manifest,
chosen at serve time, and another backend than the index's is checked against the index's own
stored vectors. Real MiniLM and the session's real dense index; the ONNX / OpenVINO runs skip when
their runtime is not installed (they need `[onnx]` / `[openvino]`, which pull another torch)."""

import argparse
import importlib.util
import re
from pathlib import Path
from typing import get_args

import pytest

from verl_search.retrieval.dense import verify_backend
from verl_search.retrieval.encoder import BACKENDS, EncoderBackend, SentenceEncoder
from verl_search.retrieval.index_builder import BuildOptions
from verl_search.retrieval.loader import resolve_index
from verl_search.retrieval.manifest import IndexMismatchError, Manifest
from verl_search.retrieval.quantize import CALIBRATION_PASSAGES, INT8_FILE, calibration_passages
from verl_search.runtime.extras import install_line
from verl_search.runtime.options import add_arguments


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


def test_a_torch_index_is_served_on_openvino_where_its_extra_is_installed_on_a_cpu(dense_index, monkeypatch):
    # the extra's modules and the device are stood in for (openvino is not installed here; the run with the real
    # runtime: test_openvino_backend_serves_the_torch_index_with_the_same_hits, where it is)
    from verl_search.retrieval import encoder

    monkeypatch.setattr(encoder, "_missing_modules", lambda backend: [])
    monkeypatch.setattr(encoder, "default_device", lambda: "cpu")
    assert resolve_index(dense_index).encoder.backend == "openvino"
    assert resolve_index(dense_index, encoder_backend="torch").encoder.backend == "torch"  # named: kept
    monkeypatch.setattr(encoder, "default_device", lambda: "cuda")
    assert resolve_index(dense_index).encoder.backend == "torch"  # a GPU: torch on it
    monkeypatch.setattr(encoder, "default_device", lambda: "cpu")
    # an index that does not store its vectors cannot be checked against another backend: the index's
    assert [encoder.query_backend("torch", f) for f in ("Flat", "HNSW32", "IVF256,Flat", "PQ16", None)] == [
        "openvino", "openvino", "torch", "torch", "torch"]
    monkeypatch.setattr(encoder, "_missing_modules", lambda backend: ["openvino", "optimum.intel"])
    assert resolve_index(dense_index).encoder.backend == "torch"  # without the extra: the index's


def test_build_and_serve_offer_exactly_the_backends_the_encoder_knows():
    from verl_search.server.serve import ServeOptions

    assert set(get_args(EncoderBackend)) == set(BACKENDS)
    for options in (BuildOptions, ServeOptions):
        parser = argparse.ArgumentParser()
        add_arguments(parser, options)
        action = next(a for a in parser._actions if a.dest == "encoder_backend")
        assert set(action.choices) == set(BACKENDS), options


def test_unknown_or_missing_backend_is_a_clear_error(minilm_path):
    with pytest.raises(ValueError, match="encoder backend must be one of"):
        SentenceEncoder(minilm_path, backend="tensorrt")
    if not _installed("openvino"):  # int8 names the extra that exists ([openvino]), not "[openvino-int8]"
        with pytest.raises(ImportError, match=re.escape(install_line("openvino"))):
            SentenceEncoder(minilm_path, backend="openvino-int8")
    if _installed("onnxruntime") and _installed("optimum"):
        pytest.skip("onnxruntime is installed here: nothing is missing")
    with pytest.raises(ImportError, match=re.escape(install_line("onnx"))):
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


def test_int8_calibration_passages_are_spread_over_the_corpus(dense_retriever):
    corpus = dense_retriever.corpus
    passages = calibration_passages(corpus, count=4)
    step = len(corpus) // 4
    assert passages == [corpus.get(i * step).contents for i in range(4)]  # rows 0, n/4, n/2, 3n/4
    assert len(calibration_passages(corpus)) == CALIBRATION_PASSAGES


_INT8_MODULES = ("openvino", "optimum.intel", "nncf", "datasets")


@pytest.mark.skipif(not all(_installed(m) for m in _INT8_MODULES), reason="needs [openvino] (with nncf)")
def test_int8_backend_is_quantised_once_on_the_corpus_and_serves_the_torch_index(dense_index, dense_retriever, minilm_path,
                                                                                 tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="needs calibration passages"):
        SentenceEncoder(minilm_path, backend="openvino-int8")
    retriever = resolve_index(dense_index, encoder_backend="openvino-int8").load()  # verified on load
    (folder,) = (tmp_path / "encoders").iterdir()
    made = (folder / INT8_FILE).stat().st_mtime_ns
    resolve_index(dense_index, encoder_backend="openvino-int8").load_encoder()  # a second replica: from the cache
    assert (folder / INT8_FILE).stat().st_mtime_ns == made and len(list((tmp_path / "encoders").iterdir())) == 1
    assert not (Path(minilm_path) / INT8_FILE).exists()  # nothing written into the model's own folder
    queries = ["If Gallu is a demon Lilu is what?", "Who directed Inception?"]
    got, want = retriever.search(queries, 1), dense_retriever.search(queries, 1)
    assert [row[0].passage.id for row in got] == [row[0].passage.id for row in want]
