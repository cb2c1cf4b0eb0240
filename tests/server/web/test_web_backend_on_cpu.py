"""`verl-search serve --backend web` on real uvicorn servers against a local fake of Serper's search API
and Jina's reader (`fake_apis.py`): the paid APIs cannot be called here (no key, no internet), so the
fake follows their documented request and response formats and counts every call."""

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.server import peer_clients
from tests.server.web.fake_apis import READER_KEY, SEARCH_KEY, FakeWeb
from tests.waiting import wait_until_async
from verl_search.server.settings import ServerSettings
from verl_search.tools.client import SearchClientConfig, search
from verl_search.server.local import SubprocessServer, ThreadServer
from verl_search.server.app import create_app
from verl_search.server.web.service import WebService, build_backend
from verl_search.server.web.options import WebOptions


@pytest.fixture(scope="module")
def fake():
    web = FakeWeb(slow_seconds=3.0)
    with ThreadServer(web.app()) as server:
        web.url = server.url
        yield web


def options_for(fake, cache_dir, **overrides) -> WebOptions:
    fields = {"search_url": f"{fake.url}/search", "reader_url": f"{fake.url}/reader/", "web_cache_dir": str(cache_dir),
              "upstream_backoff": 0.05, "upstream_timeout": 1.0, "request_deadline": 2.0, **overrides}
    return WebOptions(**fields)


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", SEARCH_KEY)
    monkeypatch.setenv("JINA_API_KEY", READER_KEY)


@pytest.fixture
def web_server(fake, tmp_path, keys):
    with ThreadServer(create_app(WebService(build_backend(options_for(fake, tmp_path)), request_deadline=2.0))) as server:
        yield server


def retrieve(server, body):
    return httpx.post(f"{server.url}/retrieve", json=body, timeout=30)


def health(server) -> dict:
    return httpx.get(f"{server.url}/health", timeout=30).json()


def test_results_come_back_in_search_r1s_shape(fake, web_server):
    response = retrieve(web_server, {"queries": ["who wrote hamlet", ""], "topk": 3, "return_scores": True})
    assert response.status_code == 200
    first, blank = response.json()["result"]
    assert blank == []  # a blank query gets no hits and costs no call
    assert [hit["document"]["id"] for hit in first] == [f"https://example.org/who-wrote-hamlet/{i}" for i in (1, 2, 3)]
    assert first[0]["document"]["contents"] == '"who wrote hamlet - result 1"\nSnippet 1 about who wrote hamlet.'
    assert [hit["score"] for hit in first] == pytest.approx([1.0, 1 / 2, 1 / 3])  # 1 / Google's rank
    assert fake.bodies[-1] == {"q": "who wrote hamlet", "num": 10}  # Serper's body, a full page of results
    hits = retrieve(web_server, {"queries": ["who wrote hamlet"], "topk": 2, "return_scores": False}).json()["result"]
    assert set(hits[0][0]) == {"id", "contents"} and len(hits[0]) == 2


def test_a_cached_query_never_calls_upstream_even_after_a_restart(fake, tmp_path, keys):
    options = options_for(fake, tmp_path)
    with ThreadServer(create_app(WebService(build_backend(options)))) as server:
        first = retrieve(server, {"queries": ["capital of France"], "topk": 5}).json()
        calls = fake.calls["capital of France"]
        again = retrieve(server, {"queries": ["  Capital  OF france "], "topk": 3}).json()  # normalised: same key
        assert fake.calls["capital of France"] == calls == 1 and fake.calls["  Capital  OF france "] == 0
        assert again["result"][0] == first["result"][0][:3]
        stats = health(server)
        assert stats["cache_hits"] == 1 and stats["cache_misses"] == 1 and stats["upstream_calls"] == {"search": 1}
        retrieve(server, {"queries": ["capital of France"], "topk": 15})  # more than the 10 cached: one more call
        assert fake.calls["capital of France"] == 2
    with ThreadServer(create_app(WebService(build_backend(options)))) as server:  # a new process reads the same folder
        assert retrieve(server, {"queries": ["capital of france"], "topk": 15}).json() is not None
        assert fake.calls["capital of France"] == 2 and health(server)["cache_hits"] == 1


def test_concurrent_identical_queries_make_one_upstream_call(fake, web_server):
    fake.script["grpo group query"] = ["slow"]  # the first call takes a while: the others arrive meanwhile
    fake.slow_seconds = 0.5

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(client.post(f"{web_server.url}/retrieve", json={"queries": ["grpo group query"]})
                                          for _ in range(8)))

    responses = asyncio.run(burst())
    assert {r.status_code for r in responses} == {200} and len({r.content for r in responses}) == 1
    assert fake.calls["grpo group query"] == 1 and health(web_server)["coalesced"] >= 1
    fake.slow_seconds = 3.0


def test_429_and_5xx_are_retried_with_backoff(fake, web_server):
    fake.script["busy query"] = [429, 503, "ok"]
    response = retrieve(web_server, {"queries": ["busy query"]})
    assert response.status_code == 200 and len(response.json()["result"][0]) == 3
    assert fake.calls["busy query"] == 3 and health(web_server)["upstream_retries"] == 2


def test_a_429_storm_is_a_429_with_retry_after_not_a_5xx(fake, web_server):
    fake.script["storm query"] = [429] * 50
    started = time.monotonic()
    response = retrieve(web_server, {"queries": ["fine query", "storm query"]})
    assert response.status_code == 429 and time.monotonic() - started < 3.0  # within the request deadline
    assert response.headers["retry-after"].isdigit()
    assert "queries[1]: the search API is rate limiting" in response.json()["detail"]
    assert fake.calls["storm query"] == 4  # the first attempt and 3 retries, then it stops
    assert fake.calls["fine query"] == 1
    retrieve(web_server, {"queries": ["fine query"]})  # the query that worked was cached: no second call
    assert fake.calls["fine query"] == 1


def test_a_slow_upstream_ends_at_the_deadline_with_a_424(fake, web_server):
    fake.script["slow query"] = ["slow"] * 10
    started = time.monotonic()
    response = retrieve(web_server, {"queries": ["slow query"]})
    elapsed = time.monotonic() - started
    assert response.status_code == 424 and "did not answer in time" in response.json()["detail"], response.text
    # the 2 s request deadline ended it, not the retries running out: 1 s per attempt leaves room for 2 of the 4
    # attempts (the first and 3 retries) the server makes without a deadline, which took 4.3 s. Its time is not
    # bounded tighter: beside a trainer run and two other test workers the same answer took 3.5 s
    assert fake.calls["slow query"] <= 2 and elapsed < 2 * fake.slow_seconds, (fake.calls["slow query"], elapsed)


@pytest.mark.parametrize("misbehaviour, message", [("not json", "not JSON"), ("wrong json", '"organic" list')])
def test_a_malformed_upstream_body_is_a_424_naming_it(fake, web_server, misbehaviour, message):
    query = f"malformed {misbehaviour}"
    fake.script[query] = [misbehaviour]
    response = retrieve(web_server, {"queries": [query]})
    assert response.status_code == 424 and message in response.json()["detail"]
    assert retrieve(web_server, {"queries": [query]}).status_code == 200  # nothing bad was cached


def test_a_refused_key_is_a_424_naming_the_variable_and_not_retried(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "a-wrong-key")
    with ThreadServer(create_app(WebService(build_backend(options_for(fake, tmp_path))))) as server:
        response = retrieve(server, {"queries": ["any query at all"]})
        assert response.status_code == 424 and "$SERPER_API_KEY" in response.json()["detail"]
        assert "a-wrong-key" not in response.text and health(server)["upstream_calls"] == {"search": 1}


def test_bad_input_is_a_422_as_on_the_index_server(fake, tmp_path, keys):
    settings = ServerSettings(max_topk=5)
    with ThreadServer(create_app(WebService(build_backend(options_for(fake, tmp_path)), settings))) as server:
        for body, fragment in [({"queries": ["a"], "topk": 6}, "max_topk=5"), ({"queries": []}, "at least 1"),
                               ({"queries": ["a"], "top_k": 3}, "Extra inputs")]:
            response = retrieve(server, body)
            assert response.status_code == 422 and fragment in response.text
    assert fake.calls["a"] == 0


def test_access_reads_pages_by_url_or_id(fake, web_server):
    url = "https://example.org/who-wrote-hamlet/1"
    for field in ("urls", "ids"):
        response = httpx.post(f"{web_server.url}/access", json={field: [url]}, timeout=30)
        assert response.status_code == 200
        page = response.json()["result"][0]
        assert page == {"id": url, "title": "Page 1", "contents": f'"Page 1"\nThe full text of {url}.', "url": url,
                        "passage_ids": [url]}
    assert fake.calls[url] == 1  # the second read came from the cache
    response = httpx.post(f"{web_server.url}/access", json={"ids": ["not a url"]}, timeout=30)
    assert response.status_code == 422 and "not an http(s) URL" in response.text
    response = httpx.post(f"{web_server.url}/access", json={"titles": ["Hamlet"]}, timeout=30)
    assert response.status_code == 422 and "reads pages by urls or ids" in response.text
    fake.script["https://example.org/busy"] = [429] * 10
    response = httpx.post(f"{web_server.url}/access", json={"urls": ["https://example.org/busy"]}, timeout=30)
    assert response.status_code == 429 and "urls[0]: the page reader is rate limiting" in response.text


def test_the_peers_clients_and_ours_work_unchanged(fake, web_server):
    url = f"{web_server.url}/retrieve"
    assert peer_clients.search_r1(url, ["peer query"]) == peer_clients.verl_07(url, ["peer query"])
    shown = peer_clients.search_r1(url, ["peer query", "another peer query"])
    assert [len(hits) for hits in shown] == [3, 3] and shown[0][0] == ('"peer query - result 1"', "Snippet 1 about peer query.")
    assert asyncio.run(peer_clients.slime(url, "peer query", top_k=5))[:3] == shown[0]
    outcome = asyncio.run(search(["peer query"], SearchClientConfig(url, topk=2)))
    assert outcome.ok and [h["contents"] for h in outcome.hits[0]] == [f"{t}\n{x}" for t, x in shown[0][:2]]
    assert fake.calls["peer query"] == 1


def test_a_missing_key_stops_serve_before_it_binds(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SERPER_API_KEY"}
    result = subprocess.run([sys.executable, "-m", "verl_search.server", "--backend", "web", "--port", "9",
                             "--web-cache-dir", str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert "$SERPER_API_KEY" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_serve_backend_web_never_logs_the_key(fake, tmp_path, monkeypatch):
    log = tmp_path / "server.log"
    monkeypatch.setenv("MY_SEARCH_KEY", SEARCH_KEY)  # the child server inherits it
    args = ["--backend", "web", "--search-url", f"{fake.url}/search", "--reader-url", f"{fake.url}/reader/",
            "--search-key-env", "MY_SEARCH_KEY", "--web-cache-dir", str(tmp_path / "cache"), "--request-deadline", "2",
            "--upstream-backoff", "0.05"]
    fake.script["logged storm"] = [429] * 10
    with SubprocessServer(args, ready_timeout=120, log_path=str(log)) as server:
        assert retrieve(server, {"queries": ["logged query"]}).status_code == 200
        assert retrieve(server, {"queries": ["logged storm"]}).status_code == 429
        assert health(server)["cache_entries"] == 1
    text = log.read_text()
    assert "the search API answered HTTP 429" in text  # failures are logged ...
    assert SEARCH_KEY not in text  # ... the key never


def test_options_are_checked():
    with pytest.raises(ValueError, match="--upstream-rate"):
        WebOptions(upstream_rate=0)
    with pytest.raises(ValueError, match="--search-url"):
        WebOptions(search_url="google.serper.dev/search")


def test_search_and_access_tools_against_the_web_server(fake, web_server):
    from verl_search.tools.access_tool import AccessTool
    from verl_search.tools.search_tool import SearchTool

    config = {"type": "native", "retrieval_service_url": f"{web_server.url}/retrieve"}

    async def run(tool, parameters):
        instance_id, _ = await tool.create()
        return await tool.execute(instance_id, parameters)

    shown = asyncio.run(run(SearchTool({**config, "show_ids": True, "topk": 1}), {"query_list": ["tool query"]}))[0].text
    assert shown == 'Doc 1(Title: "tool query - result 1", id: https://example.org/tool-query/1) Snippet 1 about tool query.'
    response, _, metrics = asyncio.run(run(AccessTool(config), {"id": "https://example.org/tool-query/1"}))
    assert response.text == '(Title: "Page 1") The full text of https://example.org/tool-query/1.'
    assert metrics["access_failed"] == 0
    fake.script["https://example.org/down"] = [429] * 10
    response, _, metrics = asyncio.run(run(AccessTool(config), {"url": "https://example.org/down"}))
    assert response.text.startswith("access failed: HTTP 429: urls[0]: the page reader is rate limiting")
    assert metrics["attempts"] == 1  # a 4xx is final for the client: the server already retried


def test_a_waiter_fetches_itself_when_the_fetching_request_is_cancelled(tmp_path):
    from verl_search.server.web.backend import WebBackend
    from verl_search.server.web.cache import WebCache

    class Upstream:  # the API client's search only; the first call hangs until cancelled (its client left)
        calls = 0

        async def search(self, query, num, deadline):
            Upstream.calls += 1
            if Upstream.calls == 1:
                await asyncio.sleep(60)  # plays an upstream that hangs: this call ends when it is cancelled
            return [{"title": "T", "link": "https://example.org/t", "snippet": "s", "position": 1}]

    backend = WebBackend(Upstream(), WebCache(tmp_path, 10, 0))

    async def scenario():
        first = asyncio.ensure_future(backend.search(["same query"], 1, time.monotonic() + 30))
        await wait_until_async(lambda: Upstream.calls == 1, 10, "the first search to call the upstream")
        second = asyncio.ensure_future(backend.search(["same query"], 1, time.monotonic() + 30))
        await wait_until_async(lambda: backend.coalesced == 1, 10, "the second search to wait for the first's call")
        first.cancel()
        return await asyncio.wait_for(second, 5)

    hits = asyncio.run(scenario())
    assert hits[0][0].passage.id == "https://example.org/t" and Upstream.calls == 2 and backend.coalesced == 1


def test_the_token_bucket_and_the_concurrency_limit_bound_upstream_calls(fake, tmp_path, keys):
    options = options_for(fake, tmp_path, upstream_rate=4.0, upstream_burst=2, upstream_concurrency=2,
                          request_deadline=10.0, upstream_timeout=5.0)
    fake.script.update({f"bucket query {i}": ["slow"] for i in range(8)})  # each call takes 0.3 s
    fake.slow_seconds, fake.max_in_flight, first_call = 0.3, 0, len(fake.call_times)
    with ThreadServer(create_app(WebService(build_backend(options), request_deadline=10.0))) as server:
        response = retrieve(server, {"queries": [f"bucket query {i}" for i in range(8)]})
    fake.slow_seconds = 3.0
    assert response.status_code == 200 and all(len(hits) == 3 for hits in response.json()["result"])
    times = fake.call_times[first_call:]
    assert len(times) == 8 and fake.max_in_flight <= 2  # never more than --upstream-concurrency at once
    assert times[-1] - times[0] >= (8 - 2) / 4.0 - 0.1  # 2 at once, then 4 per second


def test_this_servers_own_rate_limit_is_a_429_within_the_deadline(fake, tmp_path, keys):
    options = options_for(fake, tmp_path, upstream_rate=0.5, upstream_burst=1, request_deadline=1.0)
    with ThreadServer(create_app(WebService(build_backend(options), request_deadline=1.0))) as server:
        started = time.monotonic()
        response = retrieve(server, {"queries": ["own limit a", "own limit b", "own limit c"]})
        # within the 1 s deadline (plus slack for a loaded machine); without it the tokens for the other two queries
        # (0.5 per second) would come after 2 and 4 s and the request would end 200
        assert response.status_code == 429 and time.monotonic() - started < 1.0 + 2.0
        assert "this server's own rate limit" in response.json()["detail"] and response.headers["retry-after"] == "1"
    assert fake.calls["own limit a"] + fake.calls["own limit b"] + fake.calls["own limit c"] == 1  # the one token
