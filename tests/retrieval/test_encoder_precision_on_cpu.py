"""The query encoder's GPU settings (fp16, one forward per micro-batch) and the check of a half-precision encoder
against the index's stored vectors.

What needs a GPU: running the encoder in fp16 on CUDA (`benchmarks/gpu_check.sh`). Here the choice of settings for
a CUDA device is tested as a pure function, and the load-time check runs on the CPU with a bf16 encoder (the same
code path: `precision != "float32"`), without faking CUDA.
"""

import logging

import numpy as np
import pytest

from verl_search.retrieval.dense import HALF_PRECISION_MIN_COSINE, verify_encoder
from verl_search.retrieval.encoder import (
    CPU_QUERY_BATCH_SIZE,
    GPU_QUERY_BATCH_SIZE,
    DeviceRuntime,
    SentenceEncoder,
    device_runtime,
)
from verl_search.server.settings import ServerSettings


@pytest.mark.parametrize("device, runtime", [
    ("cuda", DeviceRuntime("float16", GPU_QUERY_BATCH_SIZE)),     # every visible GPU
    ("cuda:1", DeviceRuntime("float16", GPU_QUERY_BATCH_SIZE)),   # one named GPU
    ("cpu", DeviceRuntime("float32", CPU_QUERY_BATCH_SIZE)),      # sub-batches of similar length, fp32
])
def test_cuda_gets_fp16_and_whole_micro_batches(device, runtime):
    assert device_runtime(device) == runtime


def test_a_gpu_forward_holds_a_whole_default_micro_batch():
    assert GPU_QUERY_BATCH_SIZE >= ServerSettings().max_batch_size


def test_a_half_precision_encoder_is_checked_and_put_back_to_fp32_when_it_differs(dense_retriever, minilm_path,
                                                                                  caplog):
    index, corpus = dense_retriever.index, dense_retriever.corpus
    half = SentenceEncoder(minilm_path, device="cpu", precision="bfloat16", threads=1)
    assert (half.precision, half.query_batch_size) == ("bfloat16", CPU_QUERY_BATCH_SIZE)
    assert verify_encoder(index, half, corpus, built_with="torch") >= HALF_PRECISION_MIN_COSINE
    assert half.precision == "bfloat16"
    # an encoder that embeds passages unlike the index (4-token inputs) is not refused: it goes back to fp32
    half._model.max_seq_length = 4
    with caplog.at_level(logging.WARNING):
        assert verify_encoder(index, half, corpus, built_with="torch") is None
    assert half.precision == "float32" and "encoding in float32" in caplog.text
    assert half.encode_queries(["who wrote hamlet"]).dtype == np.float32
    # the default fp32 encoder on a CPU is not checked at all
    assert verify_encoder(index, dense_retriever.encoder, corpus, built_with="torch") is None


def test_a_bad_precision_names_the_choices(minilm_path):
    with pytest.raises(ValueError, match="precision must be one of"):
        SentenceEncoder(minilm_path, device="cpu", precision="int8", threads=1)
