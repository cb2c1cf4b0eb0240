"""Queries tokenized by the Rust tokenizer directly (`retrieval.query_features.RustFeatures`) give exactly
sentence-transformers' `preprocess` features, so the encoder's vectors are unchanged; where they would not, the
encoder keeps `preprocess`. Real MiniLM, real questions of `mini_wiki/qa.jsonl`."""

import json

import numpy as np
import pytest
import torch

from tests.conftest import MINI_QA
from verl_search.retrieval.encoder import SentenceEncoder
from verl_search.retrieval.query_features import PROBE, RustFeatures

QUESTIONS = [json.loads(line)["question"] for line in MINI_QA.read_text(encoding="utf-8").splitlines()][:64]
TEXTS = QUESTIONS + ["  spaces around  ", "ÉIRE ünïcode", "word " * 400]


@pytest.fixture(scope="module")
def encoder(minilm_path):
    return SentenceEncoder(minilm_path, device="cpu", query_prefix="query: ", threads=1)


@pytest.mark.parametrize("prefix", ["", "query: "])
def test_the_rust_features_are_preprocess_features(encoder, prefix):
    assert encoder._rust is not None  # MiniLM's tokenizer qualifies
    expected = encoder._model.preprocess(TEXTS, prompt=prefix or None)
    got = encoder._rust(TEXTS, prefix)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value, name
    assert got["input_ids"].shape[1] == encoder.max_length  # the long text was truncated, special tokens included


def test_the_vectors_are_sentence_transformers_own(encoder):
    ours = encoder.encode_queries(TEXTS)
    theirs = encoder._model.encode(TEXTS, prompt="query: ", normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == (len(TEXTS), encoder.dim) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_tokenizer_whose_features_differ_keeps_preprocess(encoder, caplog):
    model = encoder._model

    class Shifted:  # preprocess with one more token than the tokenizer gives: the probe must catch it
        tokenizer = model.tokenizer

        @staticmethod
        def preprocess(texts, prompt=None):
            features = model.preprocess(texts, prompt=prompt)
            return {**features, "input_ids": features["input_ids"] + 1}

    caplog.set_level("INFO", logger="verl_search.retrieval.query_features")
    assert RustFeatures.for_model(Shifted(), encoder.max_length, [""]) is None
    assert "differ from preprocess" in caplog.text
    assert RustFeatures.for_model(object(), encoder.max_length, [""]) is None  # no tokenizer at all
    assert RustFeatures.for_model(model, encoder.max_length, [""]) is not None


def test_the_probe_has_a_text_past_the_token_limit():
    assert max(len(text.split()) for text in PROBE) > 512
