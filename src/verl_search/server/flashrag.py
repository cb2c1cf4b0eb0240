"""FlashRAG's retrieval API on the same service: `POST /search` and `POST /batch_search`.

ReSearch (Agent-RL/ReSearch, branch `re-search`) serves its retriever with FlashRAG's FastAPI script
(`scripts/serving/retriever_serving.py`) and its rollout posts to `{search_url}/batch_search`
(`src/verl/workers/rollout/vllm_rollout/vllm_rollout.py`). This module answers both routes in that wire
format, through the same micro-batcher, query cache and limits as `/retrieve`, so that code and FlashRAG's
own clients work unchanged against `verl-search serve`::

    POST /batch_search  {"query": ["q1", "q2"], "top_n": 5, "return_score": false}
        -> [[{"id": "12", "contents": "\\"Title\\"\\ntext"}, ...], [...]]
    POST /batch_search  {..., "return_score": true}
        -> [[[doc, ...], [doc, ...]], [[17.2, ...], [...]]]       (documents, then scores)
    POST /search        {"query": "q1", "top_n": 5, "return_score": false}
        -> [doc, ...]          (with "return_score": true: [[doc, ...], [17.2, ...]])

Defaults as FlashRAG's: `top_n` 10, `return_score` false. Validation as `/retrieve`'s (unknown fields, wrong
types, `top_n` above the server's `max_topk`, too many or too long queries: 422 naming the field); a blank
`/search` query is a 400, as FlashRAG answers it, and a blank query in `/batch_search` gets no hits.
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

FLASHRAG_TOP_N = 10
"""FlashRAG's default `top_n`."""


class BatchSearchRequest(BaseModel):
    """Body of `POST /batch_search` (FlashRAG's `BatchQueryRequest`)."""

    model_config = ConfigDict(extra="forbid")

    query: list[StrictStr] = Field(min_length=1, description="Query strings; a blank query gets no hits.")
    top_n: StrictInt = Field(default=FLASHRAG_TOP_N, ge=1, description="Passages per query.")
    return_score: StrictBool = Field(default=False, description="Also return the scores: [documents, scores].")


class SearchRequest(BaseModel):
    """Body of `POST /search` (FlashRAG's `QueryRequest`)."""

    model_config = ConfigDict(extra="forbid")

    query: StrictStr = Field(description="The query string; blank is a 400.")
    top_n: StrictInt = Field(default=FLASHRAG_TOP_N, ge=1, description="Passages to return.")
    return_score: StrictBool = Field(default=False, description="Also return the scores: [documents, scores].")


def encode_flashrag(hits: list, return_score: bool, single: bool) -> bytes:
    """FlashRAG's response body for `hits` (per query, best first; each with `.passage` and `.score`):
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
    hits, _ = await service.search(request.receive, batcher, cache, queries, topk)
    if hits is None:  # the client gave up
        return Response(status_code=499)
    return Response(encode_flashrag(hits, return_score, single), media_type="application/json")


async def batch_search(request: Request, batcher: MicroBatcher = Depends(ready_batcher),
                       cache: QueryCache = Depends(get_cache), settings: ServerSettings = Depends(get_settings),
                       service: RetrievalService = Depends(get_service)) -> Response:
    """Top-`top_n` passages for each query, in FlashRAG's format (module docstring). 422 on bad input; 503
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
    """Top-`top_n` passages for one query, in FlashRAG's format (module docstring). 400 for a blank query,
    422 on other bad input; 503 while the index loads or the server drains."""
    raw = await read_body(request.receive)
    if raw is None:
        return Response(status_code=499)
    body = parse_body(SearchRequest, raw)
    if not body.query.strip():
        raise HTTPException(status_code=400, detail="query is blank: send the text to search for")
    return await _answer(request, [body.query], body.top_n, body.return_score, True, batcher, cache, settings,
                         service)


def add_flashrag_routes(app: FastAPI) -> None:
    """Register `POST /search` and `POST /batch_search` on the retrieval app."""
    app.post("/batch_search", response_model=None, summary="FlashRAG's batch search",
             openapi_extra=openapi_body(BatchSearchRequest))(batch_search)
    app.post("/search", response_model=None, summary="FlashRAG's search", openapi_extra=openapi_body(SearchRequest))(search)
