"""A slow retriever (a test-only delay around the real BM25 retriever, served by
the real app on uvicorn) against a 2 s deadline. The tool returns a flagged failure within the
deadline + 0.5 s, the Search-R1 agent loop (verl's AgentLoopWorker; `ScriptedLLM` stands in for the
GPU engine) goes on to answer, and requests whose client gave up are never searched."""

import asyncio
import json
import time

import httpx
import pytest
import yaml
from transformers import AutoTokenizer

from tests.conftest import MINI_QA
from tests.reliability.wrappers import RecordingRetriever
from tests.verl_helpers import ScriptedLLM
from tests.waiting import wait_until, wait_until_async
from verl_search.verl_config.shipped import config_path
from verl_search.datasets.preprocess import make_row, write_parquet
from verl_search.server.app import create_app, index_service
from verl_search.server.local import ThreadServer
from verl_search.tools.search_tool import SearchTool

DEADLINE = 2.0
QA = [json.loads(line) for line in MINI_QA.read_text().splitlines()]
GALLU = next(r for r in QA if r["question"] == "If Gallu is a demon Lilu is what?")


class AgentData:
    def __init__(self):
        self.extra_fields = {}


@pytest.fixture
def slow(bm25_retriever):
    recorder = RecordingRetriever(bm25_retriever, delay=3.0)
    with ThreadServer(create_app(index_service(recorder))) as server:
        yield server, recorder


async def tool_call(url: str, query: str, agent_data: AgentData):
    tool = SearchTool({"type": "native", "retrieval_service_url": url, "deadline": DEADLINE})
    instance_id, _ = await tool.create(create_kwargs={})
    started = time.monotonic()
    try:
        response, _, _ = await tool.execute(instance_id, {"query_list": [query]}, agent_data=agent_data)
    finally:
        await tool.release(instance_id)
    return response.text, time.monotonic() - started


def test_tool_fails_within_deadline_and_given_up_requests_are_not_searched(slow):
    server, recorder = slow
    url = f"{server.url}/retrieve"
    data = [AgentData() for _ in range(3)]

    async def scenario():
        first = asyncio.ensure_future(tool_call(url, "first query", data[0]))
        # "first" is being searched (3 s): the next two queue behind it
        await wait_until_async(lambda: recorder.searched() == ["first query"], 30,
                               'the worker to take "first query" (its search takes 3 s)')
        later = [tool_call(url, q, d) for q, d in (("second query", data[1]), ("third query", data[2]))]
        return await asyncio.gather(first, *later)

    results = asyncio.run(scenario())
    for (text, elapsed), agent_data in zip(results, data):
        assert elapsed < DEADLINE + 0.5, elapsed
        assert "search failed: timeout" in text, text
        assert agent_data.extra_fields["failed_searches"] == 1 and agent_data.extra_fields["num_searches"] == 1
    recorder.delay = 0.0  # for the searches from now on ("first" is already in its 3 s)
    wait_until(lambda: httpx.get(f"{server.url}/health", timeout=10).json()["batches"] == 1, 30,
               'the worker to finish "first query" (/health counts 1 batch)',
               watch={"the server thread": server._thread})
    # the next request queues behind the two given-up ones: once it is answered, the worker has dequeued them
    text, _ = asyncio.run(tool_call(url, "Lilu mythology", AgentData()))
    assert text.startswith("Doc 1(Title:")  # the server answers the next one
    # the clients of the other two had gone: dropped unsearched
    assert recorder.searched() == ["first query", "Lilu mythology"]
    assert server._thread.is_alive()


def test_agent_loop_goes_on_after_slow_searches(slow, tiny_qwen, tmp_path, monkeypatch):
    from verl.experimental.agent_loop import AgentLoopWorker

    from verl_search.eval.batch import load_dataset, make_batch
    from verl_search.verl_config.compose import compose_verl_config

    server, recorder = slow
    entries = yaml.safe_load(open(config_path("agent-loop")))
    entries[0].update(deadline=DEADLINE, timeout=DEADLINE)
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text(yaml.safe_dump(entries))
    rows = tmp_path / "rows.parquet"
    write_parquet([make_row(GALLU, 0, "test", GALLU["source"], "search_r1")], rows)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    turns = ["<think>a</think><search> Lilu mythology </search>", "<think>b</think><search> Alû demon </search>",
             "<think>c</think><answer> a spirit </answer>"]
    llm = ScriptedLLM(tokenizer, lambda prompt, turn: turns[turn])
    config = compose_verl_config([
        f"actor_rollout_ref.model.path={tiny_qwen}", "actor_rollout_ref.rollout.name=sglang",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        "actor_rollout_ref.rollout.prompt_length=1024", "actor_rollout_ref.rollout.response_length=3000",
        f"data.train_files={rows}", f"data.val_files={rows}",
    ])
    monkeypatch.setenv("VERL_SEARCH_URL", f"{server.url}/retrieve")
    dataset = load_dataset(rows, tokenizer, config.data)
    started = time.monotonic()
    output = asyncio.run(AgentLoopWorker(config, llm).generate_sequences(make_batch(dataset, range(1))))
    elapsed = time.monotonic() - started
    fields = output.non_tensor_batch
    assert len(llm.calls) == 3 and fields["answered"][0]  # the loop went on to the answer
    assert fields["num_searches"][0] == 2 and fields["failed_searches"][0] == 2
    assert "search failed: timeout" in llm.calls[1][1]
    assert elapsed < 2 * (DEADLINE + 0.5) + 20, elapsed  # two deadlines, plus verl's set-up on a busy CPU
