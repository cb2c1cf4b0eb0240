"""Cross-request micro-batching: one worker thread owns the retriever.

Every `/retrieve` request becomes a `_Job` on a queue. A single worker thread takes the first job,
then gathers more (jobs already queued at once, then, under concurrent load, new ones for up to
`max_wait_ms`) until the batch holds `max_batch_size` queries, and runs them as *one* `retriever.search` call: one encoder
forward pass and one faiss search for many concurrent single-query tool calls. Because only this
thread ever touches the retriever, the index is never searched from two threads at once (faiss GPU
search is not thread safe; Search-R1's server ran it from a thread pool).

With micro-batching off, the same worker runs each request alone, in arrival order.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from verl_search.retrieval.base import Hit, Retriever

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    queries: list[str]
    topk: int
    future: Future = field(default_factory=Future)


_STOP = object()


class MicroBatcher:
    """Run `retriever.search` for concurrent requests from one thread, coalescing them.

    Args:
        retriever: the retriever; only the worker thread calls it.
        micro_batching: coalesce requests (True) or run each alone (False).
        max_batch_size: most queries in one `search` call (a larger single request runs alone).
        max_wait_ms: milliseconds to wait for more requests once the first one is in.

    Attributes:
        batches: `search` calls made so far; `queries`: queries answered so far.
    """

    def __init__(self, retriever: Retriever, micro_batching: bool = True, max_batch_size: int = 256, max_wait_ms: float = 2.0):
        self.retriever = retriever
        self.micro_batching = micro_batching
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.batches = 0
        self.queries = 0
        self._last_batch_jobs = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._thread.start()

    async def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Queue a request and wait for its hits (`len(queries)` lists of at most `topk`).

        Raises:
            whatever `retriever.search` raised for the batch holding this request.
        """
        return await self.submit(queries, topk)

    def submit(self, queries: list[str], topk: int) -> asyncio.Future:
        """Queue a request; return an asyncio future of its hits (call from the event loop).

        Cancelling the future drops the request: a job whose future is cancelled before the worker
        dequeues it is never searched (one check per job, in `_execute`).
        """
        job = _Job(queries=queries, topk=topk)
        self._queue.put(job)
        return asyncio.wrap_future(job.future)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after the jobs already queued (waits up to `timeout` seconds)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        carry = None
        while True:
            first = carry if carry is not None else self._queue.get()
            carry = None
            if first is _STOP:
                return
            batch = [first]
            if self.micro_batching:
                carry = self._gather(batch)
            self._execute(batch)
            if carry is _STOP:
                return

    def _gather(self, batch: list[_Job]):
        """Add queued jobs to `batch` up to `max_batch_size` queries; return a job that did not fit.

        Jobs already queued are always taken. Waiting (up to `max_wait`) for jobs not yet queued
        only happens when the previous batch had more than one job: under concurrent load the
        wait fills the batch, and a lone client never pays it.
        """
        size = len(batch[0].queries)
        deadline = time.monotonic() + (self.max_wait if self._last_batch_jobs > 1 else 0.0)
        while size < self.max_batch_size:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                try:
                    job = self._queue.get(timeout=remaining)
                except queue.Empty:
                    return None
            if job is _STOP or size + len(job.queries) > self.max_batch_size:
                return job
            batch.append(job)
            size += len(job.queries)
        return None

    def _execute(self, batch: list[_Job]) -> None:
        # a job whose caller gave up (future cancelled: client disconnected) is dropped here, unsearched
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        self._last_batch_jobs = len(live)
        if not live:
            return
        queries = [q for job in live for q in job.queries]
        topk = max(job.topk for job in live)
        try:
            hits = self.retriever.search(queries, topk)
        except Exception as exc:  # the requests fail; the worker keeps serving
            logger.exception("retrieval failed for a batch of %d queries", len(queries))
            for job in live:
                job.future.set_exception(exc)
            return
        self.batches += 1
        self.queries += len(queries)
        start = 0
        for job in live:
            job.future.set_result([h[: job.topk] for h in hits[start : start + len(job.queries)]])
            start += len(job.queries)
