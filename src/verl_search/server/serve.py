"""Serve an index in this process: resolve the index, build the app, run uvicorn (`serve`).

Also the options of the `serve` command (`ServeOptions`, `RayOptions`: its flags are generated from
them and `ServerSettings`, so defaults live in those classes only) and the pieces `server.ray_serve`
and `server.web.service` reuse (`resolve_served_index`, `freeze_loaded`, `draining_server`). The command itself (flags, `--ray` /
`--backend web` dispatch, exit codes) is `server.command`; this module imports neither Ray Serve
nor the web backend.

SIGTERM (or a first Ctrl-C) drains: `/health` says `draining` (503), new `/retrieve` requests get
503 with `Retry-After`, requests in flight are answered, and the process exits 0 once none is left
or `--drain-timeout` seconds have passed. A second signal exits at once.

Imports nothing of the verl side (tools, agent loop, eval, verl): it runs in a retriever-only install.
"""

from __future__ import annotations

import gc
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Literal

from verl_search.retrieval.base import Retriever
from verl_search.retrieval.encoder import EncoderBackend
from verl_search.retrieval.hybrid import HybridOptions
from verl_search.retrieval.rerank import RerankOptions, check_reranker_folder
from verl_search.server.settings import ServerSettings

logger = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    """What to serve and where (the server's limits are `ServerSettings`).

    Attributes:
        index: index folder, or a faiss file (Search-R1 layout).
        corpus, encoder: default: the manifest's; required with a faiss file.
        host: bind address (default 127.0.0.1, this machine only); port: TCP port (default 8000).
        cpu: keep the dense index (faiss's, or `--search-backend torch`'s vectors) on the CPU even if GPUs are
            visible (default: GPUs when present).
        verify_corpus: check the corpus SHA-256 against the manifest (reads the whole corpus).
        encoder_backend: dense: the query encoder's runtime (`torch`, `onnx`, `openvino`, `openvino-int8`; default
            the manifest's, or `openvino` for a torch-built Flat or HNSW index where the `[openvino]` extra is
            installed and no GPU is visible: `retrieval.encoder.query_backend`). Another one is checked when the index loads.
        encoder_threads: dense on CPU: threads of the query encoder, torch's or OpenVINO's (default:
            the runtime's own, one per core; torch runs a lone query on the cores other processes leave free,
            `retrieval.encoder_threads.FreeCores`); >= 1, else ValueError before the port is bound.
        log_level: uvicorn's log level (default `info`).
        retriever: which retriever of the index to serve (default: the manifest's); a hybrid index
            (`index build --retriever hybrid`) also serves its `bm25` or `dense` half alone.
        backend: `index` (default: `index` is required) or `web` (`server.web.service`: a web search API and page
            reader behind the same wire format, `WebOptions`).
        page_access: serve `POST /access` over the index's corpus (default on; `server.access`); its
            title table is built at load, once per corpus (cached under `$VERL_SEARCH_CACHE`).
        search_backend: dense: `faiss` (default) or `torch`: a Flat index searched exactly by torch, its vectors in
            fp16 across the visible GPUs (fp32 on the CPU with `--cpu` or without a GPU), no faiss-gpu needed
            (`retrieval.torch_exact`).
        http_workers: HTTP processes in front of this one, which holds the index and its one micro-batcher
            (default 1: this process answers HTTP itself; `server.workers`). >= 1.
        cuda_graphs: dense, torch encoder on CUDA: replay the query encoder's forward pass as CUDA graphs, the usual
            shapes captured at load (default on; `retrieval.cuda_graphs`; MiniLM's 30 graphs: 4-5 s and about
            1.4 GB of GPU memory on an H200).
    """

    index: str | None = field(default=None, metadata={
        "help": "index folder, or a faiss file (Search-R1 layout); required unless --backend web"})
    corpus: str | None = field(default=None, metadata={
        "help": "JSONL corpus (default: the one in the manifest; required for a faiss file)"})
    encoder: str | None = field(default=None, metadata={
        "help": "encoder folder (default: the one in the manifest; required for a faiss file)"})
    host: str = field(default="127.0.0.1", metadata={"help": "bind address (this machine only by default)"})
    port: int = field(default=8000, metadata={"help": "TCP port"})
    cpu: bool = field(default=False, metadata={"help": "keep the dense index on the CPU even if GPUs are visible"})
    verify_corpus: bool = field(default=False, metadata={"help": "check the corpus SHA-256 against the manifest"})
    encoder_backend: EncoderBackend | None = field(default=None, metadata={
        "help": "dense: query encoder runtime (default: the manifest's, or openvino for a torch-built index where "
                "the [openvino] extra is installed on a CPU machine); another one is checked against the index"})
    encoder_threads: int | None = field(default=None, metadata={
        "help": "dense: CPU threads of the query encoder, torch or OpenVINO (default: the runtime's, one per core; "
                "torch runs a lone query on the cores other processes leave free)"})
    log_level: str = field(default="info", metadata={"help": "uvicorn log level"})
    drain_timeout: float = field(default=30.0, metadata={
        "help": "seconds to let in-flight requests finish after SIGTERM before exiting"})
    retriever: Literal["bm25", "dense", "hybrid"] | None = field(default=None, metadata={
        "help": "retriever of the index to serve (default: the manifest's; a hybrid index also serves bm25 or dense alone)"})
    backend: Literal["index", "web"] = field(default="index", metadata={
        "help": "index: serve --index; web: a web search API and page reader (the web flags below; pip install \"verl-search[web]\")"})
    page_access: bool = field(default=True, metadata={
        "help": "--no-page-access: no POST /access (page access by id or title), no title table built at load"})
    search_backend: Literal["faiss", "torch"] = field(default="faiss", metadata={
        "help": "dense: faiss, or torch: exact search of a Flat index in torch, fp16 over every visible GPU "
                "(fp32 on the CPU), no faiss-gpu needed"})
    http_workers: int = field(default=1, metadata={
        "help": "HTTP worker processes on the port, in front of one process that searches the index (1: that "
                "process answers HTTP itself)"})
    cuda_graphs: bool = field(default=True, metadata={
        "help": "--no-cuda-graphs: run the query encoder's forward pass eagerly on CUDA (no graphs captured at load, "
                "no GPU memory held for them)"})


@dataclass
class RayOptions:
    """`serve --ray`: deploy the same app with Ray Serve (`server.ray_serve`; the `[ray]` extra).

    Attributes:
        ray: deploy with Ray Serve instead of one uvicorn process (default off).
        ray_address: `local` (default): start a Ray instance on this machine for the length of the
            command; `auto`: the running cluster (`ray start`, e.g. the one verl trains on); or a
            `ray://host:port` address.
        replicas: replicas of the retriever (and of each shard of a sharded index); 0 = one per
            alive node (with at most one per node). Default 1.
        num_cpus, num_gpus: Ray resources per replica (fractions allowed: 0.5 GPU shares one with
            training). Defaults 1 and 0.
        max_replicas_per_node: at most this many replicas of a deployment per node (default: no limit).
        app_name: the Serve application's name (default `verl-search`).
    """

    ray: bool = field(default=False, metadata={"help": "deploy with Ray Serve (needs the [ray] extra)"})
    ray_address: str = field(default="local", metadata={
        "help": "local: a new Ray instance on this machine; auto: the running cluster; or ray://HOST:PORT"})
    replicas: int = field(default=1, metadata={
        "help": "Ray: replicas of the retriever and of each index shard (0: one per alive node)"})
    num_cpus: float = field(default=1.0, metadata={"help": "Ray: CPUs per replica (a fraction is fine)"})
    num_gpus: float = field(default=0.0, metadata={"help": "Ray: GPUs per replica (a fraction shares a GPU)"})
    max_replicas_per_node: int | None = field(default=None, metadata={
        "help": "Ray: at most this many replicas of a deployment on one node"})
    app_name: str = field(default="verl-search", metadata={"help": "Ray: Serve application name"})


def draining_server(config, service, drain_timeout: float):
    """A `uvicorn.Server` that drains on the first SIGTERM/SIGINT instead of stopping at once.

    Args:
        config: the `uvicorn.Config`.
        service: the app's state (`app.state.service`): `drain()`, `in_flight`.
        drain_timeout: seconds, at most, to wait for in-flight requests (then uvicorn's own
            shutdown runs, bounded by `config.timeout_graceful_shutdown`).
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drain_started: float | None = None

        def handle_exit(self, sig, frame) -> None:  # called in the main thread by uvicorn's signal handler
            if self.drain_started is None and sig in (signal.SIGTERM, signal.SIGINT):
                self.drain_started = time.monotonic()
                service.drain()
                logger.info("draining: %d requests in flight, new ones get 503", service.in_flight)
                return
            self.should_exit = True  # a second signal: stop now, without re-raising it at exit
            self.force_exit = sig == signal.SIGINT

        async def on_tick(self, counter: int) -> bool:
            if self.drain_started is not None and not self.should_exit:
                waited = time.monotonic() - self.drain_started
                if service.in_flight == 0 or waited >= drain_timeout:
                    logger.info("drained after %.1f s (%d requests left)", waited, service.in_flight)
                    self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer(config)


def freeze_loaded(retriever: Retriever) -> Retriever:
    """Take everything alive now out of the garbage collector's future passes (`gc.collect()`, then
    `gc.freeze()`) and return `retriever`; for a process that exists to serve (`serve`, a Ray Serve
    replica), called once its index is loaded.

    With torch, transformers and faiss loaded, a server process holds about half a million objects
    that live as long as it does; a full collection walks them all (about 0.25 s on 2 cores) holding
    the GIL, and meanwhile the batch worker cannot start its next encoder operator. Under 256
    single-query clients (MiniLM, CPU) it halved the event loop's CPU (0.06 -> 0.03 of a core,
    py-spy showed `gc_collect_main` in 11% of its samples) and gave the encoder threads that time.
    Objects made later (requests, answers) are collected as usual. Python's `gc.freeze` docs.
    """
    gc.collect()
    gc.freeze()
    logger.info("%d objects frozen out of the garbage collector", gc.get_freeze_count())
    return retriever


def resolve_served_index(options: ServeOptions, hybrid: HybridOptions | None = None,
                         rerank: RerankOptions | None = None):
    """The checked `IndexSpec` that `serve` and `serve --ray` load: `resolve_index` on `options`
    (encoder backend and threads included), the retriever `options.retriever` selects, the fusion
    `hybrid` and the rerank stage `rerank`. Only cheap checks: call it before a port is bound.

    Raises:
        FileNotFoundError, IndexMismatchError (a ValueError), ValueError: see `resolve_index`; a missing
            `--index`, `--encoder-threads` below 1, fusion flags on an index not served as hybrid,
            rerank flags without `--reranker`; FileNotFoundError: the reranker folder holds no model.
    """
    from verl_search.retrieval.loader import resolve_index

    if options.index is None:
        raise ValueError("--index is required (an index folder or a faiss file), unless --backend web")
    spec = resolve_index(options.index, corpus=options.corpus, encoder=options.encoder,
                         verify_corpus=options.verify_corpus, use_gpu=False if options.cpu else None,
                         encoder_backend=options.encoder_backend, search_backend=options.search_backend)
    if options.encoder_threads is not None and options.encoder_threads < 1:
        raise ValueError(f"--encoder-threads must be >= 1, got {options.encoder_threads}")
    spec.encoder_threads, spec.cuda_graphs = options.encoder_threads, options.cuda_graphs
    spec.select(options.retriever)
    if options.search_backend != "faiss" and spec.kind == "bm25":
        raise ValueError(f"--search-backend {options.search_backend} applies to dense indexes; {options.index} is "
                         "served as bm25")
    spec.hybrid, spec.rerank = hybrid, rerank
    if spec.kind != "hybrid" and hybrid is not None and hybrid != HybridOptions():
        raise ValueError(f"--fusion, --rrf-k, --dense-weight and --fusion-candidates apply to a hybrid index; "
                         f"{options.index} is served as {spec.kind}")
    if rerank is not None and rerank.reranker:
        check_reranker_folder(rerank.reranker)  # FileNotFoundError before the port is bound
    elif rerank is not None and rerank != RerankOptions():
        raise ValueError("--rerank-candidates, --rerank-batch-size and --rerank-max-length need --reranker DIR")
    return spec


def serve(options: ServeOptions, settings: ServerSettings | None = None, hybrid: HybridOptions | None = None,
          rerank: RerankOptions | None = None) -> int:
    """Serve until stopped (SIGTERM/SIGINT drain first, see the module docstring); return the exit
    code: 0, or 1 if the index failed to load.

    The cheap checks (`resolve_index`: files exist, corpus size, encoder fingerprint) run before
    the port is bound; the slow load runs in the app's background thread (`/health` says
    `loading` meanwhile) and a failure there stops the server.

    Raises:
        FileNotFoundError, IndexMismatchError (a ValueError), ValueError: see `resolve_index`.
    """
    import uvicorn

    from verl_search.retrieval.pages import PageLookup
    from verl_search.server.access import CorpusPages
    from verl_search.server.app import create_app, index_service

    spec = resolve_served_index(options, hybrid, rerank)
    failed: list[BaseException] = []

    def stop_on_failure(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    pages = CorpusPages() if options.page_access else None

    def load() -> Retriever:
        retriever = spec.load()
        if pages is not None:  # POST /access: the corpus's title table (read once per corpus, then cached)
            pages.lookup = PageLookup.open(spec.load_corpus())
        return freeze_loaded(retriever)

    app = create_app(index_service(load, settings or ServerSettings(), on_load_failure=stop_on_failure,
                                   fingerprint=spec.fingerprint(), pages=pages))
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level=options.log_level,
                            timeout_graceful_shutdown=max(1.0, options.drain_timeout))
    server = draining_server(config, app.state.service, options.drain_timeout)
    server.run()
    if failed:
        logger.error("the index could not be loaded: %s", failed[0])
        return 1
    return 0
