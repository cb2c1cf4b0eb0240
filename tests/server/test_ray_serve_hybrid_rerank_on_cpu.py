"""`serve --ray` over a hybrid index with a reranker, on a real local Ray instance (CPU).

One Ray instance for the module. `python -m verl_search.server --ray --ray-address ADDRESS --reranker DIR
--rerank-candidates 5` (= `verl-search serve --ray ...`) joins it and deploys one replica serving
tests/server/conftest.py's hybrid index (BM25 + MiniLM) reranked by conftest's tiny random CrossEncoder (no
cross-encoder weights can be downloaded here; its scores mean nothing, but they are real
`CrossEncoder.predict` scores, and the served order must be theirs).
"""

from __future__ import annotations

import httpx
import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
from ray import serve  # noqa: E402

from tests.server import peer_clients  # noqa: E402
from verl_search.retrieval.base import Passage  # noqa: E402
from verl_search.retrieval.loader import resolve_index  # noqa: E402
from verl_search.retrieval.rerank import pair_text  # noqa: E402
from verl_search.server.schemas import RetrieveResponse  # noqa: E402
from verl_search.server.local import SubprocessServer  # noqa: E402

CANDIDATES = 5
QUERIES = ["Who directed Inception?", "Lilu mythology masculine Akkadian spirit", "capital of France"]


@pytest.mark.parametrize("flags, message", [
    (["--fusion", "weighted"], "apply to a hybrid index"),
    (["--rerank-candidates", "5"], "need --reranker DIR"),
    (["--reranker", "/nonexistent"], "is not a model folder"),
])
def test_serve_ray_refuses_flags_its_index_cannot_use_before_ray_starts(bm25_index, flags, message, caplog):
    from verl_search import cli

    assert cli.main(["serve", "--index", str(bm25_index), "--ray", *flags]) == 2
    assert message in caplog.text and not ray.is_initialized()


@pytest.fixture(scope="module")
def ray_server(hybrid_index, tiny_cross_encoder, tmp_path_factory):
    """The CLI's `serve --ray` with `--reranker`, joined to this module's Ray instance (2 logical CPUs)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    log = tmp_path_factory.mktemp("ray_serve_hybrid") / "serve.log"
    args = ["--index", str(hybrid_index), "--reranker", str(tiny_cross_encoder),
            "--rerank-candidates", str(CANDIDATES), "--ray", "--ray-address", ray.get_runtime_context().gcs_address,
            "--num-cpus", "0.5", "--app-name", "hybrid-rerank"]
    try:
        with SubprocessServer(args, ready_timeout=300, log_path=str(log)) as server:
            yield server
    except Exception:
        print(log.read_text(errors="replace")[-4000:])  # the child's log, shown when the fixture fails
        raise
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def hybrid_retriever(hybrid_index):
    """The same hybrid index, without its rerank stage, in this process (the cross-encoder's candidates)."""
    return resolve_index(hybrid_index).load()


def test_health_says_hybrid_reranked_and_answers_are_search_r1s_format(ray_server, hybrid_retriever):
    health = httpx.get(f"{ray_server.url}/health", timeout=30).json()
    assert health["status"] == "ready" and health["retriever"] == "hybrid+rerank"
    assert health["num_passages"] == hybrid_retriever.num_passages and health["replicas"] == {"retriever": 1}
    response = httpx.post(f"{ray_server.url}/retrieve", json={"queries": QUERIES[:2] + [""], "topk": 3,
                                                              "return_scores": True}, timeout=60)
    assert response.status_code == 200
    RetrieveResponse.model_validate_json(response.content)
    result = response.json()["result"]
    assert [len(hits) for hits in result] == [3, 3, 0]  # a blank query: no hits
    for hit in result[0] + result[1]:
        assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
    # Search-R1's own client reads exactly these passages, in this order
    assert peer_clients.search_r1(f"{ray_server.url}/retrieve", QUERIES[:2]) == \
        [[tuple(hit["document"]["contents"].split("\n", 1)) for hit in hits] for hits in result[:2]]


def test_order_and_scores_are_the_cross_encoders(ray_server, hybrid_retriever, tiny_cross_encoder):
    from sentence_transformers import CrossEncoder

    direct = CrossEncoder(str(tiny_cross_encoder), device="cpu", local_files_only=True)
    url = f"{ray_server.url}/retrieve"
    served = httpx.post(url, json={"queries": QUERIES, "topk": CANDIDATES}, timeout=60).json()["result"]
    top3 = httpx.post(url, json={"queries": QUERIES, "topk": 3}, timeout=60).json()["result"]
    reordered = 0
    for query, hits, first_three, candidates in zip(QUERIES, served, top3, hybrid_retriever.search(QUERIES, CANDIDATES)):
        # topk = --rerank-candidates: every candidate comes back; they are the hybrid retriever's
        assert sorted(h["document"]["id"] for h in hits) == sorted(c.passage.id for c in candidates)
        passages = [Passage(h["document"]["id"], h["document"]["contents"]) for h in hits]
        scores = direct.predict([(query, pair_text(p)) for p in passages], show_progress_bar=False)
        assert len(set(scores.round(4).tolist())) == len(hits)  # distinct scores: the order is well defined
        assert scores.tolist() == sorted(scores.tolist(), reverse=True)  # served in the cross-encoder's order
        assert [h["score"] for h in hits] == pytest.approx(scores.tolist(), abs=1e-4)
        assert first_three == hits[:3]
        reordered += [h["document"]["id"] for h in hits] != [c.passage.id for c in candidates]
    assert reordered  # the random cross-encoder does reorder the fused ranking


def test_bad_requests_get_4xx(ray_server):
    url = f"{ray_server.url}/retrieve"
    too_many = httpx.post(url, json={"queries": ["a"], "topk": 101}, timeout=30)
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["loc"] == ["body", "topk"]
    assert httpx.post(url, json={"queries": "Lilu"}, timeout=30).status_code == 422
    assert httpx.post(url, content=b"not json", headers={"content-type": "application/json"},
                      timeout=30).status_code == 422
    # topk above --rerank-candidates is not an error: topk passages are retrieved and reranked
    assert len(httpx.post(url, json={"queries": [QUERIES[0]], "topk": 8}, timeout=60).json()["result"][0]) == 8


def test_a_sharded_hybrid_index_searches_the_shards_it_is_given(sharded_hybrid_index, hybrid_retriever):
    """`IndexSpec.load(search_shards)`, as a Ray front replica calls it with Serve handles
    (`ray_serve.remote_shards`): the dense half of a sharded hybrid index searches through that fan-out
    (here a recording one over the shards in this process, so the batch's calls can be counted; on real
    shard deployments: tests/server/test_ray_serve_on_cpu.py) and the fused hits equal the unsharded index's."""
    from verl_search.retrieval.shards import ShardedDenseRetriever

    spec = resolve_index(sharded_hybrid_index)
    in_process = ShardedDenseRetriever.in_process([spec.load_shard(i) for i in range(len(spec.shards))])
    calls = []

    def fan_out(vectors, topk):
        calls.append(len(vectors))
        return in_process(vectors, topk)

    got = spec.load(search_shards=fan_out).search(QUERIES, 5)
    assert calls == [len(QUERIES)]  # one fan-out for the batch
    expected = hybrid_retriever.search(QUERIES, 5)
    assert [[h.passage.id for h in q] for q in got] == [[h.passage.id for h in q] for q in expected]
