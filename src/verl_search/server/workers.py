"""`serve --http-workers N`: N HTTP processes in front of one search process, so that parsing requests and writing
JSON run on N cores while the index (and its one GPU encoder) is searched by one micro-batcher.

The process `serve` starts is the search process: it spawns the workers first, then loads the index, runs the
micro-batcher (`server.batcher.MicroBatcher`, with the `ServerSettings` given) and answers the workers over a
Unix socket (`multiprocessing.connection`, pickled lists of hits; the address and its random key are passed to
the spawned workers only). Each worker runs the same app as `serve` (`create_app(index_service(...))`: wire
format, limits, errors, `/health`, query cache, `/access`, draining), bound to the same port with `SO_REUSEPORT`
(the kernel spreads connections over the workers); its retriever is a `RemoteRetriever` that forwards each of
its batches, which its own batcher sends as soon as they are gathered (`max_wait_ms` 0: the search process does
the waiting). Workers are spawned, not forked: they import no torch and no faiss.

A worker binds the port at once but listens only once the index is loaded (it has connected to the search
process, which greets every worker together once all are connected, and has opened the corpus's pages): until
then the port refuses connections, and a request never reaches a worker that cannot answer it yet (a worker
answering `loading` beside a ready one would fail a client that `/health` had just called ready). SIGTERM or Ctrl-C
drains: the search process passes the signal on to every worker, each drains as `serve` does, then the search
process exits 0. A worker that exits otherwise stops the server with exit code 1; a worker whose search process
has gone answers 503 and exits.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Listener
from pathlib import Path

from verl_search.retrieval.base import Hit, RetrieverUnavailableError
from verl_search.server.settings import ServerSettings

logger = logging.getLogger(__name__)


@dataclass
class WorkerConfig:
    """What a spawned worker needs: where to listen (`host`, `port`), uvicorn's `log_level`, `drain_timeout`
    seconds, the `settings`, the index `fingerprint` (query-cache keys), the search process's `address` and
    `authkey`, and `spec` (the `IndexSpec`, whose corpus serves `/access`) or None for no `/access`."""

    host: str
    port: int
    log_level: str
    drain_timeout: float
    settings: ServerSettings
    fingerprint: str
    address: str
    authkey: bytes
    spec: object | None


class RemoteRetriever:
    """A `Retriever` whose searches run in the search process: one request at a time over one connection.

    Args:
        address, authkey: the search process's `Listener`.
        timeout: seconds to wait for the search process to be ready (it loads the index meanwhile).

    Raises:
        TimeoutError: the search process did not answer within `timeout`.
    """

    def __init__(self, address: str, authkey: bytes, timeout: float = 3600.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._conn = Client(address, authkey=authkey)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the search process at {address} was not ready after {timeout:.0f} s")
                time.sleep(0.2)
        self.kind, self.num_passages = self._conn.recv()  # sent once the index is loaded
        self._lock = threading.Lock()

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """`Retriever.search`, in the search process. Raises what it raised there, or
        `RetrieverUnavailableError` (a 503) when the search process is gone."""
        return self._call(queries, topk, False)

    def search_filled(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """`retrieval.fill.search_filled` in the search process (ReSearch's routes)."""
        return self._call(queries, topk, True)

    def _call(self, queries: list[str], topk: int, fill: bool) -> list[list[Hit]]:
        with self._lock:
            try:
                self._conn.send((queries, topk, fill))
                failed, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise RetrieverUnavailableError("the search process has gone; the server is stopping") from exc
        if failed:
            raise value
        return value


def _worker_main(config: WorkerConfig) -> None:
    """A worker process: the index app over a `RemoteRetriever`, on a `SO_REUSEPORT` socket; it exits when the
    process that spawned it has gone."""
    import uvicorn

    from verl_search.runtime.exits import configure_logging
    from verl_search.retrieval.pages import PageLookup
    from verl_search.server.access import CorpusPages
    from verl_search.server.app import create_app, index_service
    from verl_search.server.serve import draining_server

    configure_logging()
    parent = os.getppid()
    pages = CorpusPages() if config.spec is not None else None

    def orphaned() -> None:  # the search process was killed without passing a signal on
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True, name="orphan-watch").start()
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))  # the port is held; uvicorn listens once the app has started
    if pages is not None:
        pages.lookup = PageLookup.open(config.spec.load_corpus())
    retriever = RemoteRetriever(config.address, config.authkey)  # returns once the index is loaded
    settings = config.settings.model_copy(update={"max_wait_ms": 0.0, "max_burst_wait_ms": 0.0})
    app = create_app(index_service(retriever, settings, fingerprint=config.fingerprint, pages=pages))
    uv_config = uvicorn.Config(app, log_level=config.log_level, timeout_graceful_shutdown=max(1.0, config.drain_timeout))
    draining_server(uv_config, app.state.service, config.drain_timeout).run(sockets=[sock])


class SearchProcess:
    """The micro-batcher over the loaded retriever, answering workers' connections (one thread each).

    Args:
        retriever: the loaded retriever; settings: the batcher's knobs (`ServerSettings`).
    """

    def __init__(self, retriever, settings: ServerSettings):
        from verl_search.server.batcher import MicroBatcher

        self.retriever = retriever
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="search-loop").start()
        self.batcher = MicroBatcher(retriever, micro_batching=settings.micro_batching,
                                    max_batch_size=settings.max_batch_size, max_wait_ms=settings.max_wait_ms,
                                    burst_gap_ms=settings.burst_gap_ms, max_burst_wait_ms=settings.max_burst_wait_ms)

    def listen(self, listener: Listener, workers: int = 1) -> None:
        """Accept connections until the listener is closed. The first `workers` are greeted together (the
        retriever's kind and size) once all of them are connected, so that the workers start listening at once;
        later ones at once. Each connection then answers `(queries, topk, fill)` with `(failed, hits or
        exception)`."""
        try:
            for conn in [listener.accept() for _ in range(workers)]:
                self._answer_in_thread(conn)
            while True:
                self._answer_in_thread(listener.accept())
        except OSError:  # closed at shutdown
            return

    def _answer_in_thread(self, conn) -> None:
        threading.Thread(target=self._answer, args=(conn,), daemon=True, name="search-conn").start()

    def _answer(self, conn) -> None:
        try:
            conn.send((self.retriever.kind, self.retriever.num_passages))
        except (EOFError, OSError):
            return
        while True:
            try:
                queries, topk, fill = conn.recv()
            except (EOFError, OSError):
                return
            future = asyncio.run_coroutine_threadsafe(self.batcher.search(queries, topk, fill=fill), self.loop)
            try:
                reply = (False, future.result())
            except Exception as exc:  # the worker raises it again: the same error responses as one process
                reply = (True, exc)
            try:
                try:
                    conn.send(reply)
                except (pickle.PicklingError, TypeError, AttributeError):  # an exception pickle cannot carry
                    conn.send((True, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))
            except (EOFError, OSError):
                return

    def close(self) -> None:
        """Stop the batcher's worker thread and the event loop."""
        self.batcher.close()
        self.loop.call_soon_threadsafe(self.loop.stop)


def serve_with_workers(options, settings: ServerSettings | None = None, hybrid=None, rerank=None) -> int:
    """Serve `options` (`server.serve.ServeOptions`, `http_workers` >= 2) with that many HTTP worker processes in
    front of this one (see the module docstring); returns the exit code: 0 after a drain, 1 if the index failed
    to load or a worker exited on its own.

    Raises:
        FileNotFoundError, IndexMismatchError (a ValueError), ValueError: as `server.serve.resolve_served_index`,
            before any worker starts.
    """
    from verl_search.server.serve import freeze_loaded, resolve_served_index

    settings = settings or ServerSettings()
    spec = resolve_served_index(options, hybrid, rerank)
    folder = Path(tempfile.mkdtemp(prefix="verl-search-"))
    address, authkey = str(folder / "search.sock"), os.urandom(32)
    config = WorkerConfig(options.host, options.port, options.log_level, options.drain_timeout, settings,
                          spec.fingerprint(), address, authkey, spec if options.page_access else None)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker_main, args=(config,), name=f"http-worker-{i}")
               for i in range(options.http_workers)]
    for worker in workers:
        worker.start()
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    loaded: list = []  # the retriever, or the exception that stopped its load

    def load() -> None:
        try:
            loaded.append(freeze_loaded(spec.load()))
        except BaseException as exc:
            loaded.append(exc)

    search = listener = None
    code = 0
    logger.info("%d HTTP workers on %s:%d; loading the index", len(workers), options.host, options.port)
    threading.Thread(target=load, daemon=True, name="index-load").start()
    try:
        while not stopping.wait(0.2):  # a worker that exits stops the server at once, even while loading
            gone = [w for w in workers if not w.is_alive()]
            if gone:
                logger.error("HTTP worker %s exited (code %s); stopping the server", gone[0].name, gone[0].exitcode)
                code = 1
                break
            if loaded and search is None:
                if isinstance(loaded[0], BaseException):
                    logger.error("the index could not be loaded: %s", loaded[0])
                    code = 1
                    break
                search = SearchProcess(loaded[0], settings)
                listener = Listener(address, authkey=authkey)
                threading.Thread(target=search.listen, args=(listener, len(workers)), daemon=True,
                                 name="search-accept").start()
    finally:
        for worker in workers:  # a drain: each worker answers what it holds, then exits
            if worker.is_alive():
                os.kill(worker.pid, signal.SIGTERM)
        deadline = time.monotonic() + options.drain_timeout + 5.0
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                worker.kill()
        if listener is not None:
            listener.close()
        if search is not None:
            search.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for leftover in folder.iterdir():
            leftover.unlink(missing_ok=True)
        folder.rmdir()
    return code
