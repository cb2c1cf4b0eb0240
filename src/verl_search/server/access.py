"""`POST /access`: read a passage whole by id, or a whole page by title, from the served corpus.

An agent that saw a snippet in a search result reads the page it came from (ASearcher's `access`
tool, which posts `{"urls": [...]}` to its local server's `/access`). The request and answer are
`server.schemas.AccessRequest` / `AccessResponse`; the same error rules as `/retrieve`:

* 422 for a malformed body, more values than `max_queries`, a value longer than `max_query_chars`,
  a blank value, or a field this backend does not answer (`urls` on a local corpus);
* 404 naming each id or title the corpus does not hold (`loc` = `["body", "ids", i]`);
* 503 with `Retry-After` while the index loads or the server drains.

The web backend answers the same route from a page reader (`server.web.service`), with `check_access_request`
and `encode_access_response` from here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import Response

from verl_search.server.schemas import AccessRequest, AccessResponse
from verl_search.server.backend import get_settings, ready_service
from verl_search.server.service import RetrievalService
from verl_search.server.settings import ServerSettings

if TYPE_CHECKING:
    from verl_search.retrieval.pages import Page, PageLookup

ACCESS_PATH = "/access"


@dataclass
class CorpusPages:
    """Where the `/access` route finds the served corpus's `PageLookup`: set by the loader once the
    index is in memory (`server.serve`); None until then (the route answers 503). Held by the app's
    `RetrievalService` (`pages`)."""

    lookup: "PageLookup | None" = None


def _error(field: str, position: int | None, message: str, kind: str = "value_error") -> dict:
    loc = ["body", field] if position is None else ["body", field, position]
    return {"loc": loc, "msg": message, "type": kind}


def check_access_request(body: AccessRequest, settings: ServerSettings, accepted: tuple[str, ...]) -> list[str]:
    """The values of a valid `/access` body, stripped.

    Args:
        body: the parsed request.
        settings: the server's limits (`max_queries` values, `max_query_chars` characters each).
        accepted: the fields this backend answers (`("ids", "titles")` or `("ids", "urls")`).

    Raises:
        HTTPException: 422 naming the field (and position) of the first broken rule.
    """
    field, values = body.field, body.values
    if field not in accepted:
        raise HTTPException(422, [_error(field, None, f'this server reads pages by {" or ".join(accepted)}, '
                                                          f'not by {field}')])
    if len(values) > settings.max_queries:
        raise HTTPException(422, [_error(field, None, f"{len(values)} values in one request; at most "
                                                          f"max_queries={settings.max_queries}: split the request")])
    for position, value in enumerate(values):
        if len(value) > settings.max_query_chars:
            raise HTTPException(422, [_error(field, position, f"{field}[{position}] has {len(value)} characters; "
                                                                   f"at most max_query_chars={settings.max_query_chars}")])
        if not value.strip():
            raise HTTPException(422, [_error(field, position, f"{field}[{position}] is blank")])
    return [value.strip() for value in values]


def not_found(field: str, values: list[str], missing: list[int], where: str) -> HTTPException:
    """A 404 naming each missing value: `{"detail": [{"loc": ["body", field, i], "msg", "type": "not_found"}]}`."""
    noun = {"ids": "passage with id", "titles": "page titled", "urls": "page at"}[field]
    return HTTPException(404, [_error(field, i, f"no {noun} {values[i]!r} {where}", "not_found") for i in missing])


def encode_access_response(pages: list[dict]) -> Response:
    """The JSON answer of `/access` for `pages` (`PageDocument` dicts, one per requested value)."""
    return Response(orjson.dumps({"result": pages}), media_type="application/json")


def page_document(page: "Page") -> dict:
    """A corpus `Page` as a `PageDocument` dict."""
    return {"id": page.id, "title": page.title, "contents": page.contents, "url": None,
            "passage_ids": [p.id for p in page.passages]}


def read_pages(lookup: "PageLookup", field: str, values: list[str]) -> list:
    """The `Page` of each value (None where the corpus holds none); `field` is `ids` or `titles`."""
    read = lookup.by_id if field == "ids" else lookup.by_title
    return [read(value) for value in values]


async def get_page_lookup(service: RetrievalService = Depends(ready_service)) -> "PageLookup":
    """The served corpus's `PageLookup` (`service.pages`, filled by the loader).

    Raises:
        HTTPException: 503 + `Retry-After` as `ready_service`, or while the title table is not loaded yet.
    """
    lookup = service.pages.lookup if service.pages is not None else None
    if lookup is None:
        raise HTTPException(503, f"index {service.status}; retry after /health is ready", {"Retry-After": "1"})
    return lookup


async def access(body: AccessRequest, lookup: "PageLookup" = Depends(get_page_lookup),
                 settings: ServerSettings = Depends(get_settings)) -> Response:
    """Passages by `ids`, or whole pages by `titles` (every passage of the title, in corpus order).
    404 names each id or title the corpus does not hold; 422 on bad input; 503 while loading."""
    values = check_access_request(body, settings, ("ids", "titles"))
    found = await asyncio.to_thread(read_pages, lookup, body.field, values)
    missing = [i for i, page in enumerate(found) if page is None]
    if missing:
        raise not_found(body.field, values, missing, "in this corpus")
    return encode_access_response([page_document(page) for page in found])


def add_access_route(app: FastAPI) -> None:
    """Add `POST /access` to a `create_app` app over an index whose service holds the corpus `pages`."""
    app.post(ACCESS_PATH, response_model=AccessResponse, responses={404: {}, 422: {}, 503: {}})(access)
