"""The cold start's trajectories are token for token what the Search-R1 (and the ReSearch) agent loop builds.

Real: verl's `AgentLoopWorker` and dataset, our `SearchR1AgentLoop` registered through the YAML the
quickstart's GRPO run uses (`grpo.agent_loop_yaml`), the Qwen2.5 tokenizer and chat template, a
BM25 server over the mini corpus (uvicorn on 127.0.0.1) and the same index in process for the cold
start. Stand-in: `ScriptedLLM` for the rollout engine, replying the cold start's own two turns, so
the two token sequences and masks must agree exactly.
"""

from __future__ import annotations

import asyncio

import pytest
import yaml
from transformers import AutoTokenizer

from tests.verl_helpers import ScriptedLLM
from verl_search.datasets.preprocess import write_parquet
from verl_search.eval.batch import load_dataset, make_batch
from verl_search.verl_config.compose import compose_verl_config
from verl_search.training.cold_start import (
    ANSWER_TURN,
    RESEARCH_ANSWER_TURN,
    RESEARCH_SEARCH_TURN,
    SEARCH_TURN,
    SearchTrajectoryDataset,
    answerable_rows,
    gold_visible,
    observation_text,
    prompt_builder,
    trajectory_tokens,
    visible_rows,
    write_trajectories,
)
from verl_search.quickstart.data import split_rows
from verl_search.quickstart.grpo import agent_loop_yaml
from verl_search.quickstart.options import StudyOptions, protocol_options


@pytest.fixture(scope="module")
def chosen(bm25_retriever):
    """Three training questions whose gold answer is in their own top-3 passages."""
    return answerable_rows(split_rows("train", 30), bm25_retriever, 3, 3, seed=0)


def agent_loop_trajectories(tiny_qwen, rows, protocol, url, folder, monkeypatch, turns=(SEARCH_TURN, ANSWER_TURN),
                            loop_settings=None, script=None):
    """`(input_ids, mask)` per row as verl's worker + our agent loop build them (prompt mask 0); the scripted model
    writes `turns` (a search turn, then an answer turn), or what `script(prompt_text, turn)` returns;
    `loop_settings` update every entry of the loops' YAML."""
    from verl.experimental.agent_loop import AgentLoopWorker

    monkeypatch.setenv("VERL_SEARCH_URL", url)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    answers = {row["extra_info"]["question"].strip(): row["reward_model"]["ground_truth"]["target"][0] for row in rows}

    def two_turns(prompt_text, turn):
        question = next(q for q in answers if q in prompt_text)
        return turns[0].format(question=question) if turn == 0 else turns[1].format(answer=answers[question])

    script = script or two_turns

    data = folder / "rows.parquet"
    write_parquet(rows, data)
    loops = agent_loop_yaml(protocol, folder / "loops.yaml")
    if loop_settings:
        entries = yaml.safe_load(loops.read_text())
        for entry in entries:
            entry.update(loop_settings)
        loops.write_text(yaml.safe_dump(entries))
    config = compose_verl_config([
        f"actor_rollout_ref.model.path={tiny_qwen}", "actor_rollout_ref.rollout.name=sglang",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        f"actor_rollout_ref.rollout.prompt_length={protocol.prompt_length}",
        f"actor_rollout_ref.rollout.response_length={protocol.response_length}",
        f"data.train_files={data}", f"data.val_files={data}",
    ])
    worker = AgentLoopWorker(config, ScriptedLLM(tokenizer, script))
    dataset = load_dataset(data, tokenizer, config.data)
    output = asyncio.run(worker.generate_sequences(make_batch(dataset, range(len(dataset)))))
    width = output.batch["prompts"].shape[1]
    out = []
    for i in range(len(rows)):
        attention = output.batch["attention_mask"][i].tolist()
        prompt = [t for t, a in zip(output.batch["prompts"][i].tolist(), attention[:width]) if a]
        valid = sum(attention[width:])
        response = output.batch["responses"][i, :valid].tolist()
        mask = output.batch["response_mask"][i, :valid].tolist()
        out.append((prompt + response, [0] * len(prompt) + mask))
    return out


@pytest.mark.parametrize("max_turns, notice", [(2, False), (1, True)], ids=["two-turns", "one-turn-with-notice"])
def test_cold_start_tokens_equal_the_agent_loops(tiny_qwen, chosen, bm25_server, tmp_path, monkeypatch, max_turns,
                                                 notice):
    options = StudyOptions(max_turns=max_turns, max_obs_tokens=120)
    protocol = protocol_options(options, "unused")
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    builder = prompt_builder(tiny_qwen, tokenizer)
    ours = [trajectory_tokens(row, hits, tokenizer, builder, max_turns=max_turns, max_obs_tokens=120,
                              response_length=protocol.response_length, last_search_notice=notice)
            for row, hits in chosen]
    theirs = agent_loop_trajectories(tiny_qwen, [row for row, _ in chosen], protocol, f"{bm25_server.url}/retrieve",
                                     tmp_path, monkeypatch, loop_settings={"last_search_notice": notice})
    for (ids, mask), (loop_ids, loop_mask) in zip(ours, theirs):
        assert ids == loop_ids, tokenizer.decode(ids) + "\n----\n" + tokenizer.decode(loop_ids)
        assert mask == loop_mask
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
        assert "<information>" not in trained and "Doc 1(Title:" not in trained  # observations masked
        assert "</search>" in trained and "</answer>" in trained
        assert ("no more searches" in tokenizer.decode(ids)) == notice


def test_research_cold_start_tokens_equal_the_research_loops(tiny_qwen, bm25_retriever, bm25_server, tmp_path,
                                                             monkeypatch):
    from verl_search.llm.models import end_of_sequence_ids

    chosen = answerable_rows(split_rows("train", 30, protocol="research"), bm25_retriever, 3, 3, seed=0)
    options = StudyOptions(protocol="research", max_obs_tokens=120)
    protocol = protocol_options(options, "unused")
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    builder = prompt_builder(tiny_qwen, tokenizer)
    end_ids = end_of_sequence_ids(tokenizer, str(tiny_qwen))
    ours = [trajectory_tokens(row, hits, tokenizer, builder, max_turns=2, max_obs_tokens=120, protocol="research",
                              response_length=protocol.response_length, end_ids=end_ids) for row, hits in chosen]
    theirs = agent_loop_trajectories(tiny_qwen, [row for row, _ in chosen], protocol, f"{bm25_server.url}/retrieve",
                                     tmp_path, monkeypatch, (RESEARCH_SEARCH_TURN, RESEARCH_ANSWER_TURN + "<|im_end|>"))
    for (ids, mask), (loop_ids, loop_mask) in zip(ours, theirs):
        assert ids == loop_ids, tokenizer.decode(ids) + "\n----\n" + tokenizer.decode(loop_ids)
        assert mask == loop_mask
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
        assert "<result>" not in trained and "\\boxed{" in trained and trained.endswith("</answer><|im_end|>")
        assert ids[-1] == end_ids[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_the_sft_dataset_yields_what_was_written(tiny_qwen, chosen, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    builder = prompt_builder(tiny_qwen, tokenizer)
    settings = {"max_turns": 2, "max_obs_tokens": 160, "response_length": 608}
    longest, visible = write_trajectories(chosen, tokenizer, builder, tmp_path / "t.parquet", **settings)
    assert visible == sum(gold_visible(row, *trajectory_tokens(row, hits, tokenizer, builder, **settings), tokenizer)
                          for row, hits in chosen)
    dataset = SearchTrajectoryDataset(str(tmp_path / "t.parquet"), tokenizer, {"pad_mode": "no_padding",
                                                                               "max_length": longest})
    assert len(dataset) == len(chosen)
    for item, (row, hits) in zip(dataset, chosen):
        ids, mask = trajectory_tokens(row, hits, tokenizer, builder, **settings)
        assert item["input_ids"].tolist() == ids and item["loss_mask"].tolist() == mask
        assert item["position_ids"].tolist() == list(range(len(ids)))
    with pytest.raises(ValueError, match="max_length"):
        SearchTrajectoryDataset(str(tmp_path / "t.parquet"), tokenizer, {"max_length": longest - 1})
    with pytest.raises(ValueError, match="pad_mode"):
        SearchTrajectoryDataset(str(tmp_path / "t.parquet"), tokenizer, {"pad_mode": "right"})


def test_the_cold_start_teaches_only_answers_its_observation_shows(tiny_qwen, bm25_retriever, tmp_path):
    """With a 60-token observation the first answerable questions (gold in the full top-3 passages) mostly lose their
    gold to the cut; `visible_rows` examines more candidates instead and keeps only trajectories whose observation,
    as the agent loop renders it (the tokens `test_cold_start_tokens_equal_the_agent_loops` pins), shows the gold."""
    import pandas as pd

    from verl_search.rewards.qa import normalize_answer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    builder = prompt_builder(tiny_qwen, tokenizer)
    settings = {"max_turns": 2, "max_obs_tokens": 60, "response_length": 608}
    rows = split_rows("train", 60)
    chosen, counts = visible_rows(rows, bm25_retriever, tokenizer, builder, topk=3, limit=3, seed=0, **settings)
    assert len(chosen) == counts["visible"] == 3 and counts["rows"] == 60
    assert counts["candidates"] > counts["in_top_k"] > 3  # more candidates, not fewer trajectories
    for row, hits in chosen:
        ids, mask = trajectory_tokens(row, hits, tokenizer, builder, **settings)
        seen = tokenizer.decode(ids).split("<information>")[-1].split("</information>")[0]  # the prompt names the tags
        assert observation_text(ids, mask, tokenizer).strip().startswith("<information>")
        assert any(normalize_answer(g) in normalize_answer(seen) for g in row["reward_model"]["ground_truth"]["target"])
    cut = [not gold_visible(row, *trajectory_tokens(row, hits, tokenizer, builder, **settings), tokenizer)
           for row, hits in answerable_rows(rows, bm25_retriever, 3, 3, seed=0)]
    assert any(cut)  # the old rule's first picks: gold in the passages, cut out of what the model sees
    longest, visible = write_trajectories(chosen, tokenizer, builder, tmp_path / "t.parquet", **settings)
    assert visible == 3 and pd.read_parquet(tmp_path / "t.parquet")["gold_visible"].tolist() == [True] * 3
    # too few candidates qualify: all the file has, counted, rather than a silent short list
    few, counts = visible_rows(rows[:10], bm25_retriever, tokenizer, builder, topk=3, limit=5, seed=0, **settings)
    assert counts["candidates"] == 10 and len(few) == counts["visible"] < 5
