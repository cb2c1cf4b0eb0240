"""`--encoder-threads`: torch's CPU thread count for the query encoder, checked and applied."""

import argparse

import pytest
import torch

from verl_search.retrieval.encoder_threads import set_encoder_threads
from verl_search.runtime.options import build
from verl_search.server.command import add_serve_arguments
from verl_search.server.serve import ServeOptions


def test_encoder_threads_flag_sets_torchs_threads():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    options = build(ServeOptions, parser.parse_args(["--index", "x", "--encoder-threads", "1"]))
    assert options.encoder_threads == 1
    before = torch.get_num_threads()
    try:
        set_encoder_threads(options.encoder_threads)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="encoder threads must be >= 1"):
        set_encoder_threads(0)


def _spinners(count: int):
    """`count` processes spinning on the CPU (a trainer beside the retriever), started and running."""
    import subprocess
    import sys

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def test_free_cores_counts_other_processes_not_this_one():
    """Arithmetic of `FreeCores` on given samples of (wall s, machine busy CPU s, own CPU s): this process's own
    CPU time is not counted against it; others' is; the result stays within [1, cores]; a second call within the
    window keeps the value."""
    from verl_search.retrieval.encoder_threads import FreeCores

    free = FreeCores(4, window_s=0.2)
    samples = iter([(1.0, 10.0, 2.0), (2.0, 14.0, 6.0), (3.0, 16.5, 6.5), (4.0, 30.0, 6.5)])
    clock = iter([2.0, 2.1, 3.0, 4.0])
    free._sample, free._clock = lambda: next(samples), lambda: next(clock)
    free._last = free._sample()
    assert free.threads() == 4  # 4 busy core-seconds in 1 s, all this process's own: 4 cores free
    assert free.threads() == 4  # within the window: not measured again
    assert free.threads() == 2  # 2.5 busy, 0.5 own: others hold 2 cores
    assert free.threads() == 1  # others hold all 4 (13.5 busy, none own): still one thread
    with pytest.raises(ValueError, match="cores >= 1"):
        FreeCores(0)


def test_a_lone_query_takes_one_thread_when_other_processes_hold_the_cores(minilm_path):
    """The encoder's default: with as many processes spinning as there are cores, a lone query's forward runs on one
    intra-op thread (it would wait at every operator for a thread the busy processes keep off the CPU); with
    `threads` given, the count stays as given."""
    import os
    import time

    from verl_search.retrieval.encoder import SentenceEncoder

    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: nothing to choose")
    before = torch.get_num_threads()
    encoder = SentenceEncoder(minilm_path)
    spinners = _spinners(cores)
    try:
        time.sleep(0.5)
        encoder.encode_queries(["who wrote hamlet"])  # the first measurement's window starts at load
        time.sleep(0.5)
        encoder.encode_queries(["who wrote hamlet"])
        assert torch.get_num_threads() == 1
        fixed = SentenceEncoder(minilm_path, threads=cores)
        time.sleep(0.5)
        fixed.encode_queries(["who wrote hamlet"])
        assert torch.get_num_threads() == cores
    finally:
        for spinner in spinners:
            spinner.kill()
        torch.set_num_threads(before)
