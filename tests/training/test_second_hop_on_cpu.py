"""Cold-start trajectories with a second search (`training.second_hop`, `--sft-second-hop`): the first search misses
the gold, the first observation names a page, and the search for that page shows the gold; token for token what
the Search-R1 agent loop builds when the model writes those three turns.

Real: the mini-wiki BM25 index (in process, and behind uvicorn on 127.0.0.1 for the agent loop), the training
questions, the Qwen2.5 tokenizer, verl's `AgentLoopWorker` with our `SearchR1AgentLoop`. Stand-in: `ScriptedLLM` for
the rollout engine, replying the trajectory's own turns."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.training.test_cold_start_tokens_on_cpu import agent_loop_trajectories
from verl_search.quickstart.data import split_rows
from verl_search.quickstart.options import StudyOptions, protocol_options
from verl_search.training.cold_start import prompt_builder
from verl_search.training.second_hop import corpus_titles, named_titles, second_hop_rows
from verl_search.training.trajectories import (
    ANSWER_TURN,
    SEARCH_TURN,
    SECOND_SEARCH_TURN,
    gold_visible,
    observation_text,
    trajectory_tokens,
)

SETTINGS = {"max_turns": 2, "max_obs_tokens": 320, "response_length": 2 * (64 + 320) + 64}


@pytest.fixture(scope="module")
def two_hops(tiny_qwen, bm25_retriever):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    builder = prompt_builder(tiny_qwen, tokenizer)
    rows = split_rows("train", 80)
    chosen, counts = second_hop_rows(rows, bm25_retriever, tokenizer, builder, topk=3, limit=3, seed=0, **SETTINGS)
    return tokenizer, builder, chosen, counts


def test_each_second_search_names_a_page_the_first_observation_showed_and_finds_the_gold(two_hops):
    tokenizer, builder, chosen, counts = two_hops
    assert len(chosen) == counts["visible"] == 3 and counts["rows"] == len(split_rows("train", 80))
    assert counts["candidates"] > counts["first_missed"] >= counts["named"] > 3
    for row, hits, (query, second) in chosen:
        one = trajectory_tokens(row, hits, tokenizer, builder, **SETTINGS)
        assert not gold_visible(row, *one, tokenizer)  # one search does not show it
        first_seen = observation_text(*one, tokenizer)
        assert named_titles(first_seen, {query.lower(): query}, set()) or query.lower() in first_seen.lower()
        assert query not in {hit.passage.title for hit in hits}  # a page the first search did not return
        ids, mask = trajectory_tokens(row, hits, tokenizer, builder, second=(query, second), **SETTINGS)
        assert gold_visible(row, ids, mask, tokenizer)  # the second observation shows it
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
        assert trained.count("</search>") == 2 and trained.count("</answer>") == 1
        assert f"I need to look up {query}." in trained and "<information>" not in trained


@pytest.mark.parametrize("notice", [False, True], ids=["plain", "last-search-notice"])
def test_second_search_tokens_equal_the_agent_loops(tiny_qwen, two_hops, bm25_server, tmp_path, monkeypatch, notice):
    tokenizer, builder, chosen, _ = two_hops
    rows = [row for row, *_ in chosen]
    turns = {row["extra_info"]["question"].strip(): (query, row["reward_model"]["ground_truth"]["target"][0])
             for row, _, (query, _) in chosen}

    def script(prompt_text, turn):
        question = next(q for q in turns if q in prompt_text)
        query, answer = turns[question]
        return [SEARCH_TURN.format(question=question), SECOND_SEARCH_TURN.format(query=query),
                ANSWER_TURN.format(answer=answer)][turn]

    protocol = protocol_options(StudyOptions(max_turns=2, max_obs_tokens=320), "unused")
    assert protocol.response_length == SETTINGS["response_length"]
    ours = [trajectory_tokens(row, hits, tokenizer, builder, second=second, last_search_notice=notice, **SETTINGS)
            for row, hits, second in chosen]
    theirs = agent_loop_trajectories(tiny_qwen, rows, protocol, f"{bm25_server.url}/retrieve", tmp_path, monkeypatch,
                                     loop_settings={"last_search_notice": notice}, script=script)
    for (ids, mask), (loop_ids, loop_mask) in zip(ours, theirs):
        assert ids == loop_ids, tokenizer.decode(ids) + "\n----\n" + tokenizer.decode(loop_ids)
        assert mask == loop_mask
        text = tokenizer.decode(ids)
        assert text.count("no more searches") == notice  # on the second (last allowed) search only


def test_a_second_search_needs_two_turns_and_the_search_r1_protocol(two_hops):
    tokenizer, builder, chosen, _ = two_hops
    row, hits, second = chosen[0]
    with pytest.raises(ValueError, match="max_turns >= 2"):
        trajectory_tokens(row, hits, tokenizer, builder, second=second, **{**SETTINGS, "max_turns": 1})
    with pytest.raises(ValueError, match="protocol='research'"):
        trajectory_tokens(row, hits, tokenizer, builder, second=second, protocol="research", **SETTINGS)
    with pytest.raises(ValueError, match="sft-second-hop=5: between 0 and --sft-examples"):
        StudyOptions(sft_examples=4, sft_second_hop=5)
    with pytest.raises(ValueError, match="needs --max-turns >= 2"):
        StudyOptions(sft_second_hop=2, max_turns=1)


def test_titles_come_from_the_index_corpus(bm25_retriever):
    titles = corpus_titles(bm25_retriever)
    assert len(titles) > 9000 and all(len(key) >= 4 for key in titles)
    assert named_titles("He was born in France.", titles, set()) == [titles["france"]]

    class Remote:
        kind = "remote"

    with pytest.raises(ValueError, match="'remote' retriever holds none"):
        corpus_titles(Remote())


def test_grpo_questions_mix_both_kinds_as_the_cold_start_does(tiny_qwen, bm25_index, tmp_path):
    import json

    import pandas as pd

    from verl_search.datasets.preprocess import write_parquet
    from verl_search.quickstart.data import write_grpo_questions
    from verl_search.training.cold_start import ColdStartOptions

    write_parquet(split_rows("train", 120), tmp_path / "train.parquet")
    (tmp_path / "cold_start.json").write_text(json.dumps({"questions": []}))
    settings = ColdStartOptions(examples=8, second_hop=4, max_obs_tokens=320, response_length=SETTINGS["response_length"])
    counts = write_grpo_questions(tmp_path / "train.parquet", bm25_index, str(tiny_qwen), tmp_path / "cold_start.json",
                                  tmp_path / "grpo.parquet", 6, settings)
    assert counts["visible"] == 3 and counts["second_hop"]["visible"] == 3  # 6 x 4 / 8 after a second search
    assert len(pd.read_parquet(tmp_path / "grpo.parquet")) == 6
