"""SearchTool and its retrieval client against real servers on 127.0.0.1."""

import asyncio
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from verl_search.tools import client
from verl_search.tools.formatting import format_passage, format_results
from verl_search.server.local import ThreadServer, free_port
from verl_search.agent_protocol.tool import parse_queries
from verl_search.tools.search_tool import SearchTool


class AgentData:
    """The part of verl's AgentData the tool touches."""

    def __init__(self):
        self.extra_fields = {}


def make_tool(url, **config):
    return SearchTool({"type": "native", "retrieval_service_url": url, **config})


async def call(tool, parameters, agent_data=None, create_kwargs=None):
    instance_id, _ = await tool.create(create_kwargs=create_kwargs or {})
    try:
        return await tool.execute(instance_id, parameters, agent_data=agent_data)
    finally:
        await tool.release(instance_id)


def test_search_formats_hits_like_search_r1(bm25_server):
    tool = make_tool(f"{bm25_server.url}/retrieve")
    agent_data = AgentData()
    response, reward, metrics = asyncio.run(call(tool, {"query_list": ["Lilu mythology"]}, agent_data))
    lines = response.text.splitlines()
    assert len(lines) == 3 and lines[0].startswith('Doc 1(Title: "') and lines[2].startswith("Doc 3(Title: ")
    assert reward == 0.0 and metrics["search_failed"] == 0 and metrics["attempts"] == 1
    assert agent_data.extra_fields == {"num_searches": 1, "failed_searches": 0}


def test_several_queries_are_separated_and_counted(bm25_server):
    tool = make_tool(f"{bm25_server.url}/retrieve", topk=2)
    agent_data = AgentData()
    text = asyncio.run(call(tool, {"query_list": ["Lilu mythology", "Alû demon"]}, agent_data))[0].text
    first, second = text.split("\n---\n")
    assert first.startswith('Results for "Lilu mythology":') and second.startswith('Results for "Alû demon":')
    assert first.count("Doc ") == 2 and second.count("Doc ") == 2
    asyncio.run(call(tool, {"query": "Gallu"}, agent_data))  # a single "query" string is accepted too
    assert agent_data.extra_fields["num_searches"] == 2


def test_create_kwargs_topk_overrides_the_default(bm25_server):
    tool = make_tool(f"{bm25_server.url}/retrieve")
    text = asyncio.run(call(tool, {"query_list": ["Lilu"]}, create_kwargs={"topk": 1}))[0].text
    assert text.count("Doc ") == 1


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({}, 'missing "query_list"'),  # no arguments
        ({"query_list": []}, "non-empty list of strings"),  # empty list
        ({"query_list": [1, 2]}, "non-empty list of strings"),  # items are not strings (verl drops `items`)
        ({"query_list": ["ok", "  "]}, "a query is empty"),  # a blank query
        ({"query_list": ["q"] * 9}, "at most 8"),  # too many queries
        ("not a dict", "JSON object"),  # arguments not an object
    ],
)
def test_bad_arguments_become_an_observation(parameters, message):
    tool = make_tool("http://127.0.0.1:9/retrieve")
    agent_data = AgentData()
    response, _, metrics = asyncio.run(call(tool, parameters, agent_data))
    assert response.text.startswith("search failed: invalid arguments:") and message in response.text
    assert metrics["search_failed"] == 1 and metrics["attempts"] == 0  # no HTTP call was made
    assert agent_data.extra_fields["failed_searches"] == 1


def test_a_4xx_is_not_retried(bm25_server):
    tool = make_tool(f"{bm25_server.url}/retrieve", max_retries=5)
    response, _, metrics = asyncio.run(call(tool, {"query_list": ["x" * 5000]}))
    assert metrics["attempts"] == 1
    assert response.text.startswith("search failed: HTTP 422: body.queries:") and "max_query_chars" in response.text


@pytest.fixture
def flaky_server():
    """A real server that fails the first `fail` requests with 503 and can be slow."""
    app = FastAPI()
    app.state.calls, app.state.fail, app.state.delay = 0, 0, 0.0

    @app.post("/retrieve")
    async def retrieve(request: Request):
        body = await request.json()
        app.state.calls += 1
        await asyncio.sleep(app.state.delay)
        if app.state.calls <= app.state.fail:
            return JSONResponse({"detail": "overloaded"}, status_code=503)
        return {"result": [[{"id": "1", "contents": '"T"\ntext'}] for _ in body["queries"]]}

    @app.get("/health")
    async def health():
        return {"status": "ready"}

    with ThreadServer(app) as server:
        server.app = app
        yield server


def test_5xx_is_retried_with_backoff(flaky_server):
    flaky_server.app.state.fail = 2
    config = client.SearchClientConfig(retrieval_service_url=f"{flaky_server.url}/retrieve", max_retries=3, backoff=0.01)
    outcome = asyncio.run(client.search(["q"], config))
    assert outcome.ok and outcome.attempts == 3 and flaky_server.app.state.calls == 3


def test_retries_stop_at_the_deadline(flaky_server):
    flaky_server.app.state.delay = 5.0  # every attempt times out
    config = client.SearchClientConfig(retrieval_service_url=f"{flaky_server.url}/retrieve", timeout=0.3,
                                       max_retries=50, deadline=1.0, backoff=0.05)
    started = time.monotonic()
    outcome = asyncio.run(client.search(["q"], config))
    assert not outcome.ok and outcome.error.startswith("timeout")
    assert 2 <= outcome.attempts < 50
    # bounded by the deadline, plus slack for a loaded machine (README's test command runs it beside a trainer run):
    # without the deadline its 51 attempts of 0.3 s would take over 15 s
    assert time.monotonic() - started < 1.0 + 3.0


def test_unreachable_server_fails_fast_without_raising():
    config = client.SearchClientConfig(retrieval_service_url=f"http://127.0.0.1:{free_port()}/retrieve", backoff=0.01)
    outcome = asyncio.run(client.search(["q"], config))
    assert outcome.error.startswith("cannot connect to the retrieval service (4 attempts")


def test_one_http_client_per_event_loop(bm25_server):
    config = client.SearchClientConfig(retrieval_service_url=f"{bm25_server.url}/retrieve")

    async def twice():
        await client.search(["a"], config)
        first = (await client._resources(config)).client
        await asyncio.gather(*[client.search(["b"], config) for _ in range(10)])
        return first is (await client._resources(config)).client and not first.closed

    assert asyncio.run(twice())


def test_tool_init_is_cheap_and_checks_keys():
    import gc

    gc.collect()  # event loops of earlier tests leave `_RESOURCES` (weak keys) now, not half-way through
    gc.disable()
    try:
        before = len(client._RESOURCES)
        make_tool("http://127.0.0.1:1/retrieve")  # no client, no connection
        assert len(client._RESOURCES) == before
    finally:
        gc.enable()
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['top_k'\]"):
        make_tool("http://127.0.0.1:1/retrieve", top_k=3)
    with pytest.raises(ValueError, match="timeout=0"):
        make_tool("http://127.0.0.1:1/retrieve", timeout=0)


DOCS = [{"id": str(i), "contents": f'"Title {i}"\n' + "word " * 30} for i in range(5)]


def test_truncation_keeps_whole_passages_and_says_so():
    text, truncated = format_results(["q"], [DOCS], max_observation_chars=400)
    assert truncated and len(text) <= 400
    lines = text.splitlines()
    assert lines[-1] == "[truncated: 3 more passages not shown]"
    assert all(line == format_passage(i + 1, DOCS[i]) for i, line in enumerate(lines[:-1]))  # whole passages
    assert format_results(["q"], [DOCS], max_observation_chars=10_000) == (format_results(["q"], [DOCS])[0], False)


def test_passage_text_cut_per_passage():
    line = format_passage(1, DOCS[0], max_chars=20)
    assert line == 'Doc 1(Title: "Title 0") word word word word...'


def test_parse_queries_strips():
    assert parse_queries({"query_list": ["  a  ", "b"]}, 8) == ["a", "b"]
