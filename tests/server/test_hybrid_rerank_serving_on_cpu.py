"""Hybrid and reranked servers answer existing clients unchanged.

`verl-search serve` runs in a child process over a real hybrid index of the mini corpus (built by
`build_index --retriever hybrid`, its vectors taken from the MiniLM index with `--from-faiss`) with
a real CrossEncoder (conftest's tiny random one: no weights can be downloaded here). The clients'
request bodies are posted exactly as they send them:

* Search-R1 (`search_r1/llm_agent/generation.py`, `_batch_search`): `requests.post(url, json=
  {"queries": [...], "topk": 3, "return_scores": True})`, then `_passages2string` reads
  `doc["document"]["contents"]`, title = first line;
* verl 0.7 (`verl/tools/utils/search_r1_like_utils.py`, `call_search_api`): the same body with
  `Content-Type` and `Accept: application/json` headers, and the same `document.contents` reading.
"""

import asyncio

import httpx
import pytest
import requests

from tests.conftest import MINI_CORPUS
from verl_search.retrieval.index_builder import BuildOptions, build_index
from verl_search.tools.local_server import SubprocessServer

QUERIES = ["Who directed Inception?", "Lilu mythology masculine Akkadian spirit"]


@pytest.fixture(scope="module")
def hybrid_index(index_root, dense_index, minilm_path):
    out = index_root / "mini_hybrid_minilm"
    if not (out / "manifest.json").is_file():
        build_index(MINI_CORPUS, out, BuildOptions(retriever="hybrid", encoder=minilm_path, from_faiss=str(dense_index),
                                                   overwrite=True))
    return out


@pytest.fixture(scope="module")
def hybrid_server(hybrid_index):
    with SubprocessServer(["--index", str(hybrid_index)]) as server:
        yield server


@pytest.fixture(scope="module")
def reranked_server(hybrid_index, tiny_cross_encoder):
    with SubprocessServer(["--index", str(hybrid_index), "--reranker", str(tiny_cross_encoder),
                           "--rerank-candidates", "5"]) as server:
        yield server


def search_r1_client(url: str, queries: list[str]) -> list[str]:
    """Search-R1's `_batch_search` + `_passages2string`, as they are."""
    results = requests.post(url, json={"queries": queries, "topk": 3, "return_scores": True}).json()["result"]
    return [_passages2string(result) for result in results]


def verl_07_client(url: str, queries: list[str]) -> list[str]:
    """verl 0.7's `call_search_api` body and headers, and its `_passages2string`."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    response = requests.post(url, headers=headers, json={"queries": queries, "topk": 3, "return_scores": True},
                             timeout=30)
    response.raise_for_status()
    return [_passages2string(result) for result in response.json().get("result", [])]


def _passages2string(retrieval_result) -> str:
    reference = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["document"]["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
    return reference


@pytest.mark.parametrize("client", [search_r1_client, verl_07_client])
@pytest.mark.parametrize("which", ["hybrid", "reranked"])
def test_existing_clients_work_unchanged(client, which, request):
    server = request.getfixturevalue(f"{which}_server")
    health = httpx.get(f"{server.url}/health", timeout=30).json()
    assert health["retriever"] == {"hybrid": "hybrid", "reranked": "hybrid+rerank"}[which]
    inception, lilu = client(f"{server.url}/retrieve", QUERIES)
    assert inception.count("Doc ") == 3 and lilu.count("Doc ") == 3
    if which == "hybrid":  # the random cross-encoder puts any of the 5 candidates first
        assert lilu.startswith('Doc 1(Title: "Lilu (mythology)")')


def test_reranked_server_returns_cross_encoder_scores_and_batches_across_requests(reranked_server):
    url = f"{reranked_server.url}/retrieve"
    alone = {q: httpx.post(url, json={"queries": [q], "topk": 3}, timeout=60).json()["result"][0] for q in QUERIES}
    scores = [hit["score"] for hit in alone[QUERIES[0]]]
    assert scores == sorted(scores, reverse=True) and not all(0 < s < 0.05 for s in scores)  # not RRF's scores
    plain = httpx.post(url, json={"queries": QUERIES, "topk": 3, "return_scores": False}, timeout=60).json()["result"]
    assert plain == [[hit["document"] for hit in alone[q]] for q in QUERIES]
    before = httpx.get(f"{reranked_server.url}/health").json()

    async def burst():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(url, json={"queries": [QUERIES[i % 2]], "topk": 3})
                                          for i in range(24)))

    answers = asyncio.run(burst())
    after = httpx.get(f"{reranked_server.url}/health").json()
    for i, answer in enumerate(answers):  # the same passages, in the same order; scores up to float noise (padding)
        hits, expected = answer.json()["result"][0], alone[QUERIES[i % 2]]
        assert [h["document"] for h in hits] == [h["document"] for h in expected], i
        assert [h["score"] for h in hits] == pytest.approx([h["score"] for h in expected], abs=1e-4)
    assert after["batches"] - before["batches"] < 24  # requests shared retriever (and cross-encoder) calls
