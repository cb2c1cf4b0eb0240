"""The Search-R1 tag protocol through verl's own `AgentLoopWorker` on the CPU.

Real: verl's worker, dataset and reward loop (Ray actor, our reward via `pkg://`), the Qwen2.5
tokenizer and chat template, our agent loop registered through the shipped YAML, and a retrieval
server (uvicorn on 127.0.0.1, BM25 over the mini corpus). Stand-in: `ScriptedLLM` for the GPU
rollout engine.
"""

import asyncio
import json

import pytest
import yaml
from transformers import AutoTokenizer

from tests.conftest import MINI_QA
from tests.verl_helpers import ScriptedLLM, calls_for, row_tokens, tag_agent_config
from verl_search.verl_config.shipped import config_path
from verl_search.datasets.preprocess import make_row, write_parquet
from verl_search.eval.batch import load_dataset, make_batch
from verl_search.agent_protocol.vocabulary import INVALID_ACTION_MESSAGE, LAST_SEARCH_NOTICE, STOP_STRINGS
from verl_search.tools.formatting import format_results
from verl_search.server.local import free_port

QA = [json.loads(line) for line in MINI_QA.read_text().splitlines()]
GALLU = next(r for r in QA if r["question"] == "If Gallu is a demon Lilu is what?")
OTHERS = [r for r in QA if r["source"] == "2wiki"][:3]
TWO_SEARCHES = [
    "<think>Who is Lilu?</think><search> Lilu mythology </search>",
    "<think>And Gallu?</think><search> Alû demon Gallu </search>",
    "<think>Lilu is a spirit.</think><answer> a spirit </answer>",
]
OVERSHOOT = "<think>x</think><search> Lilu </search>\n\n<information>invented by the model</information>"


def script(prompt_text, turn):
    if GALLU["question"] in prompt_text:  # two searches, then the right answer
        return TWO_SEARCHES[turn]
    if OTHERS[0]["question"] in prompt_text:  # overshoots past </search>, then answers wrong
        return OVERSHOOT if turn == 0 else "<think>y</think><answer> Paris </answer>"
    if OTHERS[1]["question"] in prompt_text:  # never stops searching
        return f"<think>more</think><search> query number {turn} </search>"
    return "I do not know." if turn == 0 else "<think>z</think><answer> Rome </answer>"  # invalid, then answers


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen):
    return AutoTokenizer.from_pretrained(tiny_qwen)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rows = [make_row(r, i, "test", r["source"], "search_r1") for i, r in enumerate([GALLU, *OTHERS])]
    out = tmp_path_factory.mktemp("sr1") / "rows.parquet"
    write_parquet(rows, out)
    return out


def rollout(config, tokenizer, data_file, reward_handle=None):
    from verl.experimental.agent_loop import AgentLoopWorker

    llm = ScriptedLLM(tokenizer, script)
    worker = AgentLoopWorker(config, llm, reward_loop_worker_handles=[reward_handle] if reward_handle else None)
    dataset = load_dataset(data_file, tokenizer, config.data)
    return asyncio.run(worker.generate_sequences(make_batch(dataset, range(len(dataset))))), llm


def observation(bm25_retriever, query, notice=""):
    hits = [[{"id": h.passage.id, "contents": h.passage.contents} for h in bm25_retriever.search([query], 3)[0]]]
    return "\n\n<information>" + format_results([query], hits)[0] + notice + "</information>\n\n"


@pytest.fixture(scope="module")
def default_run(tiny_qwen, tokenizer, data_file, bm25_server, ray_session):
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    config = tag_agent_config(tiny_qwen, data_file, config_path("agent-loop"))
    reward = ray_session.remote(RewardLoopWorker).remote(config)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_SEARCH_URL", f"{bm25_server.url}/retrieve")
        return rollout(config, tokenizer, data_file, reward)


def test_two_searches_then_answer_exact_text_masks_and_reward(default_run, tokenizer, bm25_retriever):
    output, llm = default_run
    calls = calls_for(llm, GALLU["question"])
    assert len(calls) == 3
    prompt = calls[0][1]
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")  # chat template
    obs1 = observation(bm25_retriever, "Lilu mythology")
    obs2 = observation(bm25_retriever, "Alû demon Gallu")
    assert calls[1][1] == prompt + TWO_SEARCHES[0] + obs1  # exactly what the model sees at turn 2
    assert calls[2][1] == prompt + TWO_SEARCHES[0] + obs1 + TWO_SEARCHES[1] + obs2
    for call in calls:
        assert call[2]["stop"] == STOP_STRINGS and call[2]["max_tokens"] <= 500

    ids, mask = row_tokens(output, 0)
    sampled = [t for c in calls for t in c[3]]
    assert [t for t, m in zip(ids, mask) if m == 1] == sampled  # token in, token out
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m == 0]) == obs1 + obs2
    runs = []  # (mask value, token ids) of each run: model, observation, model, observation, model
    for token, value in zip(ids, mask):
        if runs and runs[-1][0] == value:
            runs[-1][1].append(token)
        else:
            runs.append((value, [token]))
    assert [value for value, _ in runs] == [1, 0, 1, 0, 1]
    assert [tokens for value, tokens in runs if value == 1] == [c[3] for c in calls]
    assert [tokenizer.decode(tokens) for value, tokens in runs if value == 0] == [obs1, obs2]

    fields = output.non_tensor_batch
    assert fields["num_searches"][0] == 2 and fields["failed_searches"][0] == 0 and fields["answered"][0]
    assert [t["query"] for t in fields["turns"][0][:2]] == ["Lilu mythology", "Alû demon Gallu"]
    assert output.batch["rm_scores"][0].sum().item() == 1.0
    assert fields["format_ok"][0] == 1.0 and fields["pred"][0] == "a spirit"


def test_engine_overshoot_is_cut_at_the_first_closing_tag(default_run, tokenizer):
    output, llm = default_run
    calls = calls_for(llm, OTHERS[0]["question"])
    kept = calls[1][1][len(calls[0][1]):]
    assert kept.startswith("<think>x</think><search> Lilu </search>")
    assert "invented by the model" not in kept  # the model's fake observation is gone
    ids, mask = row_tokens(output, 1)
    first_turn = ids[: mask.index(0)]
    assert first_turn == calls[0][3][: len(first_turn)] and len(first_turn) < len(calls[0][3])  # a token prefix
    assert output.batch["rm_scores"][1].sum().item() == 0.0  # answered "Paris": wrong


def test_max_turns_then_no_more_searches(default_run, tokenizer):
    output, llm = default_run
    calls = calls_for(llm, OTHERS[1]["question"])
    assert len(calls) == 3  # the shipped YAML's 2 searches (Search-R1's max_turns), then one last turn to answer
    fields = output.non_tensor_batch
    assert fields["num_searches"][2] == 2 and not fields["answered"][2]
    # Search-R1's last observation is the passages only: the notice is off in the shipped YAML
    assert calls[2][1].endswith("</information>\n\n") and LAST_SEARCH_NOTICE not in calls[2][1]
    ids, mask = row_tokens(output, 2)
    assert mask[-1] == 1  # the trajectory ends with the model's last turn, no observation after it


def test_invalid_action_gets_the_correction_message(default_run, tokenizer):
    output, llm = default_run
    calls = calls_for(llm, OTHERS[2]["question"])
    assert calls[1][1] == calls[0][1] + "I do not know." + INVALID_ACTION_MESSAGE
    fields = output.non_tensor_batch
    assert fields["invalid_actions"][3] == 1 and fields["num_searches"][3] == 0 and fields["answered"][3]


@pytest.fixture(scope="module")
def custom_yaml(tmp_path_factory):
    """A copy of the shipped YAML with a small observation budget, no chat template (base model) and the
    last-search notice on."""
    entries = yaml.safe_load(open(config_path("agent-loop")))
    entries[0].update(max_obs_tokens=40, use_chat_template=False, last_search_notice=True)
    path = tmp_path_factory.mktemp("yaml") / "agent_loops.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def test_long_observation_keeps_its_closing_tag_and_base_prompt(tiny_qwen, tokenizer, data_file, bm25_server,
                                                               custom_yaml, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_URL", f"{bm25_server.url}/retrieve")
    output, llm = rollout(tag_agent_config(tiny_qwen, data_file, custom_yaml), tokenizer, data_file)
    calls = calls_for(llm, GALLU["question"])
    assert "<|im_start|>" not in calls[0][1]  # raw Search-R1 text, no chat template
    assert calls[0][1] == tokenizer.decode(tokenizer.encode(make_row(GALLU, 0, "t", "x", "search_r1")["prompt"][0]["content"]))
    ids, mask = row_tokens(output, 0)
    first_obs = ids[mask.index(0): mask.index(1, mask.index(0))]
    assert len(first_obs) <= 40
    text = tokenizer.decode(first_obs)
    assert text.startswith("\n\n<information>Doc 1(Title:") and text.endswith("...(truncated)</information>\n\n")
    assert output.non_tensor_batch["turns"][0][0]["truncated"]
    # with last_search_notice on, the last observation (only) says so, inside the cut block
    calls = calls_for(llm, OTHERS[1]["question"])
    assert len(calls) == 3
    assert calls[2][1].endswith(LAST_SEARCH_NOTICE + "</information>\n\n")
    assert LAST_SEARCH_NOTICE not in calls[1][1]


def test_server_down_still_completes(tiny_qwen, tokenizer, data_file, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_URL", f"http://127.0.0.1:{free_port()}/retrieve")
    output, llm = rollout(tag_agent_config(tiny_qwen, data_file, config_path("agent-loop")), tokenizer, data_file)
    calls = calls_for(llm, GALLU["question"])
    assert "<information>search failed: cannot connect to the retrieval service" in calls[1][1]
    fields = output.non_tensor_batch
    assert fields["failed_searches"][0] == 2 and fields["num_searches"][0] == 2 and fields["answered"][0]
