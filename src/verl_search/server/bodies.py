"""Request bodies read and validated by the routes themselves, not by FastAPI's body parameters.

`parse_body(Model, raw)` is what FastAPI does with a `body: Model` parameter, in one pydantic-core call
instead of `json.loads`, then validation, then the dependency machinery: about 15% less server CPU per
request (`benchmarks/bench_http_overhead.py`). `/retrieve`, `/batch_search` and `/search` read their
bodies this way: with FastAPI body parameters, FlashRAG's routes answered 0.93 times `/retrieve`'s queries/s at
256 clients (`benchmarks/bench_flashrag_routes.py`, 2026-11-25). `openapi_body(Model)` documents the schema
such a route reads.
"""

from __future__ import annotations

from typing import TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

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
