"""How `SentenceEncoder` batches queries: sub-batches of similar length in tokens (`length_groups`),
vectors returned in the input order. Real MiniLM, real questions of `mini_wiki/qa.jsonl`."""

import json

import numpy as np
import pytest

from tests.conftest import MINI_QA
from verl_search.retrieval.encoder import SentenceEncoder, length_groups

QUESTIONS = [json.loads(line)["question"] for line in MINI_QA.read_text(encoding="utf-8").splitlines()][:96]


@pytest.fixture(scope="module")
def encoder(minilm_path):
    return SentenceEncoder(minilm_path, device="cpu", query_batch_size=16)


def _padded_positions(lengths: list[int], groups) -> int:
    """Token positions the forward passes compute when each group is padded to its longest text."""
    return sum(len(group) * max(lengths[i] for i in group) for group in groups)


def test_forward_passes_are_token_length_groups_and_pad_less_than_character_order(encoder):
    shapes = []
    hook = encoder._model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0]["input_ids"].shape)))
    try:
        encoder.encode_queries(QUESTIONS)
    finally:
        hook.remove()
    lengths = [len(ids) for ids in encoder._model.tokenizer(QUESTIONS)["input_ids"]]
    ours = length_groups(lengths, 16)
    assert sorted(shapes) == sorted((len(group), max(lengths[i] for i in group)) for group in ours)
    # sentence-transformers' own order (by characters, longest first) pads more positions (728 vs 520 here)
    by_characters = np.argsort([-len(q) for q in QUESTIONS], kind="stable")
    theirs = [by_characters[start : start + 16] for start in range(0, len(QUESTIONS), 16)]
    padding = _padded_positions(lengths, ours) - sum(lengths)
    assert padding < 0.8 * (_padded_positions(lengths, theirs) - sum(lengths))


def test_vectors_come_back_in_the_order_of_the_queries(encoder):
    together = encoder.encode_queries(QUESTIONS)
    alone = np.stack([encoder.encode_queries([q])[0] for q in QUESTIONS])
    assert together.shape == (len(QUESTIONS), encoder.dim) and together.dtype == np.float32
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert encoder.encode_queries([]).shape == (0, encoder.dim)
