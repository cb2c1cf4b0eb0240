"""`serve --ray` on a real local Ray instance (CPU): one Serve instance for the module, two apps on it.

- `/bm25`: the BM25 index with 2 replicas: same wire format and validation as the plain server,
  `/health` lists the replicas, requests spread over both, and a replica killed (`ray.kill`) under
  64 concurrent tool-client callers costs no failed call (client retries + Serve's restart).
- `/sharded`: a 2-shard dense (Flat) index: 2 shard deployments + a front that encodes and merges;
  its hits equal the unsharded index's, scores and ids. A shard replica killed under load: every answer is
  the whole index's or a 503 (the lost shard; never a merge of the shard left, never a 500), and Serve's
  replacement answers within 30 s.
- `/hybrid`: a hybrid index (BM25 + MiniLM) whose dense half is 2 shards: 2 shard deployments + a front that
  fuses BM25 with the shards' merged top-k; its hits equal the unsharded hybrid index's.
- The apps answer `POST /access` (page access) as the plain server over the whole mini corpus does (the dense
  and hybrid apps serve conftest's `dense_corpus`, the mini corpus's dense test subset, which holds the
  passages asked for).
- `/`: `serve --ray` run as a command, joining this Ray instance by its address (`--no-page-access`: no
  `/access` route).
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
from ray import serve  # noqa: E402

from verl_search.retrieval.index_builder import BuildOptions, build_index  # noqa: E402
from verl_search.server.serve import RayOptions, ServeOptions  # noqa: E402
from verl_search.server.settings import ServerSettings  # noqa: E402
from verl_search.server.local import free_port  # noqa: E402
from tests.conftest import MINI_QA  # noqa: E402
from tests.waiting import wait_until, wait_until_async  # noqa: E402

QUESTIONS = [json.loads(line)["question"] for line in open(MINI_QA, encoding="utf-8")][:40]


@pytest.fixture(scope="module")
def sharded_index(dense_corpus, dense_index, minilm_path):
    """Conftest's `dense_index` split into 2 Flat shards (`index build --shards 2 --from-faiss`)."""
    out = dense_corpus.parent / "dense_2shards"
    build_index(dense_corpus, out, BuildOptions(retriever="dense", encoder=minilm_path, shards=2,
                                                from_faiss=str(dense_index), overwrite=True))
    return out


@pytest.fixture(scope="module")
def cluster(bm25_index, sharded_index, sharded_hybrid_index):
    """A local Ray instance (6 logical CPUs) with Serve on a free port: BM25 x2 at /bm25, the
    sharded dense index at /sharded, the sharded hybrid index at /hybrid.
    Yields `{name: base URL, "port": Serve's port, "address": Ray's}`."""
    from verl_search.server.ray_serve import deploy

    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = free_port()
    try:
        urls = {
            "bm25": deploy(ServeOptions(index=str(bm25_index), port=port), ServerSettings(),
                           RayOptions(ray=True, replicas=2, num_cpus=0.5, app_name="bm25"), route_prefix="/bm25"),
            "sharded": deploy(ServeOptions(index=str(sharded_index), port=port), ServerSettings(),
                              RayOptions(ray=True, replicas=1, num_cpus=0.5, app_name="sharded"), route_prefix="/sharded"),
            "hybrid": deploy(ServeOptions(index=str(sharded_hybrid_index), port=port), ServerSettings(),
                             RayOptions(ray=True, replicas=1, num_cpus=0.5, app_name="hybrid"), route_prefix="/hybrid"),
            "port": port,
            "address": ray.get_runtime_context().gcs_address,
        }
        yield urls
    finally:
        serve.shutdown()
        ray.shutdown()


def test_cli_serve_ray_joins_a_running_cluster_waits_for_every_replica_then_stops_on_sigterm(cluster, bm25_index):
    """`python -m verl_search.server --ray --ray-address ADDRESS` (= `verl-search serve --ray`) joins the
    module's running Ray instance, as on a cluster (`--ray-address auto`), and deploys at `/` beside the
    module's apps; SIGTERM removes its application only."""
    port = cluster["port"]
    command = [sys.executable, "-m", "verl_search.server", "--index", str(bm25_index), "--port", str(port), "--ray",
               "--ray-address", cluster["address"], "--app-name", "cli", "--replicas", "2", "--num-cpus", "0.5",
               "--no-page-access"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()
    seen: list[str] = []

    def said_ready() -> str | None:
        """The line saying ready, once `serve --ray` has written it."""
        while True:
            try:
                seen.append(lines.get_nowait())
            except queue.Empty:
                return None
            if "ready: " in seen[-1]:
                return seen[-1]

    try:
        ready = wait_until(said_ready, 240, "serve --ray to say ready", interval=0.2, watch={"serve --ray": process},
                           details=lambda: "".join(seen[-30:]))
        assert f"http://127.0.0.1:{port}/retrieve" in ready, ready
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
        assert health["status"] == "ready" and health["replicas"] == {"retriever": 2}  # both loaded before "ready"
        response = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["Lilu mythology"]}, timeout=30)
        assert response.status_code == 200 and len(response.json()["result"][0]) == 3
        assert httpx.post(f"http://127.0.0.1:{port}/access", json={"ids": ["12"]}, timeout=30).status_code == 404
    finally:
        process.terminate()
        try:
            returncode = process.wait(120)  # removes the app and stops its Ray instance first
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert returncode == 0
    assert "cli" not in serve.status().applications and "bm25" in serve.status().applications


@pytest.mark.parametrize("app", ["bm25", "sharded", "hybrid"])
def test_page_access_answers_as_the_plain_server(cluster, app, pages_server):
    bodies = [{"ids": ["12", "9992"]}, {"titles": ["Al-Qaeda"]}, {"ids": ["99999"]}, {"ids": []}]
    for body in bodies:
        served = httpx.post(f"{cluster[app]}/access", json=body, timeout=30)
        expected = httpx.post(f"{pages_server.url}/access", json=body, timeout=30)
        assert served.status_code == expected.status_code, (body, served.text)
        if served.status_code == 200:
            assert served.json() == expected.json(), body
        else:
            assert [d["loc"] for d in served.json()["detail"]] == [d["loc"] for d in expected.json()["detail"]]
    assert "/access" in httpx.get(f"{cluster[app]}/openapi.json", timeout=30).json()["paths"]


def test_same_wire_format_validation_and_openapi(cluster, bm25_retriever):
    url = cluster["bm25"]
    result = httpx.post(f"{url}/retrieve", json={"queries": ["Lilu mythology", ""], "topk": 3}, timeout=30).json()["result"]
    expected = bm25_retriever.search(["Lilu mythology"], 3)[0]
    assert [h["document"]["id"] for h in result[0]] == [h.passage.id for h in expected] and result[1] == []
    assert result[0][0]["score"] == pytest.approx(expected[0].score)
    bad = httpx.post(f"{url}/retrieve", json={"queries": ["a"], "top_k": 5}, timeout=30)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "top_k"
    assert httpx.post(f"{url}/retrieve", json={"queries": ["a"], "topk": 101}, timeout=30).status_code == 422
    assert "/retrieve" in httpx.get(f"{url}/openapi.json", timeout=30).json()["paths"]
    # FlashRAG's route (ReSearch's rollout) on the same replicas
    flashrag = httpx.post(f"{url}/batch_search", json={"query": ["Lilu mythology"], "top_n": 3}, timeout=30).json()
    assert [doc["id"] for doc in flashrag[0]] == [h.passage.id for h in expected]


def test_health_lists_replicas_and_requests_spread_over_them(cluster):
    seen = set()
    for _ in range(30):
        health = httpx.get(f"{cluster['bm25']}/health", timeout=30)
        assert health.status_code == 200 and health.json()["status"] == "ready"
        assert health.json()["replicas"] == {"retriever": 2}
        seen.add(health.json()["replica"])
        if len(seen) == 2:
            break
    assert len(seen) == 2, seen


def test_sharded_index_equals_unsharded_scores_and_ids(cluster, dense_retriever):
    health = httpx.get(f"{cluster['sharded']}/health", timeout=30).json()
    assert health["replicas"] == {"retriever": 1, "shard-0": 1, "shard-1": 1}
    assert health["num_passages"] == dense_retriever.num_passages
    body = {"queries": QUESTIONS + [""], "topk": 10}
    result = httpx.post(f"{cluster['sharded']}/retrieve", json=body, timeout=60).json()["result"]
    expected = dense_retriever.search(QUESTIONS + [""], 10)
    assert [[h["document"]["id"] for h in hits] for hits in result] == [[h.passage.id for h in hits] for hits in expected]
    # scores to float32 precision, not bit for bit: the replica encodes the queries in another process, whose torch
    # may use another thread count (Ray actors get OMP_NUM_THREADS=1), so GEMMs round differently in the last bit
    got = [h["score"] for hits in result for h in hits]
    assert got == pytest.approx([h.score for hits in expected for h in hits], rel=1e-5, abs=1e-6)


def test_sharded_hybrid_index_on_shard_deployments_equals_the_unsharded_hybrid(cluster, hybrid_index):
    from verl_search.retrieval.loader import resolve_index

    health = httpx.get(f"{cluster['hybrid']}/health", timeout=30).json()
    assert health["retriever"] == "hybrid" and health["replicas"] == {"retriever": 1, "shard-0": 1, "shard-1": 1}
    body = {"queries": QUESTIONS + [""], "topk": 5, "return_scores": True}
    result = httpx.post(f"{cluster['hybrid']}/retrieve", json=body, timeout=60).json()["result"]
    expected = resolve_index(hybrid_index).load().search(QUESTIONS + [""], 5)
    assert [[h["document"]["id"] for h in hits] for hits in result] == [[h.passage.id for h in hits] for hits in expected]
    got = [h["score"] for hits in result for h in hits]
    assert got == pytest.approx([h.score for hits in expected for h in hits], rel=1e-5, abs=1e-6)


def test_sharded_in_process_retriever_equals_unsharded(sharded_index, dense_retriever):
    from verl_search.retrieval.loader import resolve_index

    sharded = resolve_index(sharded_index).load()
    got = sharded.search(QUESTIONS, 7)
    expected = dense_retriever.search(QUESTIONS, 7)
    assert [[(h.passage.id, h.score) for h in q] for q in got] == [[(h.passage.id, h.score) for h in q] for q in expected]


def test_killed_replica_costs_no_failed_call(cluster):
    """64 concurrent SearchTool-client callers; one of the 2 replicas is killed once every caller has had an answer,
    and the load goes on for 4.5 s and at least 64 more answers after the kill."""
    from verl_search.tools.client import SearchClientConfig, search

    url = cluster["bm25"]
    victim = httpx.get(f"{url}/health", timeout=30).json()["replica"]
    config = SearchClientConfig(retrieval_service_url=f"{url}/retrieve", max_retries=6, deadline=30, timeout=10)

    async def caller(i: int, stop: asyncio.Event, outcomes: list, callers_answered: set):
        while not stop.is_set():
            outcomes.append(await search([QUESTIONS[i % len(QUESTIONS)]], config))
            callers_answered.add(i)

    async def load():
        outcomes: list = []
        callers_answered: set = set()
        stop = asyncio.Event()
        callers = asyncio.gather(*[caller(i, stop, outcomes, callers_answered) for i in range(64)])
        try:
            await wait_until_async(lambda: len(callers_answered) == 64, 120, "an answer to each of the 64 callers")
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            at_kill = len(outcomes)
            await asyncio.sleep(4.5)  # the load's length after the kill (not a wait for a condition)
            await wait_until_async(lambda: len(outcomes) >= at_kill + 64, 120, "64 answers after the kill")
        finally:
            stop.set()
            await callers
        return outcomes

    outcomes = asyncio.run(load())
    failed = [o.error for o in outcomes if o.error]
    assert len(outcomes) > 64 and not failed, failed[:3]
    print(f"{len(outcomes)} calls, {sum(o.attempts > 1 for o in outcomes)} retried, 0 failed")  # shown with -s
    with pytest.raises(ValueError):  # the victim really died
        ray.get_actor(victim, namespace="serve")

    def replaced():  # Serve replaces the dead replica
        health = httpx.get(f"{url}/health", timeout=30).json()
        return health["replicas"] == {"retriever": 2} and health["replica"] != victim

    wait_until(replaced, 60, "Serve to replace the killed replica (/health lists 2)", interval=1.0,
               ignore=(httpx.HTTPError, ValueError, KeyError))


def test_a_killed_shard_replica_gives_503s_never_a_partial_answer(cluster, dense_retriever):
    """4 plain callers (no retries) on the sharded app; shard-1's only replica is killed once each caller has had an
    answer, and the load goes on for 6.5 s and at least 8 more answers after the kill."""
    url = cluster["sharded"]
    expected = {q: [h.passage.id for h in hits] for q, hits in zip(QUESTIONS, dense_retriever.search(QUESTIONS, 5))}
    victim = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "sharded#shard-1#" in a["name"])

    async def caller(i: int, stop: asyncio.Event, outcomes: list, callers_answered: set):
        first = i
        async with httpx.AsyncClient(timeout=90) as http:
            while not stop.is_set():
                question = QUESTIONS[i % len(QUESTIONS)]
                response = await http.post(f"{url}/retrieve", json={"queries": [question], "topk": 5})
                ids = [h["document"]["id"] for h in response.json()["result"][0]] if response.status_code == 200 else None
                outcomes.append((time.monotonic(), response.status_code, ids == expected[question]))
                callers_answered.add(first)
                i += 4

    async def load():
        outcomes: list = []
        callers_answered: set = set()
        stop = asyncio.Event()
        callers = asyncio.gather(*[caller(i, stop, outcomes, callers_answered) for i in range(4)])
        try:
            await wait_until_async(lambda: len(callers_answered) == 4, 120, "an answer to each of the 4 callers")
            killed_at = time.monotonic()
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            at_kill = len(outcomes)
            await asyncio.sleep(6.5)  # the load's length after the kill (not a wait for a condition)
            await wait_until_async(lambda: len(outcomes) >= at_kill + 8, 180, "8 answers after the kill")
        finally:
            stop.set()
            await callers
        return outcomes, killed_at

    outcomes, killed_at = asyncio.run(load())
    statuses = [status for _, status, _ in outcomes]
    assert set(statuses) <= {200, 503}, statuses  # the lost shard is a 503, never a 500
    assert all(exact for _, status, exact in outcomes if status == 200)  # every answer is the whole index's
    print(f"{statuses.count(200)} answered, {statuses.count(503)} 503")  # shown with -s

    def answered():  # Serve replaces the replica; the app answers again
        response = httpx.post(f"{url}/retrieve", json={"queries": [QUESTIONS[0]], "topk": 5}, timeout=30)
        return response if response.status_code == 200 else None

    response = wait_until(answered, max(1.0, killed_at + 30 - time.monotonic()),
                          "Serve's replacement of the shard replica to answer (within 30 s of the kill)", interval=0.5,
                          ignore=(httpx.TransportError,))
    assert [h["document"]["id"] for h in response.json()["result"][0]] == expected[QUESTIONS[0]]  # exactly
    with pytest.raises(ValueError):  # the victim really died
        ray.get_actor(victim, namespace="serve")
