"""The `/retrieve` wire contract, shared by the server route and the `SearchTool` client (and `/access`'s,
`AccessRequest` / `AccessResponse`, shared by `server.access`, the web backend and `AccessTool`).

It is Search-R1's format (`search_r1/search/retrieval_server.py`), so existing clients keep
working::

    request:  {"queries": ["who wrote hamlet"], "topk": 3, "return_scores": true}
    response: {"result": [[{"document": {"id": "12", "contents": "\\"Hamlet\\"\\n..."}, "score": 17.2}, ...]]}

With `"return_scores": false` each hit is the document alone: `{"result": [[{"id": ..., "contents": ...}]]}`
(Search-R1's own server answers HTTP 500 there). Types are strict: `"topk": "3"` or
`"queries": "text"` is a 422, not silently coerced; unknown fields are a 422 too, so a typo such as
`"top_k"` does not fall back to the default unnoticed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator


class RetrieveRequest(BaseModel):
    """Body of `POST /retrieve`.

    Attributes:
        queries: one or more query strings (server limits: `max_queries` per request,
            `max_query_chars` characters each). A blank query gets an empty hit list.
        topk: passages per query, `1..max_topk`; `null`/omitted = the server's `default_topk`.
        return_scores: `true` (default) wraps each hit as `{"document", "score"}`; `false`
            returns the documents alone.
    """

    model_config = ConfigDict(extra="forbid")

    queries: list[StrictStr] = Field(min_length=1, description="Query strings; a blank query gets no hits.")
    topk: StrictInt | None = Field(default=None, ge=1, description="Passages per query (default: server default_topk).")
    return_scores: StrictBool = Field(default=True, description="Wrap hits as {document, score}.")


class Document(BaseModel):
    """A corpus passage: `id` and `contents` (`"\\"Title\\"\\ntext"`)."""

    id: str
    contents: str


class ScoredDocument(BaseModel):
    """A hit with `return_scores: true`."""

    document: Document
    score: float


class RetrieveResponse(BaseModel):
    """Body of a `/retrieve` answer: `result[i]` holds the hits of `queries[i]`, best first."""

    result: list[list[ScoredDocument]] | list[list[Document]]


def encode_retrieve_response(hits: Sequence[Sequence[Any]], return_scores: bool) -> bytes:
    """The JSON body of a `RetrieveResponse` for `hits` (the server's side of the contract).

    Args:
        hits: per query, the hits best first; each hit has `.passage.id`, `.passage.contents`
            and `.score` (`verl_search.retrieval.base.Hit`, duck-typed so this module imports no
            retrieval code).
        return_scores: `True`: `{"document": {"id", "contents"}, "score"}` per hit; `False`: the
            document alone.

    Returns:
        UTF-8 JSON bytes, `{"result": [[...], ...]}`. orjson, not the response model: 12x faster than
        the stdlib encoder on a 256-query answer (1.5 ms vs 18.8 ms); `RetrieveResponse` validates
        the same bytes (a test pins that).
    """
    if return_scores:
        result = [[{"document": {"id": h.passage.id, "contents": h.passage.contents}, "score": h.score} for h in row]
                  for row in hits]
    else:
        result = [[{"id": h.passage.id, "contents": h.passage.contents} for h in row] for row in hits]
    return orjson.dumps({"result": result})


def parse_retrieve_response(body: bytes | str | dict, num_queries: int) -> list[list[dict]]:
    """The documents of a `RetrieveResponse` body (the client's side of the contract).

    Args:
        body: the raw JSON body, or it already decoded.
        num_queries: how many queries the request held.

    Returns:
        per query, the documents as `{"id", "contents"}` dicts, best first (either hit shape).

    Raises:
        ValueError: the body is not JSON or has no `result` with `num_queries` lists.
    """
    payload = orjson.loads(body) if isinstance(body, (bytes, str)) else body
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list) or len(result) != num_queries:
        raise ValueError(f"expected 'result' with {num_queries} lists of documents")
    return [[hit.get("document", hit) for hit in row] for row in result]


#: the fields of an `/access` request, each a list of strings; exactly one is given
ACCESS_FIELDS = ("ids", "titles", "urls")


class AccessRequest(BaseModel):
    """Body of `POST /access`: exactly one of `ids`, `titles` or `urls`, a non-empty list of strings.

    * `ids`: passage ids as `/retrieve` returns them (`document.id`); each answer is that passage.
      On the web backend an id is the page's URL, so `ids` and `urls` are the same.
    * `titles`: corpus titles (quotes, case and spacing do not matter); each answer is the whole
      page: every passage of that title, in corpus order. Index backend only.
    * `urls`: web pages to read (web backend only), as ASearcher's `/access` takes them.
    """

    model_config = ConfigDict(extra="forbid")

    ids: list[StrictStr] | None = Field(default=None, min_length=1, description="Passage ids (web: URLs).")
    titles: list[StrictStr] | None = Field(default=None, min_length=1, description="Page titles (index backend).")
    urls: list[StrictStr] | None = Field(default=None, min_length=1, description="Page URLs (web backend).")

    @model_validator(mode="after")
    def _exactly_one(self) -> "AccessRequest":
        given = [name for name in ACCESS_FIELDS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f'give exactly one of "ids", "titles" or "urls" (a list of strings); got {given or "none"}')
        return self

    @property
    def field(self) -> str:
        """The name of the field given."""
        return next(name for name in ACCESS_FIELDS if getattr(self, name) is not None)

    @property
    def values(self) -> list[str]:
        return getattr(self, self.field)


class PageDocument(BaseModel):
    """One page of an `/access` answer.

    Attributes:
        id: the first passage's id (web: the URL).
        title: the title, without quotes.
        contents: `"Title"` on the first line, then the text (the passages of a page one per line).
        url: the page's URL (web backend), else None.
        passage_ids: the ids of the passages joined in `contents`, in order.
    """

    id: str
    title: str
    contents: str
    url: str | None = None
    passage_ids: list[str] = Field(default_factory=list)


class AccessResponse(BaseModel):
    """Body of an `/access` answer: `result[i]` is the page of the request's `i`-th value."""

    result: list[PageDocument]


def parse_access_response(body: bytes | str | dict, num_values: int) -> list[dict]:
    """The pages of an `AccessResponse` body (the client's side), as `PageDocument` dicts.

    Raises:
        ValueError: the body is not JSON, or has no `result` with `num_values` pages.
    """
    payload = orjson.loads(body) if isinstance(body, (bytes, str)) else body
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list) or len(result) != num_values:
        raise ValueError(f"expected 'result' with {num_values} pages")
    return [PageDocument.model_validate(page).model_dump() for page in result]


class HealthResponse(BaseModel):
    """Body of `GET /health`: `status` is `loading`, `ready`, `failed` or `draining` (shutting down
    after SIGTERM); HTTP 503 unless ready. `in_flight`: search requests (`/retrieve`, `/batch_search`,
    `/search`) being answered now.

    Counters since start: `batches` (retriever calls), `queries` (queries searched, in-batch
    duplicates included), `duplicates` (queries answered by another copy in the same batch),
    `search_seconds` (seconds inside the retriever); with the query cache on (`--cache-mb`),
    `cache_hits`, `cache_misses`, `cache_entries`, `cache_mb` (estimated size, MiB),
    `cache_evictions` (all `None` when the cache is off). The web backend (`server.web.service`) fills the
    `cache_*` fields from its on-disk cache and adds `upstream_calls`, `upstream_retries`,
    `upstream_failures` and `coalesced`."""

    status: str
    retriever: str | None = None
    num_passages: int | None = None
    error: str | None = None
    batches: int = 0
    queries: int = 0
    in_flight: int = 0
    duplicates: int = 0
    search_seconds: float = 0.0
    cache_hits: int | None = None
    cache_misses: int | None = None
    cache_entries: int | None = None
    cache_mb: float | None = None
    cache_evictions: int | None = None
