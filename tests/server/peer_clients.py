"""The search clients of Search-R1, verl 0.7 and slime, reduced to what they send and read.

Each posts exactly its project's request body with the same HTTP library and reads the answer the
same way, so a server these work against works unchanged for their users:

* Search-R1 (`search_r1/llm_agent/generation.py` / `infer.py`): `requests.post(url, json={"queries":
  [...], "topk": 3, "return_scores": True}).json()["result"]`, then each hit's
  `["document"]["contents"]` split into the title line and the text (`_passages2string`);
* verl 0.7 (`verl/tools/utils/search_r1_like_utils.py`, `call_search_api`): the same body with headers
  `Content-Type` / `Accept: application/json`, a status in 500-504 retried, any other non-2xx an
  error, then `doc_item["document"]["contents"]`;
* slime (`examples/search-r1/local_search_server.py`, `local_search`): aiohttp, `{"queries": [query],
  "topk": top_k, "return_scores": False}`, `result.get("result", [[]])[0]`, each `item.get("contents")`.

Each returns the texts it would show the model, one list of `(title, text)` per query.
"""

from __future__ import annotations

import aiohttp
import requests


def _split(contents: str) -> tuple[str, str]:
    title = contents.split("\n")[0]
    return title, "\n".join(contents.split("\n")[1:])


def search_r1(url: str, queries: list[str], topk: int = 3) -> list[list[tuple[str, str]]]:
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    results = requests.post(url, json=payload, timeout=60).json()["result"]
    return [[_split(doc_item["document"]["contents"]) for doc_item in result] for result in results]


def verl_07(url: str, queries: list[str], topk: int = 3) -> list[list[tuple[str, str]]]:
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    response = requests.post(url, headers=headers, json=payload, timeout=30)
    if response.status_code in (500, 502, 503, 504):
        raise RuntimeError(f"verl 0.7 would retry this server error ({response.status_code}) up to 10 times")
    response.raise_for_status()
    raw_results = response.json().get("result", [])
    return [[_split(doc_item["document"]["contents"]) for doc_item in retrieval] for retrieval in raw_results]


async def slime(url: str, query: str, top_k: int = 5) -> list[tuple[str, str]]:
    payload = {"queries": [query], "topk": top_k, "return_scores": False}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=60)) as resp:
            resp.raise_for_status()
            result = await resp.json()
    return [_split(item.get("contents", "")) for item in result.get("result", [[]])[0] if isinstance(item, dict)]
