"""The `/retrieve` wire contract, shared by the server route and the `SearchTool` client.

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

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


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


class HealthResponse(BaseModel):
    """Body of `GET /health`: `status` is `loading`, `ready` or `failed` (HTTP 503 unless ready)."""

    status: str
    retriever: str | None = None
    num_passages: int | None = None
    error: str | None = None
    batches: int = 0
    queries: int = 0
