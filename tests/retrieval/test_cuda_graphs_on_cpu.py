"""The query encoder's CUDA graphs (`retrieval.cuda_graphs`), as far as a CPU can check them: the padding to a bucket
leaves every query's vector as the unpadded forward gives it (real MiniLM, real questions), and where a graph
cannot be captured the encoder turns the graphs off and answers from the eager forward. The capture and replay
themselves need a GPU: `benchmarks/gpu_check.sh` runs them on a lent H100/H200 (docs/benchmarks/gpu-check.md)."""

import json

import numpy as np
import pytest
import torch

from tests.conftest import MINI_QA
from verl_search.retrieval.cuda_graphs import MIN_TOKENS, GraphedForward, bucket, pad_features
from verl_search.retrieval.encoder import SentenceEncoder

QUESTIONS = [json.loads(line)["question"] for line in MINI_QA.read_text(encoding="utf-8").splitlines()][:37]


@pytest.fixture(scope="module")
def encoder(minilm_path):
    return SentenceEncoder(minilm_path, device="cpu", query_prefix="query: ", threads=1)


@pytest.mark.parametrize("count", [1, 5, 37])
def test_padding_to_a_bucket_keeps_every_vector(encoder, count):
    features = encoder._features(QUESTIONS[:count], encoder.query_prefix)
    batch, longest = features["input_ids"].shape
    queries, tokens = bucket(batch), bucket(longest + 1, MIN_TOKENS)
    padded = pad_features(features, queries, tokens, encoder._model.tokenizer.pad_token_id)
    assert padded["input_ids"].shape == (queries, tokens) and tokens > longest and queries >= batch
    assert bool((padded["attention_mask"][:, -1] == 0).all())  # every row has a padded position
    with torch.inference_mode():
        eager = encoder._device_forward(dict(features))
        graphed_input = encoder._device_forward({**padded, **{k: v for k, v in features.items()
                                                              if not isinstance(v, torch.Tensor)}})
    assert graphed_input.shape == (queries, encoder.dim)
    cosine = torch.nn.functional.cosine_similarity(graphed_input[:batch], eager, dim=1)
    assert float(cosine.min()) > 0.99999
    assert bool(torch.isfinite(graphed_input).all())  # the extra rows hold one unmasked token, never NaN


def test_a_batch_larger_than_the_bucket_is_refused():
    features = {"input_ids": torch.ones((3, 8), dtype=torch.int64), "attention_mask": torch.ones((3, 8), dtype=torch.int64)}
    with pytest.raises(ValueError, match="does not fit a 2 x 16 bucket"):
        pad_features(features, 2, 16, 0)


def test_a_failed_capture_turns_the_graphs_off_and_the_eager_forward_answers(encoder, caplog):
    # a CPU has no CUDA stream to capture on: the same path as a capture that fails on a GPU
    graphs = GraphedForward(encoder._device_forward, torch.device("cpu"), encoder._model.tokenizer.pad_token_id,
                            encoder.max_length)
    features = encoder._features(QUESTIONS[:3], encoder.query_prefix)
    caplog.set_level("WARNING", logger="verl_search.retrieval.cuda_graphs")
    assert graphs(features) is None and not graphs.enabled
    assert "CUDA graphs off" in caplog.text
    vectors = encoder._forward(features, graphs)  # the encoder's own path with graphs that are off
    np.testing.assert_allclose(vectors, encoder._forward(features), atol=1e-6)


def test_long_or_large_batches_are_not_graphed(encoder):
    graphs = GraphedForward(encoder._device_forward, torch.device("cpu"), 0, max_length=64, max_tokens=1024)
    wide = {"input_ids": torch.ones((2, 64), dtype=torch.int64), "attention_mask": torch.ones((2, 64), dtype=torch.int64)}
    many = {"input_ids": torch.ones((128, 10), dtype=torch.int64), "attention_mask": torch.ones((128, 10), dtype=torch.int64)}
    assert graphs(wide) is None and graphs(many) is None
    assert graphs.enabled  # refused by size, not by a failed capture


def test_the_encoder_graphs_queries_on_cuda_only(encoder):
    assert encoder._graphs is None  # on the CPU the forward runs eagerly


def test_the_warm_up_asks_for_every_usual_bucket_with_real_tokenized_batches(encoder):
    class Recording(GraphedForward):  # records what a capture would be asked for (capturing needs a GPU)
        def __call__(self, features):
            batch, longest = features["input_ids"].shape
            self.asked.append((bucket(batch), bucket(longest + 1, MIN_TOKENS), longest))
            return None

    graphs = Recording(encoder._device_forward, torch.device("cpu"), 0, encoder.max_length, max_tokens=4096)
    graphs.asked = []
    graphs.warm_up(lambda texts: encoder._features(texts, encoder.query_prefix), max_queries=64)
    expected = [(q, t, t - 1) for t in (16, 32, 64) for q in (1, 2, 4, 8, 16, 32, 64) if q * t <= 4096]
    assert graphs.asked == expected  # every row one token short of its bucket: the bucket is exactly t tokens


def test_a_warm_up_whose_capture_fails_stops_at_once(encoder):
    graphs = GraphedForward(encoder._device_forward, torch.device("cpu"), 0, encoder.max_length)
    assert graphs.warm_up(lambda texts: encoder._features(texts, encoder.query_prefix), max_queries=512) == 0
    assert not graphs.enabled
