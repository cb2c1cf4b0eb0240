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


class FreeCores:
    """How many of `cores` CPU cores the rest of the machine leaves this process, measured at most every
    `window_s` seconds (default 0.2): the machine's busy time over the window (`/proc/stat`, all cores) less this
    process's own CPU time (`time.process_time`), as cores, taken from `cores`; `threads()` rounds it to a thread
    count in `[1, cores]`.

    Why: a lone query's forward on torch's intra-op threads waits at every operator for the slowest thread. On
    cores that other processes keep busy (a retriever beside the trainer) that wait dominates: one client, two
    busy processes on 2 cores, MiniLM on the mini index: 14-15 queries/s on 2 threads against 34-37 on 1; quiet,
    2 threads answer 79 queries/s against 55 on 1 (docs/benchmarks/one-client-peer.md). So the encoder takes
    the cores that are free.

    Linux only: elsewhere (no `/proc/stat`) `threads()` is `cores`. The first call, with no window behind it yet,
    is `cores` too.

    Raises:
        ValueError: `cores` < 1 or `window_s` <= 0.
    """

    def __init__(self, cores: int, window_s: float = 0.2):
        if cores < 1 or window_s <= 0:
            raise ValueError(f"FreeCores needs cores >= 1 and window_s > 0, got {cores} and {window_s}")
        import os
        import time

        self.cores, self.window_s = cores, window_s
        self._tick_s = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self._clock, self._cpu = time.monotonic, time.process_time
        self._last = self._sample()
        self._threads = cores

    def _sample(self) -> tuple[float, float, float] | None:
        """`(wall s, machine busy CPU s, own CPU s)` now, or None without `/proc/stat`."""
        try:
            with open("/proc/stat", encoding="ascii") as stat:
                fields = [int(v) for v in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal ...: busy is everything but idle and iowait
        busy = sum(fields[:8]) - fields[3] - fields[4]
        return self._clock(), busy * self._tick_s, self._cpu()

    def threads(self) -> int:
        """Thread count for the next forward: the free cores rounded, in `[1, cores]`; the last value within
        `window_s` of the previous measurement."""
        if self._last is None or self._clock() - self._last[0] < self.window_s:
            return self._threads
        now = self._sample()
        if now is None:
            return self._threads
        wall, busy, own = (b - a for a, b in zip(self._last, now))
        self._last = now
        others = max(0.0, busy - own) / wall
        self._threads = max(1, min(self.cores, round(self.cores - others)))
        return self._threads
