"""FlashRAG JSONL -> verl parquet: pure row transform on hand-written rows, files on real data."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO, SHARED
from verl_search.datasets.preprocess import RowError, Source, build_rows, make_row, read_examples, write_parquet
from verl_search.agent_protocol.search_r1 import SEARCH_R1_TEMPLATE


def test_make_row_tool_protocol():
    row = make_row({"id": "q7", "question": " who wrote hamlet ", "golden_answers": ["Shakespeare"]}, 3, "test", "nq")
    assert row["data_source"] == "nq" and row["agent_name"] == "tool_agent" and row["ability"] == "fact-reasoning"
    assert row["reward_model"] == {"ground_truth": {"target": ["Shakespeare"]}, "style": "rule"}
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith("Question: who wrote hamlet?")
    assert "<tool_call>" not in row["prompt"][0]["content"]  # the chat template alone says how to call tools
    info = row["extra_info"]
    assert info["index"] == 3 and info["split"] == "test" and info["id"] == "q7" and info["protocol"] == "tool"
    assert info["need_tools_kwargs"] is True
    assert info["tools_kwargs"]["search"]["create_kwargs"] == {"question": "who wrote hamlet?", "data_source": "nq", "topk": None}


def test_make_row_search_r1_protocol_uses_the_paper_prompt():
    row = make_row({"question": "who wrote hamlet?", "golden_answers": ["Shakespeare"]}, 0, "train", "nq", "search_r1")
    assert row["agent_name"] == "search_r1_agent"
    assert row["prompt"][0]["content"] == SEARCH_R1_TEMPLATE.format(question="who wrote hamlet?")


@pytest.mark.parametrize(
    "example, message",
    [
        ({"golden_answers": ["a"]}, '"question"'),  # missing question
        ({"question": "  ", "golden_answers": ["a"]}, '"question"'),  # blank question
        ({"question": "q", "golden_answers": []}, '"golden_answers"'),  # no answers
        ({"question": "q", "golden_answers": "a"}, '"golden_answers"'),  # a string, not a list
        ({"question": "q", "golden_answers": ["a", ""]}, '"golden_answers"'),  # an empty alias
    ],
)
def test_bad_rows_are_rejected(example, message):
    with pytest.raises(RowError, match=message):
        make_row(example, 0, "test", "nq")


def test_bad_rows_are_reported_with_file_and_line(tmp_path, caplog):
    path = tmp_path / "nq" / "test.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"id": "1", "question": "q1", "golden_answers": ["a"]}) + "\n{broken\n"
                    + json.dumps({"id": "3", "question": "q3", "golden_answers": []}) + "\n")
    with pytest.raises(RowError, match=r"test.jsonl:2: .*--on-bad-row skip"):
        read_examples(Source.parse(str(path)))
    kept = read_examples(Source.parse(str(path)), on_bad_row="skip")
    assert [lineno for lineno, _ in kept] == [1]
    assert "test.jsonl:2" in caplog.text and "test.jsonl:3" in caplog.text  # both skipped rows reported


def test_test_merge_samples_per_source_and_writes_parquet(tmp_path):
    qa = SHARED / "data" / "qa"
    sources = [Source.parse(str(qa / "bamboogle" / "test.jsonl")), Source.parse(f"hotpot={qa / 'hotpotqa' / 'dev.jsonl'}")]
    rows = build_rows(sources, "test", "search_r1", max_per_source=30, seed=1)
    assert [r["data_source"] for r in rows] == ["bamboogle"] * 30 + ["hotpot"] * 30
    assert [r["extra_info"]["index"] for r in rows] == list(range(60))
    assert rows == build_rows(sources, "test", "search_r1", max_per_source=30, seed=1)  # the seed fixes the sample
    assert rows != build_rows(sources, "test", "search_r1", max_per_source=30, seed=2)
    write_parquet(rows, tmp_path / "test.parquet")
    frame = pd.read_parquet(tmp_path / "test.parquet")
    assert len(frame) == 60 and list(frame["reward_model"][0]["ground_truth"]["target"]) == rows[0]["reward_model"]["ground_truth"]["target"]
    assert [p.name for p in tmp_path.iterdir()] == ["test.parquet"]  # no temporary file left


def test_script_writes_the_training_set(tmp_path):
    out = tmp_path / "train.parquet"
    result = subprocess.run(
        [sys.executable, str(REPO / "data_preprocess" / "preprocess_search_r1.py"), "--split", "train",
         "--protocol", "tool", "--max-per-source", "50", "--input", str(SHARED / "data/qa/musique/train.jsonl"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(out)
    assert len(frame) == 50 and set(frame["data_source"]) == {"musique"} and set(frame["agent_name"]) == {"tool_agent"}
