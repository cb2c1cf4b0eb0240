"""`verl-search serve --ray`: the same retrieval app, deployed with Ray Serve on a Ray cluster.

Each replica is a Ray actor running `create_app` exactly as `verl-search serve` does (same wire
format, validation, `/health`, micro-batching, OpenAPI page): the class below hands the app to
Serve with `serve.ingress()` + `__serve_build_asgi_app__`. A replica loads its index in its
constructor, so `serve.run` returns only once every replica is loaded; `serve_with_ray` then
checks `/health` and logs the URL.

Routing: Serve runs an HTTP proxy on the head node and on every node that holds a replica
(`proxy_location="EveryNode"`), bound to `--host:--port` there, so a trainer on such a node calls
`http://127.0.0.1:PORT/retrieve`; each proxy prefers replicas on its own node
(`RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING`, on by default in Ray 2.60), then any replica.
`--replicas 0` puts one replica on every alive node, hence a proxy on every node.

A sharded dense index (`index build --shards N`) becomes N shard deployments (each holds one faiss
part) plus the front deployment, which encodes each batch once, fans out to the shards through
Serve handles and merges the top-k (`retrieval.shards.ShardedDenseRetriever`).

`POST /access` (page access, `server.access`) is served by every front replica, from the corpus it
loaded with the index, unless `--no-page-access`. A hybrid index (`--retriever`, the fusion flags)
and the rerank stage (`--reranker`) are served as without `--ray`: every front replica loads what
`IndexSpec.load` builds (both halves and the cross-encoder; a sharded hybrid index's dense half
searches the shard deployments).

The front's calls to the shards prefer shard replicas on its own node too (`remote_shards`).

Faults: a replica that dies is restarted by Serve; requests routed to it fail with a 5xx or a
reset connection, which `tools.client.search` retries. `GET /health` adds `replicas` (RUNNING
replicas per deployment), `replica` (the answering replica's actor name) and `node`.
"""

from __future__ import annotations

import logging
import signal
import threading

import ray
from ray import serve

from verl_search.retrieval.base import RetrieverUnavailableError
from verl_search.retrieval.hybrid import HybridOptions
from verl_search.retrieval.loader import IndexSpec
from verl_search.retrieval.rerank import RerankOptions
from verl_search.retrieval.shards import SearchShards
from verl_search.server.app import create_app, index_service
from verl_search.server.health import wait_until_ready
from verl_search.server.serve import RayOptions, ServeOptions, freeze_loaded, resolve_served_index
from verl_search.server.settings import ServerSettings

logger = logging.getLogger(__name__)

#: concurrent requests a front replica accepts (Serve's default is 5, which would starve the
#: micro-batcher); more wait in Serve's queue
MAX_ONGOING_REQUESTS = 1024
#: seconds a front replica waits for one shard's answer
SHARD_TIMEOUT_S = 60.0


def replicas_up() -> dict:
    """`/health` fields of a replica: `replicas` (RUNNING replicas per deployment of this
    application), `replica` (this actor's name) and `node` (this node's id). Call inside a replica."""
    context = serve.get_replica_context()
    status = serve.status().applications[context.app_name]
    running = {name: int(deployment.replica_states.get("RUNNING", 0)) for name, deployment in status.deployments.items()}
    runtime = ray.get_runtime_context()
    return {"replicas": running, "replica": runtime.get_actor_name(), "node": runtime.get_node_id()}


def remote_shards(handles: list) -> SearchShards:
    """A `retrieval.shards.SearchShards` fan-out over shard deployments: every shard is asked at
    once, then the answers are collected (call from a plain thread, e.g. the batch worker). Each
    handle prefers a shard replica on this node (`_init(_prefer_local_routing=True)`, Ray 2.60's
    way to set what `options(_prefer_local_routing=...)` did), then any replica. A shard that fails or
    does not answer within `SHARD_TIMEOUT_S` fails the whole search (`RetrieverUnavailableError`:
    503 to the client), never a merge of the other shards' answers."""
    for handle in handles:
        handle._init(_prefer_local_routing=True)

    def search_shards(vectors, topk):
        responses = [handle.search.remote(vectors, topk) for handle in handles]
        answers = []
        for shard, response in enumerate(responses):
            try:
                answers.append(response.result(timeout_s=SHARD_TIMEOUT_S))
            except Exception as exc:  # a replica lost with its node, a timeout: no merge of the shards left
                raise RetrieverUnavailableError(f"shard {shard} of {len(handles)} did not answer "
                                                f"({type(exc).__name__}); retry shortly") from exc
        return answers

    return search_shards


@serve.ingress()
class RetrieverReplica:
    """One replica of the retrieval app.

    Args:
        spec: the checked index (`resolve_served_index`); loaded here, in the constructor.
        settings: the server's limits and batching.
        page_access: also serve `POST /access` (`server.access`) over the index's corpus; its title
            table is built here, after the index, as `verl-search serve` builds it.
        shards: Serve handles of the shard deployments (sharded dense index), none otherwise.
    """

    def __init__(self, spec: IndexSpec, settings: ServerSettings, page_access: bool, *shards):
        from verl_search.retrieval.pages import PageLookup
        from verl_search.server.access import CorpusPages

        retriever = spec.load(remote_shards(list(shards)) if shards else None)
        freeze_loaded(retriever)
        pages = CorpusPages(PageLookup.open(spec.load_corpus())) if page_access else None
        self.retrieval_app = create_app(index_service(retriever, settings, fingerprint=spec.fingerprint(),  # `app`
                                                      health_extras=replicas_up, pages=pages))  # is Serve's

    def __serve_build_asgi_app__(self):
        return self.retrieval_app

    def check_health(self) -> None:
        """Serve's periodic check: a replica whose index failed is replaced."""
        service = self.retrieval_app.state.service
        if service.status == "failed":
            raise RuntimeError(f"index failed: {service.error}")


class ShardReplica:
    """One replica of one shard of a sharded dense index: `search(vectors, topk) -> (scores, rows)`.

    Args:
        spec: the checked index; shard: which of `spec.shards` to load.
    """

    def __init__(self, spec: IndexSpec, shard: int):
        self.shard = spec.load_shard(shard)
        self.lock = threading.Lock()  # faiss GPU search is not thread safe

    def search(self, vectors, topk: int):
        """`ShardIndex.search`: float32 scores and int64 corpus rows, shape `(n, min(topk, rows))`."""
        with self.lock:
            return self.shard.search(vectors, topk)


def build_application(spec: IndexSpec, settings: ServerSettings, options: RayOptions, page_access: bool = True):
    """The Serve application: the front deployment, bound to one deployment per shard if any.
    `page_access`: the front replicas also serve `POST /access` (default on, as `verl-search serve`).

    Raises:
        ValueError: `replicas < 0`.
    """
    if options.replicas < 0:
        raise ValueError(f"--replicas must be >= 0 (0: one per node), got {options.replicas}")
    replicas, per_node = options.replicas, options.max_replicas_per_node
    if replicas == 0:
        replicas, per_node = sum(1 for node in ray.nodes() if node["Alive"]), 1
    common = {"num_replicas": replicas, "max_replicas_per_node": per_node,
              "ray_actor_options": {"num_cpus": options.num_cpus, "num_gpus": options.num_gpus}}
    sharded = spec.shards if spec.kind != "bm25" else []  # a hybrid index served as bm25 uses no shard
    shards = [
        serve.deployment(ShardReplica, name=f"shard-{i}", max_ongoing_requests=MAX_ONGOING_REQUESTS, **common).bind(spec, i)
        for i in range(len(sharded))
    ]
    front = serve.deployment(RetrieverReplica, name="retriever", max_ongoing_requests=MAX_ONGOING_REQUESTS, **common)
    return front.bind(spec, settings, page_access, *shards)


def deploy(options: ServeOptions, settings: ServerSettings, ray_options: RayOptions, route_prefix: str = "/",
           spec: IndexSpec | None = None) -> str:
    """Deploy the index on the connected Ray cluster and wait until every replica is loaded.

    Args:
        options: what to serve (`index`, `corpus`, `encoder`, `cpu`, `retriever`, encoder backend
            and threads) and where (`host`, `port`: Serve's HTTP proxies, on every node with a replica).
        settings: the server's limits and batching.
        ray_options: replicas and resources (`ray_address` is not used here: connect first).
        route_prefix: the application's path prefix (`/`: `http://HOST:PORT/retrieve`).
        spec: the checked index with its fusion and rerank stage (`resolve_served_index`); default:
            `resolve_served_index(options)` (the index's own retriever, default fusion, no reranker).

    Returns:
        the base URL, e.g. `http://127.0.0.1:8000` (`/retrieve`, `/health`, `/docs` and, unless
        `options.page_access` is off, `/access` under it).

    Raises:
        FileNotFoundError, ValueError: see `resolve_served_index`; RuntimeError: a replica failed to start.
    """
    spec = resolve_served_index(options) if spec is None else spec
    serve.start(proxy_location="EveryNode", http_options={"host": options.host, "port": options.port})
    application = build_application(spec, settings, ray_options, options.page_access)
    serve.run(application, name=ray_options.app_name, route_prefix=route_prefix)
    url = f"http://{'127.0.0.1' if options.host in ('0.0.0.0', '::') else options.host}:{options.port}"
    url += route_prefix.rstrip("/")
    health = wait_until_ready(url, timeout=120.0)
    logger.info("serving %s on %s/retrieve (replicas up: %s)", spec.index_path, url, health.get("replicas"))
    return url


def serve_with_ray(options: ServeOptions, settings: ServerSettings, ray_options: RayOptions,
                   hybrid: HybridOptions | None = None, rerank: RerankOptions | None = None) -> int:
    """`verl-search serve --ray`: check the flags (`resolve_served_index`, before Ray starts), connect
    to Ray, deploy, serve until SIGTERM/SIGINT, then remove the application (and stop the Ray instance
    if this command started it). `hybrid`, `rerank`: a hybrid index's fusion and the rerank stage, as
    `server.serve.serve`. Returns 0.

    Raises:
        as `resolve_served_index` and `deploy`; ConnectionError: `--ray-address auto` and no cluster is running.
    """
    spec = resolve_served_index(options, hybrid, rerank)
    address = ray_options.ray_address
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except ConnectionError as exc:
        raise ConnectionError(f"no Ray cluster at --ray-address {address} ({exc}); start one with `ray start --head` "
                              "or pass --ray-address local") from exc
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        url = deploy(options, settings, ray_options, spec=spec)
        logger.info("ready: %s/retrieve (Ctrl-C or SIGTERM stops it)", url)
        while not stop.wait(3600):
            pass
    finally:
        if address == "local":
            serve.shutdown()
        else:
            serve.delete(ray_options.app_name)
        ray.shutdown()
    return 0
