"""Reward functions: table-driven, one comment per case."""

import numpy as np
import pytest

from verl_search.agent_protocol.vocabulary import INVALID_ACTION_MESSAGE
from verl_search.rewards import compute_score, extract_answer, gold_answers
from verl_search.agent_protocol.search_r1 import search_r1_format_ok
from verl_search.agent_protocol.tool import tool_call_format_ok
from verl_search.rewards.qa import cover_exact_match, exact_match, f1_score, normalize_answer

GOOD_TAGS = "<think>need info</think><search> capital of France </search>\n\n<information>Doc 1(Title: \"Paris\") Paris is the capital.</information>\n\n<think>got it</think><answer> Paris </answer>"
GOOD_TOOL = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["x"]}}\n</tool_call>\nuser\n<tool_response>\nDoc 1(Title: "Paris") ...\n</tool_response>\nassistant\n<answer> Paris </answer>'


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<answer> Paris </answer>", "Paris"),  # one tag is enough: verl scores the response only
        ("<answer>Rome</answer> then <answer>Paris</answer>", "Paris"),  # the last answer counts
        ("<information><answer>leak</answer></information>", None),  # retrieved text never counts
        ("<tool_response><answer>leak</answer></tool_response><answer>Paris</answer>", "Paris"),
        ("<answer>Paris</answer><information><answer>leak</answer>", "Paris"),  # unclosed block runs to the end
        ("no tags at all", None),  # nothing to score
        ("<answer>\nmulti\nline\n</answer>", "multi\nline"),  # answers may span lines
        ("I guess." + INVALID_ACTION_MESSAGE + "no tags", None),  # the correction message's own <answer> tags
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "prediction, golds, em, cover, f1",
    [
        ("Paris", ["paris"], 1.0, 1.0, 1.0),  # case
        ("The Eiffel Tower.", ["Eiffel Tower"], 1.0, 1.0, 1.0),  # article and punctuation
        ("Paris, France", ["Paris"], 0.0, 1.0, 2 / 3),  # cover-EM and partial F1
        ("London", ["Paris", "City of Light"], 0.0, 0.0, 0.0),  # wrong
        ("city of light", ["Paris", "City of Light"], 1.0, 1.0, 1.0),  # any alias
        ("", ["Paris"], 0.0, 0.0, 0.0),  # empty prediction
    ],
)
def test_qa_metrics(prediction, golds, em, cover, f1):
    assert exact_match(prediction, golds) == em
    assert cover_exact_match(prediction, golds) == cover
    assert f1_score(prediction, golds) == pytest.approx(f1)


def test_normalize_answer():
    assert normalize_answer("  The  Beatles!! ") == "beatles"


@pytest.mark.parametrize(
    "ground_truth, expected",
    [
        ({"target": ["Paris", "paris france"]}, ["Paris", "paris france"]),  # Search-R1 parquet shape
        ({"target": np.array(["Paris"], dtype=object)}, ["Paris"]),  # after a parquet round trip
        (np.array(["a", "b"]), ["a", "b"]),  # bare numpy array
        (["Paris"], ["Paris"]),  # list
        ("Paris", ["Paris"]),  # single string
    ],
)
def test_gold_answers_shapes(ground_truth, expected):
    assert gold_answers(ground_truth) == expected


@pytest.mark.parametrize("bad", [{"answer": ["x"]}, [], 42, None])
def test_gold_answers_rejects_unusable(bad):
    with pytest.raises(ValueError):
        gold_answers(bad)


@pytest.mark.parametrize(
    "response, ok",
    [
        (GOOD_TAGS, True),  # think, search, information, think, answer
        ("<think>x</think><answer>y</answer>", True),  # answer without searching
        ("<answer>y</answer>", False),  # must think first
        ("<think>x</think>chatter<answer>y</answer>", False),  # text outside tags
        ("<think>x</think><search>q</search><answer>y</answer>", False),  # search without information
        ("<think>x</think><search>q</search>", False),  # never answered
        ("<think>x</think><answer>y</answer><think>more</think>", False),  # text after the answer
    ],
)
def test_search_r1_format(response, ok):
    assert search_r1_format_ok(response)[0] is ok


@pytest.mark.parametrize(
    "response, ok",
    [
        (GOOD_TOOL, True),  # call, response, answer
        ("<answer>Paris</answer>", True),  # no tool call needed
        ("<tool_call>not json</tool_call><answer>x</answer>", False),  # unparseable call
        ('<tool_call>{"arguments": {}}</tool_call><answer>x</answer>', False),  # call without name
        ('<tool_call>{"name": "search"}', False),  # unclosed call
        ("<answer>a</answer> and <answer>b</answer>", False),  # two answers
        ("<answer>a</answer> trailing", False),  # text after the answer
        ("thinking only", False),  # no answer
    ],
)
def test_tool_call_format(response, ok):
    assert tool_call_format_ok(response)[0] is ok


GT = {"target": ["Paris"]}
F1_CREDIT = {"answer_score": "f1", "structure_format_score": 0.1}


@pytest.mark.parametrize(
    "response, kwargs, score",
    [
        (GOOD_TAGS, {}, 1.0),  # right answer: EM reward
        ("<answer>Paris</answer>", {}, 1.0),  # right answer, broken format, no format weights: still 1
        ("<answer>Paris</answer>", {"structure_format_score": 0.2}, 0.8),  # right but malformed
        ("<think>x</think><answer>Rome</answer>", {"structure_format_score": 0.2}, 0.2),  # wrong, well formed
        (GOOD_TAGS.replace("> Paris </answer>", "> Rome </answer>"),
         {"structure_format_score": 0.2, "retrieval_score": 0.1}, 0.3),  # wrong, but the answer was retrieved
        ("<answer>Rome</answer>", {"structure_format_score": 0.2, "final_format_score": 0.1}, 0.1),  # wrong, malformed
        ("no answer", {"structure_format_score": 0.2}, 0.0),  # no answer, malformed
        ("<answer>Rome</answer><answer>Paris</answer>", {"answer_spam_penalty": 0.5}, 0.5),  # spam penalised
        ("<answer>Paris</answer>", {"answer_spam_penalty": 0.5}, 1.0),  # one answer is not spam
        # ReSearch's partial credit: F1 when well formed, the format credit when well formed with F1 0, else 0
        ("<think>x</think><answer>Paris France</answer>", F1_CREDIT, pytest.approx(2 / 3)),
        (GOOD_TAGS, F1_CREDIT, 1.0),
        ("<think>x</think><answer>Rome</answer>", F1_CREDIT, 0.1),
        ("<answer>Paris</answer>", F1_CREDIT, 0.0),  # right but malformed: nothing
        ("no answer", F1_CREDIT, 0.0),
    ],
)
def test_compute_score_weights(response, kwargs, score):
    result = compute_score("nq", response, GT, {"protocol": "search_r1"}, **kwargs)
    assert result["score"] == pytest.approx(score)


def test_compute_score_refuses_an_unknown_answer_score():
    with pytest.raises(ValueError, match="answer_score='acc'.*em, f1"):
        compute_score("nq", GOOD_TAGS, GT, answer_score="acc")


def test_compute_score_fields_and_search_counts():
    result = compute_score("nq", GOOD_TOOL, GT, {"num_searches": 2, "failed_searches": 1})
    assert result == {
        "score": 1.0, "acc": 1.0, "f1": 1.0, "cover_em": 1.0, "pred": "Paris", "num_searches": 2,
        "failed_searches": 1, "format_ok": 1.0, "answered": 1.0, "num_answers": 1,
    }
    # without the agent loop's counts, searches are counted from the tags
    assert compute_score("nq", GOOD_TAGS, GT)["num_searches"] == 1
    # the correction message and retrieved text name `<search>` too; they are not the model's searches
    corrected = "<think>hmm</think>" + INVALID_ACTION_MESSAGE + "<information><search>x</search></information>"
    assert compute_score("nq", corrected, GT, {"protocol": "search_r1"})["num_searches"] == 0
    assert compute_score("nq", "nothing", GT)["pred"] == ""


def test_reward_loads_through_verl_pkg_path():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://verl_search.rewards", "name": "compute_score", "reward_kwargs": {"structure_format_score": 0.2}}}})
    fn = get_custom_reward_fn(config)
    assert fn(data_source="nq", solution_str="<answer>Paris</answer>", ground_truth=GT, extra_info={})["score"] == 0.8
