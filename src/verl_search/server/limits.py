"""The service's request limits (`ServerSettings`: `max_topk`, `max_queries`, `max_query_chars`), one check for
every route that searches: a request above a limit is a 422 naming its field and the limit."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import HTTPException

from verl_search.server.settings import ServerSettings


def unprocessable(field: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors, naming the field."""
    return HTTPException(status_code=422, detail=[{"loc": ["body", field], "msg": message, "type": "value_error"}])


def check_limits(queries: Sequence[str], topk: int | None, settings: ServerSettings, queries_field: str = "queries",
                 topk_field: str = "topk") -> int:
    """The top-k of a request (the server's `default_topk` when None), within `settings`.

    Args:
        queries, topk: the request's queries and top-k.
        queries_field, topk_field: their names in the route's body (`/retrieve`: `queries`, `topk`;
            FlashRAG's routes: `query`, `top_n`), named in the error.

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
