"""The baselines (`--protocol direct | cot | rag | ircot`) through `verl-search eval`: verl's AgentLoopWorker, our
agent loops registered through the shipped YAML, a real BM25 server over the mini corpus, our rewards, records
and report. Stand-in: `ScriptedLLM` for the engine. One `run_eval` over rows of the four protocols (each row
selects its own loop; `data_source` is the protocol, so the report has one row per baseline)."""

import json

import pytest
import requests
from transformers import AutoTokenizer

from tests.conftest import MINI_QA
from tests.verl_helpers import ScriptedLLM
from verl_search.datasets.preprocess import make_row, write_parquet
from verl_search.eval.harness import EvalOptions, run_eval
from verl_search.eval.rows import select_rows
from verl_search.agent_protocol import baselines, ircot
from verl_search.agent_protocol.registry import get_protocol

QA = [json.loads(line) for line in MINI_QA.read_text().splitlines()]
GALLU = next(r for r in QA if r["question"] == "If Gallu is a demon Lilu is what?")  # gold "a spirit"
NOLAN = next(r for r in QA if r["question"].startswith("Are Christopher Nolan and Sathish Kalathil"))  # gold "yes"
PROTOCOLS = ("direct", "cot", "rag", "ircot")
THOUGHT = "Lilu is a female demon in Mesopotamian mythology."


def script(prompt: str, turn: int) -> str:
    """Right answers for GALLU, wrong ones for NOLAN; IRCoT: one thought then the answer for GALLU, thoughts
    that never answer for NOLAN."""
    gallu = GALLU["question"] in prompt
    if "multi-hop reasoning" in prompt:  # IRCoT
        if not gallu:  # a line break first, then thoughts that never answer
            return "\n" if turn == 0 else f"Sathish Kalathil made film number {turn}. And more"
        # the first thought is cut at its '.'; the answer, cut at 'spirit.', goes on to </answer>
        steps = [f"{THOUGHT} Then another sentence.", "So the answer is: <answer> a spirit. </answer>", " </answer>"]
        return steps[turn]
    answer = "a spirit" if gallu else "no"
    if "based on your own knowledge" in prompt:  # direct
        return f"<answer> {answer} </answer>"
    return f"<think>I reason.</think> <answer> {answer} </answer>"  # CoT and RAG


def top(server, query: str, k: int = 3) -> list[dict]:
    response = requests.post(f"{server.url}/retrieve", json={"queries": [query], "topk": k}, timeout=10)
    return [hit["document"] for hit in response.json()["result"][0]]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, tiny_qwen, bm25_server):
    tmp = tmp_path_factory.mktemp("baselines")
    rows = [make_row(r, len(PROTOCOLS) * i + j, "test", p, p) for i, r in enumerate([GALLU, NOLAN])
            for j, p in enumerate(PROTOCOLS)]
    write_parquet(rows, tmp / "rows.parquet")
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    llm = ScriptedLLM(tokenizer, script)
    options = EvalOptions(data=[str(tmp / "rows.parquet")], out=str(tmp / "run"), batch_size=8,
                          retrieval_url=f"{bm25_server.url}/retrieve", max_turns=ircot.MAX_STEPS)  # IRCoT's cap
    summary = run_eval(options, engine=(llm, tokenizer, str(tiny_qwen)))
    records = {r["id"]: r for r in map(json.loads, (tmp / "run" / "trajectories.jsonl").read_text().splitlines())}
    return llm, summary, records


def calls_of(llm, protocol: str, row: dict) -> list[tuple]:
    marker = {"direct": "based on your own knowledge", "cot": "first have a reasoning process",
              "rag": "potentially useful context", "ircot": "multi-hop reasoning"}[protocol]
    request = next(c[0] for c in llm.calls if row["question"] in c[1] and marker in c[1]
                   and (protocol != "cot" or "potentially useful context" not in c[1]))
    return [c for c in llm.calls if c[0] == request]


@pytest.mark.parametrize("protocol", ["direct", "cot"])
def test_no_retrieval_baselines_answer_from_the_prompt_alone(evaluated, protocol):
    llm, summary, records = evaluated
    (call,) = calls_of(llm, protocol, GALLU)  # one model turn
    assert "Doc 1(Title:" not in call[1] and "Context:" not in call[1]  # no passages
    assert call[2]["stop"] == ["</answer>"]
    if protocol == "direct":  # FlashRAG's zero-shot system prompt, then "Question: ..."
        assert baselines.DIRECT_SYSTEM in call[1] and f"Question: {GALLU['question']}" in call[1]
    else:  # Search-R1's prompt without search
        assert baselines.COT_TEMPLATE.format(question=GALLU["question"]) in call[1]
    right, wrong = records[f"{protocol}/{GALLU['id']}"], records[f"{protocol}/{NOLAN['id']}"]
    assert (right["prediction"], right["em"], right["num_searches"], right["format_ok"]) == ("a spirit", 1.0, 0, 1.0)
    assert (wrong["prediction"], wrong["em"]) == ("no", 0.0)
    assert summary[protocol]["em"]["mean"] == 0.5 and summary[protocol]["searched"] == 0.0


def test_rag_puts_the_questions_top_k_passages_in_the_prompt(evaluated, bm25_server):
    llm, summary, records = evaluated
    (call,) = calls_of(llm, "rag", GALLU)
    expected = top(bm25_server, GALLU["question"])
    for i, document in enumerate(expected):  # Search-R1's nq_rag.py lines, in rank order, after the question
        title, _, text = document["contents"].partition("\n")
        assert f"Doc {i + 1}(Title: {title}) {text[:80]}" in call[1]
    assert f"Question: {GALLU['question']} Context: Doc 1(Title:" in call[1]
    assert "{retrieved_passages}" not in call[1]
    record = records[f"rag/{GALLU['id']}"]
    assert record["num_searches"] == 1 and record["turns"][0]["queries"] == [GALLU["question"]]
    assert record["turns"][0]["generated"] == "" and record["turns"][0]["observation"] in call[1]
    assert (record["prediction"], record["em"], record["format_ok"]) == ("a spirit", 1.0, 1.0)
    assert summary["rag"]["searched"] == 1.0 and summary["rag"]["mean_searches"] == 1.0


def test_ircot_searches_each_thought_and_shows_its_passages_in_the_next_prompt(evaluated, bm25_server):
    llm, _, records = evaluated
    calls = calls_of(llm, "ircot", GALLU)
    assert len(calls) == 3  # the thought, the answer, its continuation to </answer>
    assert [c[2]["stop"] for c in calls] == [[".", "\n", "</answer>"], [".", "\n", "</answer>"], ["</answer>"]]
    first, second = calls[0][1], calls[1][1]
    for document in top(bm25_server, GALLU["question"]):  # the question's passages, FlashRAG's format
        assert ircot.format_passages([document]) in first
    new = [d for d in top(bm25_server, THOUGHT) if ircot.format_passages([d]) not in first]
    assert new and all(ircot.format_passages([d]) in second for d in new)  # the thought's passages, added
    assert second.endswith(THOUGHT) and second.index("Question:") < second.index(THOUGHT)
    record = records[f"ircot/{GALLU['id']}"]
    assert record["num_searches"] == 2
    assert [t["queries"] for t in record["turns"]] == [[GALLU["question"]], [THOUGHT], []]
    assert record["turns"][1]["generated"] == THOUGHT and record["turns"][1]["new_passages"] == len(new)
    assert record["turns"][2]["generated"] == "So the answer is: <answer> a spirit. </answer>"
    assert (record["prediction"], record["em"], record["format_ok"]) == ("a spirit.", 1.0, 1.0)


def test_ircot_stops_after_max_retrievals_with_an_answer_step(evaluated):
    llm, summary, records = evaluated
    calls = calls_of(llm, "ircot", NOLAN)
    assert len(calls) == 1 + ircot.MAX_STEPS  # --max-turns as max_retrievals, the first step generated twice
    assert calls[-1][2]["stop"] == ["</answer>"] and all(c[2]["stop"][0] == "." for c in calls[:-1])
    assert calls[1][1].endswith("\n")  # the blank start kept, the thought generated on after it
    assert "Sathish Kalathil made film number 4." in calls[-1][1]  # every earlier thought precedes the last step
    record = records[f"ircot/{NOLAN['id']}"]
    assert record["num_searches"] == ircot.MAX_STEPS  # the question, then 4 thoughts
    assert record["turns"][1]["generated"] == "\nSathish Kalathil made film number 1."
    queries = [t["queries"] for t in record["turns"]]
    assert queries[1:5] == [[f"Sathish Kalathil made film number {k}."] for k in range(1, 5)] and queries[5] == []
    assert record["turns"][5]["generated"] == "Sathish Kalathil made film number 5. And more"  # the answer step
    assert (record["prediction"], record["em"], record["answered"]) == ("", 0.0, False)
    assert summary["ircot"]["n"] == 2 and summary["ircot"]["em"]["mean"] == 0.5


def test_protocol_rows_select_their_loop_and_hold_the_passage_slot():
    for name in PROTOCOLS:
        (row,) = select_rows([str(MINI_QA)], name, 1, 0)[:1]
        spec = get_protocol(name)
        assert row["agent_name"] == spec.agent_name and row["extra_info"]["protocol"] == name
        slot = any(baselines.PASSAGES_SLOT in m["content"] for m in row["prompt"])
        assert slot == (name in ("rag", "ircot")) and spec.retrieves == (name not in ("direct", "cot"))
    with pytest.raises(ValueError, match="preprocess the rows with this protocol"):
        baselines.fill_passages([{"role": "user", "content": "no slot"}], "passages")


def test_no_retrieval_baselines_need_no_index(tmp_path, tiny_qwen):
    """`--protocol direct` (or cot) runs without --index or --retrieval-url; a retrieving protocol names the fix."""
    from verl_search.eval.verl_run import NO_RETRIEVAL_URL, retrieval_service

    write_parquet([make_row(GALLU, 0, "test", "direct", "direct")], tmp_path / "rows.parquet")
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    options = EvalOptions(data=[str(tmp_path / "rows.parquet")], out=str(tmp_path / "run"), protocol="direct")
    summary = run_eval(options, engine=(ScriptedLLM(tokenizer, script), tokenizer, str(tiny_qwen)))
    assert summary["direct"]["em"]["mean"] == 1.0 and summary["direct"]["searched"] == 0.0
    with retrieval_service(options) as url:
        assert url == NO_RETRIEVAL_URL
    with pytest.raises(ValueError, match="--protocol rag retrieves: pass --retrieval-url"):
        with retrieval_service(options, EvalOptions(data=options.data, protocol="rag")):
            pass
