"""How the encoder spreads a batch over CPU threads: sub-batches of similar length in tokens (`length_groups`),
single-threaded workers that encode them side by side (`single_threaded_workers`), and torch's process-wide
operator threads (`set_encoder_threads`). Used by `retrieval.encoder.SentenceEncoder`."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def length_groups(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Split texts of `lengths` tokens into sub-batches of at most `batch_size` texts of similar length.

    Each sub-batch is padded to its longest text, so grouping by token count wastes fewer padded
    positions than sentence-transformers' own order (by characters): about 8% of the tokens of a
    sub-batch of 16 real questions instead of 27% (`mini_wiki/qa.jsonl`, MiniLM's tokenizer),
    which makes encoding about 14% faster on a CPU.

    Returns:
        arrays of row indices into `lengths`, shortest texts first; together a permutation of
        `range(len(lengths))`.

    >>> [group.tolist() for group in length_groups([5, 9, 3, 9, 4], 2)]
    [[2, 4], [0, 1], [3]]
    """
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def single_threaded_workers(count: int) -> ThreadPoolExecutor:
    """`count` threads (named `encoder_N`) on which torch runs each CPU operator on that one thread.

    torch parallelises every operator over its intra-op threads, which meet after each one; on the
    small matrices of a 16-query sub-batch that wait costs more than it gains, and on a busy machine
    (the server's event loop takes a core now and then) one late thread stalls them all. Encoding
    whole sub-batches side by side, one per worker, avoids both. On 2 CPU cores (MiniLM, real
    questions, docs/retrieval-service.md "Encoder backends"): +28-59% queries/s for the encoder alone on 256-query
    batches (`benchmarks/bench_encoder_backends.py`), +21-37% for the server at 256 x 1.

    torch gives each thread its operator thread count on that thread's first use, from the
    process-wide count (`torch.set_num_threads`). Each worker takes its count first, then sets it
    to 1; the process-wide count is put back once all workers have, so every other thread keeps it.

    Raises:
        ValueError: `count` < 1.
        TimeoutError: the workers did not start within 60 seconds.
    """
    if count < 1:
        raise ValueError(f"encoder workers must be >= 1, got {count}")
    import torch

    process_wide = torch.get_num_threads()
    started = threading.Barrier(count + 1)

    def init() -> None:
        torch.get_num_threads()  # this thread takes the process-wide count now, not on its first operator
        torch.set_num_threads(1)
        started.wait()

    workers = ThreadPoolExecutor(count, thread_name_prefix="encoder", initializer=init)
    for _ in range(count):  # a busy (initialising) worker makes the pool start another, up to `count`
        workers.submit(int)
    try:
        started.wait(timeout=60)
    except threading.BrokenBarrierError as exc:
        workers.shutdown(wait=False)
        raise TimeoutError(f"{count} encoder workers did not start within 60 s") from exc
    finally:
        torch.set_num_threads(process_wide)
    return workers


def set_encoder_threads(threads: int) -> None:
    """Run torch's CPU operators (the encoder's forward pass) on `threads` threads, process-wide.

    `threads` >= 1 (torch's default is one per core). On a small machine the server's event loop
    shares the cores with the encoder; see `benchmarks/bench_retrieval_server.py --serve-arg`.

    Raises:
        ValueError: `threads` < 1.
    """
    if threads < 1:
        raise ValueError(f"encoder threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)
