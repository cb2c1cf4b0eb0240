"""The tool-call protocol through verl's own classes on the CPU.

Real: `RLHFDataset` over our parquet, the Qwen2.5 tokenizer and chat template, `AgentLoopWorker`
with `ToolAgentLoop` and the `hermes` parser, our `SearchTool` against a real retrieval server
(uvicorn on 127.0.0.1, BM25 over the mini corpus), and verl's `RewardLoopWorker` as a Ray actor
loading our reward through `pkg://verl_search.rewards`. Stand-in: `ScriptedLLM` for the GPU
rollout engine.
"""

import asyncio
import json

import pytest
from transformers import AutoTokenizer

from tests.conftest import MINI_QA, SHARED
from tests.verl_helpers import ScriptedLLM, tool_agent_config
from verl_search.datasets.preprocess import Source, build_rows, make_row, write_parquet
from verl_search.eval.batch import load_dataset, make_batch

QUESTION = "If Gallu is a demon Lilu is what?"  # mini_wiki/qa.jsonl, gold "a spirit"


def tool_call(*queries):
    return '<tool_call>\n{"name": "search", "arguments": {"query_list": %s}}\n</tool_call>' % json.dumps(list(queries))


def script(prompt_text, turn):
    if turn == 0:
        return tool_call("Lilu mythology Akkadian spirit") + "<|im_end|>"
    answer = "a spirit" if QUESTION in prompt_text else "Paris"
    return f"<answer> {answer} </answer><|im_end|>"


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rows = [json.loads(line) for line in MINI_QA.read_text().splitlines()]
    gallu = next(r for r in rows if r["question"] == QUESTION)
    other = next(r for r in rows if r["source"] == "2wiki")
    out = tmp_path_factory.mktemp("data") / "rows.parquet"
    write_parquet([make_row(gallu, 0, "test", "hotpotqa", "tool", topk=2), make_row(other, 1, "test", "2wiki", "tool")], out)
    return out


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen):
    return AutoTokenizer.from_pretrained(tiny_qwen)


def run_rollout(config, tokenizer, data_file, reward_handle=None):
    from verl.experimental.agent_loop import AgentLoopWorker

    llm = ScriptedLLM(tokenizer, script)
    worker = AgentLoopWorker(config, llm, reward_loop_worker_handles=[reward_handle] if reward_handle else None)
    dataset = load_dataset(data_file, tokenizer, config.data)
    output = asyncio.run(worker.generate_sequences(make_batch(dataset, range(len(dataset)))))
    return output, llm


def response_parts(output, tokenizer, i):
    """(response token ids, response_mask) of row i, padding removed."""
    length = int(output.batch["attention_mask"][i, output.batch["prompts"].shape[1]:].sum())
    ids = output.batch["responses"][i, :length].tolist()
    mask = output.batch["response_mask"][i, :length].tolist()
    return ids, mask


@pytest.fixture(scope="module")
def reward_handle(ray_session, tiny_qwen, data_file):
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    return ray_session.remote(RewardLoopWorker).remote(tool_agent_config(tiny_qwen, data_file))


def test_rlhf_dataset_reads_our_parquet_with_the_tool_config(tiny_qwen, tokenizer, tmp_path):
    rows = build_rows([Source.parse(str(SHARED / "data/qa/bamboogle/test.jsonl"))], "test", "tool", max_per_source=7)
    write_parquet(rows, tmp_path / "b.parquet")
    config = tool_agent_config(tiny_qwen, tmp_path / "b.parquet")
    dataset = load_dataset(tmp_path / "b.parquet", tokenizer, config.data)
    assert len(dataset) == 7
    row = dataset[3]
    assert row["agent_name"] == "tool_agent" and row["data_source"] == "bamboogle"
    assert row["tools_kwargs"]["search"]["create_kwargs"]["question"] == row["extra_info"]["question"]
    assert dataset.tool_schemas[0]["function"]["name"] == "search"  # the tool config loaded


def test_tool_rollout_masks_observation_and_scores_with_our_reward(tiny_qwen, tokenizer, data_file, bm25_server,
                                                                   reward_handle, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_URL", f"{bm25_server.url}/retrieve")
    config = tool_agent_config(tiny_qwen, data_file)
    output, llm = run_rollout(config, tokenizer, data_file, reward_handle)

    for i in range(2):
        ids, mask = response_parts(output, tokenizer, i)
        model_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 1])
        env_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
        # every token the model produced is trainable (mask 1), nothing else is
        assert model_text.startswith("<tool_call>") and "<answer>" in model_text
        assert "<tool_response>" not in model_text and "Doc 1(Title:" not in model_text
        assert env_text.count("<tool_response>") == 1 and "Doc 1(Title:" in env_text
        # one run of 0s (the tool turn) between the two model turns
        first_zero, last_zero = mask.index(0), len(mask) - 1 - mask[::-1].index(0)
        assert all(m == 1 for m in mask[:first_zero]) and all(m == 1 for m in mask[last_zero + 1:])
        assert all(m == 0 for m in mask[first_zero:last_zero + 1])

    gallu_env = tokenizer.decode([t for t, m in zip(*response_parts(output, tokenizer, 0)) if m == 0])
    assert "Doc 2(Title:" in gallu_env and "Doc 3(Title:" not in gallu_env  # create_kwargs topk=2 reached the tool
    other_env = tokenizer.decode([t for t, m in zip(*response_parts(output, tokenizer, 1)) if m == 0])
    assert "Doc 3(Title:" in other_env  # the tool's default topk=3
    assert '"Lilu (mythology)"' in gallu_env

    scores = output.batch["rm_scores"].sum(-1).tolist()
    assert scores == [1.0, 0.0]  # right answer, wrong answer
    assert output.non_tensor_batch["pred"].tolist() == ["a spirit", "Paris"]
    assert output.non_tensor_batch["num_searches"].tolist() == [1, 1]
    assert output.non_tensor_batch["failed_searches"].tolist() == [0, 0]


def test_rollout_completes_when_the_retrieval_server_is_down(tiny_qwen, tokenizer, data_file, reward_handle, monkeypatch):
    from verl_search.server.local import free_port

    monkeypatch.setenv("VERL_SEARCH_URL", f"http://127.0.0.1:{free_port()}/retrieve")  # nothing listens there
    config = tool_agent_config(tiny_qwen, data_file)
    output, _ = run_rollout(config, tokenizer, data_file, reward_handle)
    ids, mask = response_parts(output, tokenizer, 0)
    env_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
    assert "search failed: cannot connect to the retrieval service" in env_text
    assert output.non_tensor_batch["failed_searches"].tolist() == [1, 1]
    assert output.non_tensor_batch["search_errors"][0][0].startswith("cannot connect")
    assert output.batch["rm_scores"].sum(-1).tolist() == [1.0, 0.0]  # the rollout and the reward still ran
