"""How `SentenceEncoder` batches queries: sub-batches of similar length in tokens (`length_groups`),
encoded side by side by single-threaded workers on the CPU, vectors returned in the input order.
Real MiniLM, real questions of `mini_wiki/qa.jsonl`."""

import json
import threading

import numpy as np
import pytest
import torch

from tests.conftest import MINI_QA
from verl_search.retrieval.encoder import SentenceEncoder
from verl_search.retrieval.encoder_threads import length_groups, single_threaded_workers

QUESTIONS = [json.loads(line)["question"] for line in MINI_QA.read_text(encoding="utf-8").splitlines()][:96]


@pytest.fixture(scope="module")
def encoder(minilm_path):
    return SentenceEncoder(minilm_path, device="cpu", query_batch_size=16, threads=2)


def _forward_passes(encoder, queries):
    """`(thread name, input_ids shape)` of every forward pass that encoding `queries` runs."""
    passes = []
    hook = encoder._model.register_forward_pre_hook(
        lambda module, args: passes.append((threading.current_thread().name, tuple(args[0]["input_ids"].shape))))
    try:
        vectors = encoder.encode_queries(queries)
    finally:
        hook.remove()
    return vectors, passes


def _padded_positions(lengths: list[int], groups) -> int:
    """Token positions the forward passes compute when each group is padded to its longest text."""
    return sum(len(group) * max(lengths[i] for i in group) for group in groups)


def test_forward_passes_are_token_length_groups_and_pad_less_than_character_order(encoder):
    _, passes = _forward_passes(encoder, QUESTIONS)
    shapes = [shape for _, shape in passes]
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


def test_sub_batches_run_side_by_side_on_single_threaded_workers(encoder):
    threads_before = torch.get_num_threads()
    _, passes = _forward_passes(encoder, QUESTIONS)
    assert {name.split("_")[0] for name, _ in passes} == {"encoder"}  # never the calling thread
    # a 2-query batch is split so that both workers get one; a lone query runs here, on torch's threads
    _, passes = _forward_passes(encoder, QUESTIONS[:2])
    assert sorted(shape[0] for _, shape in passes) == [1, 1] and all(name.startswith("encoder") for name, _ in passes)
    _, passes = _forward_passes(encoder, QUESTIONS[:1])
    assert passes == [(threading.current_thread().name, passes[0][1])]
    # the workers run each operator on their own thread; every other thread keeps torch's process-wide count
    assert encoder._workers.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == threads_before
    elsewhere = []
    fresh = threading.Thread(target=lambda: elsewhere.append(torch.get_num_threads()))
    fresh.start()
    fresh.join()
    assert elsewhere == [threads_before]


def test_one_thread_encodes_in_the_calling_thread_with_the_same_vectors(minilm_path, encoder):
    threads_before = torch.get_num_threads()
    alone = SentenceEncoder(minilm_path, device="cpu", threads=1)  # sets torch's process-wide count to 1
    try:
        vectors, passes = _forward_passes(alone, QUESTIONS)
        assert alone._workers is None and {name for name, _ in passes} == {threading.current_thread().name}
        np.testing.assert_allclose(vectors, encoder.encode_queries(QUESTIONS), atol=1e-6)
    finally:
        torch.set_num_threads(threads_before)


def test_worker_count_must_be_positive():
    with pytest.raises(ValueError, match="encoder workers must be >= 1, got 0"):
        single_threaded_workers(0)
