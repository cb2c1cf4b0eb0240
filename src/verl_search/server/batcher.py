"""Cross-request micro-batching: one worker thread owns the retriever.

Every `/retrieve` request becomes a `_Job` on a queue. A single worker thread keeps the jobs it
has taken but not finished, and builds each batch of at most `max_batch_size` queries from them,
*fairly*: every pending job gets an equal share of the batch (a job needing less than its share
gives the rest to the others), so a large request (Search-R1's trainer posts 2,560 queries at
once) is answered in `max_batch_size` slices, and a single-query tool call that arrives
meanwhile rides in the next slice instead of waiting behind the whole request. A job's answer is
sent when its last slice is searched.

Each batch is one `retriever.search` call (one encoder forward pass and one faiss search) over its
*distinct* queries; duplicates within a batch (GRPO's n rollouts of one question often ask the
same thing) are searched once and counted (`duplicates`). When no job is pending the worker
blocks; when the previous batch held more than one job it waits up to `max_wait_ms` for more
before searching (under concurrent load the wait fills the batch; a lone client never pays it).
Under heavy load (the previous batch was at least half full) it keeps gathering while requests
arrive at most `burst_gap_ms` apart, up to `max_burst_wait_ms`: with 256 single-query clients the
clients it has just answered come back within a few tens of milliseconds, and without that wait
each batch would take only the half that arrived while the last one ran, the two halves taking
turns (30-s levels of 256 x 1, old and new alternated: 307 / 309 -> 326 / 315 q/s, docs/benchmarks/retrieval-server.md).
Because only this thread touches the retriever, the index is never searched from two threads at
once (faiss GPU search is not thread safe; Search-R1's server ran it from a thread pool).

With micro-batching off, the same worker runs each request alone and whole, in arrival order (one
`search` call per request, as Search-R1's server does: the baseline of the benchmark).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from verl_search.retrieval.base import Hit, Retriever
from verl_search.retrieval.fill import search_filled

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    """One request: its queries, `topk`, the asyncio future of its hits (resolved in the future's
    event loop), and how far the worker got; `fill`: answered by `retrieval.fill.search_filled`
    (ReSearch's `/batch_search`: `topk` passages for every query) instead of `retriever.search`."""

    queries: list[str]
    topk: int
    future: asyncio.Future
    fill: bool = False
    done: int = 0  # queries searched so far (the next slice starts here)
    hits: list = field(default_factory=list)
    abandoned: bool = False  # the caller gave up (client disconnected): drop the rest unsearched
    finished: bool = False  # the worker has answered it (hits or an error)

    @property
    def remaining(self) -> int:
        return len(self.queries) - self.done


def _resolve(outcomes: list[tuple[asyncio.Future, object, BaseException | None]]) -> None:
    """Set each future's hits or error (in its event loop); a future the caller cancelled is skipped."""
    for future, hits, error in outcomes:
        if future.done():
            continue
        if error is None:
            future.set_result(hits)
        else:
            future.set_exception(error)


_STOP = object()


def fair_shares(remaining: list[int], capacity: int) -> list[int]:
    """Split `capacity` batch slots over jobs needing `remaining[i]` queries, max-min fairly.

    Every job gets an equal share; a job that needs less than its share gives the rest to the
    others. Ties go to the earlier job (arrival order).

    >>> fair_shares([2560, 1, 1], 256)
    [254, 1, 1]
    >>> fair_shares([2560, 2560], 256)
    [128, 128]
    >>> fair_shares([1] * 3, 2)
    [1, 1, 0]
    """
    shares = [0] * len(remaining)
    left = capacity
    active = [i for i, need in enumerate(remaining) if need > 0]
    while left > 0 and active:
        share = max(1, left // len(active))
        for i in list(active):
            take = min(share, remaining[i] - shares[i], left)
            shares[i] += take
            left -= take
            if shares[i] == remaining[i]:
                active.remove(i)
            if left == 0:
                break
    return shares


class MicroBatcher:
    """Run `retriever.search` for concurrent requests from one thread, coalescing and slicing them.

    Args:
        retriever: the retriever; only the worker thread calls it.
        micro_batching: coalesce requests and slice large ones (True, default) or run each
            request alone and whole (False).
        max_batch_size: most queries in one `search` call (default 256); with micro-batching
            on, a larger request is answered in slices of at most this many queries.
        max_wait_ms: milliseconds to wait for more requests once the first one is in (default 2).
        burst_gap_ms, max_burst_wait_ms: after a batch at least half of `max_batch_size`, wait for
            more requests while they arrive at most `burst_gap_ms` apart (default 5), at most
            `max_burst_wait_ms` in all (default 50; 0 turns this off), or until the batch is full.

    Attributes (read by `/health`):
        batches: `search` calls made so far; `queries`: queries answered so far (duplicates
        included); `duplicates`: queries answered from another copy in the same batch;
        `search_seconds`: seconds spent inside `retriever.search`.
    """

    def __init__(self, retriever: Retriever, micro_batching: bool = True, max_batch_size: int = 256, max_wait_ms: float = 2.0,
                 burst_gap_ms: float = 5.0, max_burst_wait_ms: float = 50.0):
        self.retriever = retriever
        self.micro_batching = micro_batching
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.burst_gap = burst_gap_ms / 1000.0
        self.max_burst_wait = max_burst_wait_ms / 1000.0
        self.batches = 0
        self.queries = 0
        self.duplicates = 0
        self.search_seconds = 0.0
        self._last_batch_jobs = 0
        self._last_batch_size = 0  # queries, duplicates included
        self._pending: list[_Job] = []
        self._stopping = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._thread.start()

    async def search(self, queries: list[str], topk: int, fill: bool = False) -> list[list[Hit]]:
        """Queue a request and wait for its hits (`len(queries)` lists of at most `topk`; with `fill`,
        `retrieval.fill.search_filled`'s: `topk` for every query, as ReSearch's retriever).

        Raises:
            whatever `retriever.search` raised for a batch holding part of this request.
        """
        return await self.submit(queries, topk, fill)

    def submit(self, queries: list[str], topk: int, fill: bool = False) -> asyncio.Future:
        """Queue a request; return an asyncio future of its hits (call from the event loop; `fill` as
        in `search`).

        Cancelling the future drops the request: what the worker has not searched yet is never
        searched (checked before every slice). The worker resolves the futures finished by a batch
        with one `call_soon_threadsafe` per event loop, so a 256-request batch wakes the loop once,
        not 256 times (`concurrent.futures` + `asyncio.wrap_future` cost a lock and a wake-up each).
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not queries:  # nothing to search: a job with no queries would never get a share of a batch
            future.set_result([])
            return future
        job = _Job(queries=queries, topk=topk, future=future, fill=fill)
        future.add_done_callback(lambda f: setattr(job, "abandoned", f.cancelled()))
        self._queue.put(job)
        return future

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after the jobs already queued (waits up to `timeout` seconds)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    # -- worker thread ---------------------------------------------------------------------------

    def _take(self, item) -> int:
        """Take a queued item; return the queries it adds to `_pending` (0 for a stop or a dropped job)."""
        if item is _STOP:
            self._stopping = True
        elif not item.abandoned:  # a job cancelled while queued is dropped
            self._pending.append(item)
            return item.remaining
        return 0

    def _drain_queue(self, wait: float, gap: float | None = None) -> None:
        """Move queued jobs to `_pending`; block when none is pending, or wait up to `wait` seconds
        for more while the pending queries do not fill a batch (and, with a `gap`, only while they
        arrive at most `gap` seconds apart)."""
        if not self._pending and not self._stopping:
            self._take(self._queue.get())
        deadline = time.monotonic() + wait
        pending = sum(job.remaining for job in self._pending)  # kept up to date, not summed per arrival
        while True:
            try:
                pending += self._take(self._queue.get_nowait())
                continue
            except queue.Empty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping or pending >= self.max_batch_size:
                return
            try:
                pending += self._take(self._queue.get(timeout=remaining if gap is None else min(remaining, gap)))
            except queue.Empty:
                return

    def _under_heavy_load(self) -> bool:
        """The last batch held at least half of `max_batch_size` queries, from more than one job (and
        the burst wait is on)."""
        return self.max_burst_wait > 0 and self._last_batch_jobs > 1 and 2 * self._last_batch_size >= self.max_batch_size

    def _run(self) -> None:
        while True:
            if self.micro_batching and self._under_heavy_load():  # gather the clients just answered
                self._drain_queue(self.max_burst_wait, self.burst_gap)
            elif self.micro_batching:
                self._drain_queue(self.max_wait if self._last_batch_jobs > 1 else 0.0)
            elif not self._pending and not self._stopping:
                self._take(self._queue.get())
            self._pending = [job for job in self._pending if not job.abandoned]
            if not self._pending:
                if self._stopping:
                    return
                continue
            if self.micro_batching:
                shares = fair_shares([job.remaining for job in self._pending], self.max_batch_size)
                slices = [(job, share) for job, share in zip(self._pending, shares) if share]
            else:
                slices = [(self._pending[0], self._pending[0].remaining)]
            self._execute(slices)
            self._pending = [job for job in self._pending if not job.finished]

    def _execute(self, slices: list[tuple[_Job, int]]) -> None:
        """Search the next `count` queries of each `(job, count)` in one call (two when filled jobs,
        `_Job.fill`, share the batch with plain ones); answer finished jobs."""
        self._last_batch_jobs = len(slices)
        queries = [(job.fill, q) for job, count in slices for q in job.queries[job.done : job.done + count]]
        self._last_batch_size = len(queries)
        distinct = list(dict.fromkeys(queries))
        by_query = {}
        started = time.perf_counter()
        try:
            for fill in sorted({fill for fill, _ in distinct}):
                texts = [q for f, q in distinct if f == fill]
                topk = max(job.topk for job, _ in slices if job.fill == fill)
                found = search_filled(self.retriever, texts, topk) if fill else self.retriever.search(texts, topk)
                by_query.update(((fill, q), hits) for q, hits in zip(texts, found))
        except Exception as exc:  # these requests fail; the worker keeps serving
            logger.exception("retrieval failed for a batch of %d queries", len(distinct))
            self._answer([(job, exc) for job, _ in slices])
            return
        finally:
            self.search_seconds += time.perf_counter() - started
        self.batches += 1
        self.queries += len(queries)
        self.duplicates += len(queries) - len(distinct)
        finished = []
        for job, count in slices:
            job.hits.extend(by_query[job.fill, q][: job.topk] for q in job.queries[job.done : job.done + count])
            job.done += count
            if job.remaining == 0:
                finished.append((job, None))
        self._answer(finished)

    @staticmethod
    def _answer(finished: list[tuple[_Job, BaseException | None]]) -> None:
        """Mark jobs finished and resolve their futures: one `call_soon_threadsafe` per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for job, error in finished:
            job.finished = True
            by_loop.setdefault(job.future.get_loop(), []).append((job.future, job.hits, error))
        for loop, outcomes in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, outcomes)
            except RuntimeError:  # the loop is closed (server shut down): nobody waits for these
                logger.debug("event loop closed; %d answers dropped", len(outcomes))
