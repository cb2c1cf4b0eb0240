"""Requests in, errors out: the one home of request validation for every route of the retrieval service
(`/retrieve`, ReSearch's `/batch_search` and `/search`, the web backend's routes) and of its error responses.

* Bodies are read and validated by the routes themselves, not by FastAPI's body parameters: `parse_body(Model,
  raw)` is what FastAPI does with a `body: Model` parameter, in one pydantic-core call instead of `json.loads`,
  then validation, then the dependency machinery: about 15% less server CPU per request
  (`benchmarks/bench_http_overhead.py`); with FastAPI body parameters, ReSearch's routes answered 0.93 times
  `/retrieve`'s queries/s at 256 clients (`benchmarks/bench_flashrag_routes.py`, 2026-11-25). `openapi_body(Model)`
  documents the schema such a route reads.
* The service's limits (`ServerSettings`: `max_topk`, `max_queries`, `max_query_chars`), one check for every
  route that searches (`check_limits`): a request above a limit is a 422 naming its field and the limit.
* Errors: a 422 is never turned into a 500 by what it echoes (`validation_error`: NaN, lone surrogates and 1 MB
  strings are made safe); a retriever that cannot answer now (a lost shard) is a 503 with `Retry-After`
  (`retriever_unavailable`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TypeVar

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from verl_search.retrieval.base import RetrieverUnavailableError
from verl_search.server.schemas import RetrieveRequest
from verl_search.server.settings import ServerSettings

Model = TypeVar("Model", bound=BaseModel)


async def read_body(receive) -> bytes | None:
    """The whole request body from ASGI `receive`, or None if the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_body(model: type[Model], body: bytes) -> Model:
    """`body` (JSON bytes) validated as `model`.

    Raises:
        RequestValidationError: a 422 shaped like FastAPI's own (`loc` starts with `"body"`), for bad JSON
            or a body that breaks `model`'s contract.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            error["loc"] = ("body", *error["loc"])
            if isinstance(error.get("input"), bytes):  # bad JSON echoes the raw body, maybe not UTF-8
                error["input"] = error["input"].decode("utf-8", "replace")
        raise RequestValidationError(errors) from None


def openapi_body(model: type[BaseModel]) -> dict:
    """The OpenAPI `requestBody` of a route that reads `model` itself (`openapi_extra=`)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


def unprocessable(field: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors, naming the field."""
    return HTTPException(status_code=422, detail=[{"loc": ["body", field], "msg": message, "type": "value_error"}])


def check_limits(queries: Sequence[str], topk: int | None, settings: ServerSettings, queries_field: str = "queries",
                 topk_field: str = "topk") -> int:
    """The top-k of a request (the server's `default_topk` when None), within `settings`.

    Args:
        queries, topk: the request's queries and top-k.
        queries_field, topk_field: their names in the route's body (`/retrieve`: `queries`, `topk`;
            ReSearch's routes: `query`, `top_n`), named in the error.

    Raises:
        HTTPException: 422 naming the field when the top-k, the number of queries or a query's length is
            above the server's limit.
    """
    topk = settings.default_topk if topk is None else topk
    if topk > settings.max_topk:
        raise unprocessable(topk_field, f"{topk_field} is {topk}; this server allows at most max_topk={settings.max_topk}")
    if len(queries) > settings.max_queries:
        raise unprocessable(queries_field, f"{len(queries)} queries in one request; at most "
                                           f"max_queries={settings.max_queries}: split the request")
    for position, query in enumerate(queries):
        if len(query) > settings.max_query_chars:
            raise unprocessable(queries_field, f"{queries_field}[{position}] has {len(query)} characters; at most "
                                               f"max_query_chars={settings.max_query_chars}")
    return topk


def check_retrieve_limits(body, settings: ServerSettings) -> int:
    """`check_limits` of a parsed `/retrieve` body (`schemas.RetrieveRequest`)."""
    return check_limits(body.queries, body.topk, settings)


#: the OpenAPI request body of `/retrieve` (the route reads the body itself, see `parse_retrieve_request`)
RETRIEVE_REQUEST_OPENAPI = openapi_body(RetrieveRequest)


def parse_retrieve_request(body: bytes) -> RetrieveRequest:
    """A `/retrieve` body, validated by pydantic straight from the JSON bytes (`parse_body`).

    Raises:
        RequestValidationError: a 422 shaped like FastAPI's own, for bad JSON or a broken contract.
    """
    return parse_body(RetrieveRequest, body)


def _json_safe(value, limit: int = 200):
    """`value` made encodable as strict ASCII JSON: non-finite floats become strings, long strings and
    containers are cut to `limit` characters / items (a 1 MB query is not echoed back in a 422)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "..."
    if isinstance(value, dict):
        return {_json_safe(str(k), limit): _json_safe(v, limit) for k, v in list(value.items())[:limit]}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, limit) for v in list(value)[:limit]]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _json_safe(repr(value), limit)


async def retriever_unavailable(request: Request | None, exc: RetrieverUnavailableError) -> Response:
    """503 with `Retry-After: 1` and the error in `detail`: a part of the retriever (a shard) cannot answer
    now; the client retries (`tools.client` does), and no partial answer is given."""
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})


async def validation_error(request: Request | None, exc: RequestValidationError) -> Response:
    """FastAPI's 422 body (`{"detail": [{"loc", "msg", "type", "input", ...}]}`), but never a 500:
    the echoed input may hold NaN, infinities or lone surrogates, which FastAPI's own handler
    cannot encode. Encoded as ASCII JSON (surrogates as `\\udXXX` escapes)."""
    detail = _json_safe(jsonable_encoder(exc.errors(), custom_encoder={float: lambda f: f}))
    return Response(json.dumps({"detail": detail}, ensure_ascii=True), status_code=422, media_type="application/json")
