"""ReSearch's retrieval API on the same service: `POST /search` and `POST /batch_search`.

The API is ReSearch's own (Agent-RL/ReSearch, branch `re-search`, commit 4bdb872): its
`scripts/serving/retriever_serving.py` serves its vendored FlashRAG retriever with FastAPI, and its rollout posts
to `{search_url}/batch_search` (`src/verl/workers/rollout/vllm_rollout/vllm_rollout.py`). Upstream FlashRAG
(RUC-NLPIR/FlashRAG) has no HTTP server: only the retriever classes behind it are FlashRAG's. This module
answers both routes in that wire format, through the same micro-batcher, query cache and limits as `/retrieve`,
so ReSearch's code works unchanged against `verl-search serve`::

    POST /batch_search  {"query": ["q1", "q2"], "top_n": 5, "return_score": false}
        -> [[{"id": "12", "contents": "\\"Title\\"\\ntext"}, ...], [...]]
    POST /batch_search  {..., "return_score": true}
        -> [[[doc, ...], [doc, ...]], [[17.2, ...], [...]]]       (documents, then scores)
    POST /search        {"query": "q1", "top_n": 5, "return_score": false}
        -> [doc, ...]          (with "return_score": true: [[doc, ...], [17.2, ...]])

As ReSearch's retriever answers (`retrieval.fill.search_filled`): `min(top_n, passages)` documents for every
query; with BM25 that includes passages of score 0 when fewer hold a query word (bm25s `retrieve(k=top_n)`),
and a blank query inside `/batch_search` gets `top_n` passages too (BM25: score 0 everywhere, in bm25s' order;
a plain dense index: the empty string encoded and searched). `/retrieve` keeps Search-R1's behaviour (fewer
BM25 hits, none for a blank query).

Defaults as ReSearch's `QueryRequest` / `BatchQueryRequest`: `top_n` 10, `return_score` false. Validation as
`/retrieve`'s (unknown fields, wrong types, `top_n` above the server's `max_topk`, too many or too long
queries: 422 naming the field); a blank `/search` query is a 400, as ReSearch's server answers it.
"""

from __future__ import annotations

import orjson
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from verl_search.server.backend import get_service, get_settings
from verl_search.server.batcher import MicroBatcher
from verl_search.server.cache import QueryCache
from verl_search.server.service import RetrievalService, get_cache, ready_batcher
from verl_search.server.settings import ServerSettings
from verl_search.server.validation import check_limits, openapi_body, parse_body, read_body

RESEARCH_TOP_N = 10
"""ReSearch's default `top_n` (`retriever_serving.py`, `QueryRequest`)."""


class BatchSearchRequest(BaseModel):
    """Body of `POST /batch_search` (ReSearch's `BatchQueryRequest`, `scripts/serving/retriever_serving.py`)."""

    model_config = ConfigDict(extra="forbid")

    query: list[StrictStr] = Field(min_length=1, description="Query strings; a blank query gets top_n passages, as ReSearch's.")
    top_n: StrictInt = Field(default=RESEARCH_TOP_N, ge=1, description="Passages per query.")
    return_score: StrictBool = Field(default=False, description="Also return the scores: [documents, scores].")


class SearchRequest(BaseModel):
    """Body of `POST /search` (ReSearch's `QueryRequest`, `scripts/serving/retriever_serving.py`)."""

    model_config = ConfigDict(extra="forbid")

    query: StrictStr = Field(description="The query string; blank is a 400.")
    top_n: StrictInt = Field(default=RESEARCH_TOP_N, ge=1, description="Passages to return.")
    return_score: StrictBool = Field(default=False, description="Also return the scores: [documents, scores].")


def encode_research(hits: list, return_score: bool, single: bool) -> bytes:
    """ReSearch's response body for `hits` (per query, best first; each with `.passage` and `.score`):
    documents per query, or `[documents, scores]`; `single`: the one query's lists, not nested."""
    documents = [[{"id": h.passage.id, "contents": h.passage.contents} for h in row] for row in hits]
    scores = [[h.score for h in row] for row in hits]
    if single:
        documents, scores = documents[0], scores[0]
    return orjson.dumps([documents, scores] if return_score else documents, option=orjson.OPT_SERIALIZE_NUMPY)


async def _answer(request: Request, queries: list[str], top_n: int, return_score: bool, single: bool,
                  batcher: MicroBatcher, cache: QueryCache, settings: ServerSettings,
                  service: RetrievalService) -> Response:
    topk = check_limits(queries, top_n, settings, queries_field="query", topk_field="top_n")
    hits, _ = await service.search(request.receive, batcher, cache, queries, topk, fill=True)
    if hits is None:  # the client gave up
        return Response(status_code=499)
    return Response(encode_research(hits, return_score, single), media_type="application/json")


async def batch_search(request: Request, batcher: MicroBatcher = Depends(ready_batcher),
                       cache: QueryCache = Depends(get_cache), settings: ServerSettings = Depends(get_settings),
                       service: RetrievalService = Depends(get_service)) -> Response:
    """Top-`top_n` passages for each query, in ReSearch's format (module docstring). 422 on bad input; 503
    while the index loads or the server drains."""
    raw = await read_body(request.receive)
    if raw is None:  # the client gave up before sending its body
        return Response(status_code=499)
    body = parse_body(BatchSearchRequest, raw)
    return await _answer(request, list(body.query), body.top_n, body.return_score, False, batcher, cache, settings,
                         service)


async def search(request: Request, batcher: MicroBatcher = Depends(ready_batcher),
                 cache: QueryCache = Depends(get_cache), settings: ServerSettings = Depends(get_settings),
                 service: RetrievalService = Depends(get_service)) -> Response:
    """Top-`top_n` passages for one query, in ReSearch's format (module docstring). 400 for a blank query,
    422 on other bad input; 503 while the index loads or the server drains."""
    raw = await read_body(request.receive)
    if raw is None:
        return Response(status_code=499)
    body = parse_body(SearchRequest, raw)
    if not body.query.strip():
        raise HTTPException(status_code=400, detail="query is blank: send the text to search for")
    return await _answer(request, [body.query], body.top_n, body.return_score, True, batcher, cache, settings,
                         service)


def add_research_routes(app: FastAPI) -> None:
    """Register ReSearch's `POST /search` and `POST /batch_search` on the retrieval app."""
    app.post("/batch_search", response_model=None, summary="ReSearch's batch search",
             openapi_extra=openapi_body(BatchSearchRequest))(batch_search)
    app.post("/search", response_model=None, summary="ReSearch's search", openapi_extra=openapi_body(SearchRequest))(search)
