"""AccessTool (verl BaseTool) against a real uvicorn server's `/access` over the real mini corpus."""

import asyncio
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import MINI_CORPUS
from verl_search.verl_config.shipped import config_path
from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.retrieval.pages import PageLookup
from verl_search.server.access import CorpusPages
from verl_search.server.app import create_app, index_service
from verl_search.tools.access_tool import AccessTool, format_page
from verl_search.tools.client import SearchClientConfig
from verl_search.server.local import ThreadServer
from verl_search.tools.search_tool import SearchTool


class AgentData:
    def __init__(self):
        self.extra_fields = {}


@pytest.fixture(scope="module")
def pages_server(bm25_retriever):
    pages = CorpusPages(PageLookup.open(JsonlCorpus(MINI_CORPUS), cache=False))
    with ThreadServer(create_app(index_service(bm25_retriever, pages=pages))) as server:
        yield server


async def call(tool, parameters, agent_data=None):
    instance_id, _ = await tool.create()
    try:
        return await tool.execute(instance_id, parameters, agent_data=agent_data)
    finally:
        await tool.release(instance_id)


def make_tool(server, **config):
    return AccessTool({"type": "native", "retrieval_service_url": f"{server.url}/retrieve", **config})


def test_the_access_url_comes_from_the_retrieval_url():
    assert SearchClientConfig("http://h:1/retrieve").access_url == "http://h:1/access"
    assert SearchClientConfig("http://h:1/x/retrieve", access_service_url="http://o:2/a").access_url == "http://o:2/a"


def test_search_then_read_the_whole_page(pages_server):
    agent_data = AgentData()
    search = SearchTool({"type": "native", "retrieval_service_url": f"{pages_server.url}/retrieve", "topk": 1,
                         "max_chars_per_passage": 40})
    snippet = asyncio.run(call(search, {"query_list": ["Al-Qaeda leader"]}, agent_data))[0].text
    title = snippet.split("(Title: ")[1].split(")")[0]  # '"Al-Qaeda"', as the model sees it
    response, reward, metrics = asyncio.run(call(make_tool(pages_server), {"title": title}, agent_data))
    shown = snippet.split(") ", 1)[1].removesuffix("...")  # the snippet's 40 characters
    assert response.text.startswith(f"(Title: {title}) ") and shown in response.text
    assert len(response.text) > 3 * len(snippet)  # the whole page, not the snippet
    assert reward == 0.0 and metrics["access_failed"] == 0 and metrics["attempts"] == 1 and not metrics["truncated"]
    assert agent_data.extra_fields == {"num_searches": 1, "failed_searches": 0, "num_accesses": 1, "failed_accesses": 0}


def test_by_id_and_truncated(pages_server):
    response, _, metrics = asyncio.run(call(make_tool(pages_server, max_page_chars=30), {"id": "12"}))
    assert response.text.startswith('(Title: "The Dark Knight Rises") The Dark Knight Rises')
    assert metrics["truncated"] and "more characters not shown]" in response.text.splitlines()[-1]


def test_an_unknown_title_is_a_flagged_observation(pages_server):
    agent_data = AgentData()
    response, _, metrics = asyncio.run(call(make_tool(pages_server), {"title": "No Such Page"}, agent_data))
    assert response.text.startswith("access failed: HTTP 404: body.titles.0: no page titled 'No Such Page'")
    assert metrics["access_failed"] == 1 and metrics["attempts"] == 1  # a 404 is not retried
    assert agent_data.extra_fields["failed_accesses"] == 1 and len(agent_data.extra_fields["access_errors"]) == 1


@pytest.mark.parametrize("parameters", [{}, {"title": "a", "id": "1"}, {"title": ""}, {"title": 3}, "Paris"])
def test_bad_arguments_make_no_call(parameters):
    tool = AccessTool({"type": "native", "retrieval_service_url": "http://127.0.0.1:9/retrieve"})
    response, _, metrics = asyncio.run(call(tool, parameters))
    assert response.text.startswith("access failed: invalid arguments:") and metrics["attempts"] == 0


def test_a_dead_service_is_a_flagged_observation():
    tool = AccessTool({"type": "native", "retrieval_service_url": "http://127.0.0.1:9/retrieve", "deadline": 1,
                       "max_retries": 1})
    response, _, metrics = asyncio.run(call(tool, {"title": "Paris"}))
    assert response.text.startswith("access failed: cannot connect") and metrics["access_failed"] == 1


def test_the_shipped_yaml_builds_both_tools(pages_server, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_URL", f"{pages_server.url}/retrieve")
    from verl.tools.tool_registry import initialize_tools_from_config

    path = config_path("access-tool")
    assert Path(path).is_file() and OmegaConf.load(path)
    tools = {tool.name: tool for tool in initialize_tools_from_config(path)}
    assert isinstance(tools["search"], SearchTool) and isinstance(tools["access"], AccessTool)
    text = asyncio.run(call(tools["access"], {"title": "Al-Qaeda"}))[0].text
    assert text.startswith('(Title: "Al-Qaeda") ') and text.endswith("more characters not shown]")  # max_page_chars 3000


def test_format_page_keeps_the_title_line():
    assert format_page({"title": "X", "contents": '"X"\nabc'}) == ('(Title: "X") abc', False)
