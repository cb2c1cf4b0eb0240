"""A local stand-in for Serper's search API and Jina's page reader, on 127.0.0.1.

The paid APIs cannot be called here (no key, no internet), so the web backend's tests run against
this fake. It follows the documented formats: `POST /search` with header `X-API-KEY` and JSON body
`{"q", "num"}` answers `{"searchParameters": {...}, "organic": [{"title", "link", "snippet",
"position"}, ...]}`; `GET /reader/<page URL>` with `Accept: application/json` (and an optional
`Authorization: Bearer <key>`) answers `{"code": 200, "status": 20000, "data": {"title", "url",
"content"}}`. A wrong key is a 403, as Serper answers.

`FakeWeb.script` makes the next calls for a query (or page URL) misbehave, one entry per call:
an HTTP status (`429`, `500`, ...), `"slow"` (sleep `slow_seconds`, then answer), `"not json"`,
`"wrong json"` (JSON without the expected fields) or `"ok"`. Every call is counted, with its time and the
most search calls seen in flight at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

SEARCH_KEY = "test-serper-key-0123456789"
READER_KEY = "test-jina-key-9876543210"


class FakeWeb:
    """The fake's state: `calls` per query or page URL, `script` of misbehaviours, `bodies` seen."""

    def __init__(self, results_per_query: int = 20, slow_seconds: float = 5.0):
        self.calls: Counter = Counter()
        self.script: dict[str, list] = defaultdict(list)
        self.bodies: list[dict] = []
        self.results_per_query, self.slow_seconds = results_per_query, slow_seconds
        self.in_flight = self.max_in_flight = 0
        self.call_times: list[float] = []  # time.monotonic() of each search call

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    async def _misbehave(self, key: str) -> Response | None:
        action = self.script[key].pop(0) if self.script[key] else "ok"
        if action == "slow":
            await asyncio.sleep(self.slow_seconds)
        elif action == "not json":
            return Response(b"<html>502 Bad Gateway</html>", media_type="text/html")
        elif action == "wrong json":
            return JSONResponse({"message": "unexpected"})
        elif isinstance(action, int):
            return JSONResponse({"message": f"status {action}"}, status_code=action,
                                headers={"Retry-After": "0"} if action == 429 else None)
        return None

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health():
            return {"status": "ready"}

        @app.post("/search")
        async def search(request: Request):
            if request.headers.get("x-api-key") != SEARCH_KEY:
                return JSONResponse({"message": "Unauthorized."}, status_code=403)
            body = await request.json()
            self.bodies.append(body)
            query, num = body["q"], int(body.get("num", 10))
            self.calls[query] += 1
            self.call_times.append(time.monotonic())
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                failure = await self._misbehave(query)
            finally:
                self.in_flight -= 1
            if failure is not None:
                return failure
            slug = "-".join(query.lower().split())
            organic = [{"title": f"{query} - result {i}", "link": f"https://example.org/{slug}/{i}",
                        "snippet": f"Snippet {i} about {query}.", "position": i}
                       for i in range(1, min(num, self.results_per_query) + 1)]
            return {"searchParameters": {"q": query, "num": num, "type": "search"}, "organic": organic}

        @app.get("/reader/{url:path}")
        async def reader(url: str, request: Request):
            authorization = request.headers.get("authorization")
            if authorization is not None and authorization != f"Bearer {READER_KEY}":
                return JSONResponse({"code": 401, "message": "invalid key"}, status_code=401)
            self.calls[url] += 1
            failure = await self._misbehave(url)
            if failure is not None:
                return failure
            return {"code": 200, "status": 20000,
                    "data": {"title": f"Page {url.rsplit('/', 1)[-1]}", "url": url, "content": f"The full text of {url}."}}

        return app
