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
