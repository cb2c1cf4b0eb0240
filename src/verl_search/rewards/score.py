"""`compute_score`: the reward of one trajectory, with verl's custom-reward signature."""

from __future__ import annotations

from typing import Any

import numpy as np

from verl_search.agent_protocol.registry import PROTOCOLS, get_protocol
from verl_search.agent_protocol.vocabulary import ENDED_WITH_EOS, FAILED_SEARCHES, NUM_SEARCHES
from verl_search.rewards.qa import (count_answers, cover_exact_match, exact_match, f1_score, retrieval_has_answer,
                                   strip_retrieved)
from verl_search.rewards.research import FORMAT_SCORE, research_score

ANSWER_SCORES = ("em", "f1")
"""What a well-formed answer earns: `em` (Search-R1) or `f1` (ReSearch's partial credit)."""


def gold_answers(ground_truth: Any) -> list[str]:
    """Gold aliases from any shape verl hands over.

    Accepts `{"target": [...]}` (Search-R1's parquet), a list or tuple, a numpy array (what a
    list becomes after a parquet round trip) or a single string.

    >>> gold_answers({"target": np.array(["Paris", "paris, france"], dtype=object)})
    ['Paris', 'paris, france']

    Raises:
        ValueError: for any other type, or no answer at all.
    """
    if isinstance(ground_truth, dict):
        if "target" not in ground_truth:
            raise ValueError(f'ground_truth dict needs a "target" key, got keys {sorted(ground_truth)}')
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, np.ndarray):
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, str):
        ground_truth = [ground_truth]
    if not isinstance(ground_truth, (list, tuple)) or not ground_truth:
        raise ValueError(f"ground_truth must be a non-empty list of answers, got {type(ground_truth).__name__}")
    return [str(answer) for answer in ground_truth]


def detect_protocol(response: str, extra_info: dict) -> str:
    """`extra_info["protocol"]` when set (our preprocessing writes it), else guessed from the tags.

    >>> detect_protocol("<search> q </search> <result>\\n...\\n</result>", {})
    'research'
    """
    protocol = extra_info.get("protocol")
    if protocol in PROTOCOLS:
        return protocol
    if "<tool_call>" in response or "<tool_response>" in response:
        return "tool"
    return "research" if "<result>" in response or "\\boxed" in response else "search_r1"


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    correct_score: float = 1.0,
    structure_format_score: float = 0.0,
    final_format_score: float = 0.0,
    retrieval_score: float = 0.0,
    answer_spam_penalty: float = 0.0,
    max_answers: int = 1,
    answer_score: str = "em",
    research_format_score: float = FORMAT_SCORE,
    **kwargs: Any,
) -> dict:
    """Score one response: exact match (or token F1) of its last `<answer>`, with optional format terms.

    The defaults give Search-R1's EM reward (1 for an exact match, else 0). The format weights
    follow Search-R1's `qa_em_format.compute_score_em`:

    * right answer: `correct_score`, minus `structure_format_score` if the format is broken;
    * wrong or no answer, format ok: `structure_format_score`, plus `retrieval_score` if a gold
      answer appeared in the retrieved text;
    * wrong answer, format broken: `final_format_score`; no answer, format broken: 0.

    With `answer_score="f1"` the score is ReSearch's partial credit (Agent-RL/ReSearch, branch
    `re-search`, `src/verl/utils/reward_score/re_search.py`, arXiv 2503.19470): 0 for a malformed
    response, else the answer's token F1, and `structure_format_score` (ReSearch: 0.1) when well
    formed with F1 0;
    `correct_score`, `final_format_score` and `retrieval_score` are not used.

    `answer_spam_penalty` is subtracted when the model wrote more than `max_answers` answer blocks.

    A response of the `research` protocol gets ReSearch's reward (`verl_search.rewards.research`:
    F1 of its `\\boxed{}` answer, `research_format_score` (0.1) when well formed with F1 0, 0 when
    malformed or cut at the length limit); the other weights do not apply to it.

    Args:
        data_source: the row's `data_source` (kept for logging; scoring does not depend on it).
        solution_str: the decoded response (verl's reward loop: response tokens only).
        ground_truth: gold answers (see `gold_answers`).
        extra_info: the row's `extra_info` merged with the trajectory's extra fields; read:
            `protocol`, `num_searches`, `failed_searches`, `ended_with_eos`.

    Returns:
        `{"score", "acc" (EM), "f1", "cover_em", "pred" ("" if none), "num_searches",
        "failed_searches", "format_ok", "answered", "num_answers"}`.

    Raises:
        ValueError: if `ground_truth` has no usable answers, or `answer_score` is not in `ANSWER_SCORES`.
    """
    if answer_score not in ANSWER_SCORES:
        raise ValueError(f"answer_score={answer_score!r}: use one of {', '.join(ANSWER_SCORES)}")
    extra_info = extra_info or {}
    golds = gold_answers(ground_truth)
    protocol = detect_protocol(solution_str, extra_info)
    spec = get_protocol(protocol)
    format_ok = spec.format_check(solution_str)[0]
    prediction = spec.extract_answer(solution_str)
    num_answers = count_answers(solution_str)
    em = exact_match(prediction, golds) if prediction is not None else 0.0
    f1 = f1_score(prediction, golds) if prediction is not None else 0.0

    if protocol == "research":
        score = research_score(solution_str, golds, extra_info.get(ENDED_WITH_EOS), research_format_score)[0]
    elif answer_score == "f1":
        score = (f1 if f1 > 0 else structure_format_score) if format_ok else 0.0
    elif em:
        score = correct_score - (0.0 if format_ok else structure_format_score)
    elif format_ok:
        score = structure_format_score + (retrieval_score if retrieval_has_answer(solution_str, golds) else 0.0)
    else:
        score = final_format_score if prediction is not None else 0.0
    if num_answers > max_answers:
        score -= answer_spam_penalty

    searches = extra_info.get(NUM_SEARCHES)
    if searches is None:  # counted from what the model wrote: the correction message names `<search>` too
        written = strip_retrieved(solution_str)
        searches = written.count("<tool_call>") if protocol == "tool" else written.count("<search>")
    return {
        "score": float(score),
        "acc": em,
        "f1": f1,
        "cover_em": cover_exact_match(prediction, golds) if prediction is not None else 0.0,
        "pred": prediction or "",
        NUM_SEARCHES: int(searches),
        FAILED_SEARCHES: int(extra_info.get(FAILED_SEARCHES) or 0),
        "format_ok": float(format_ok),
        "answered": float(prediction is not None),
        "num_answers": num_answers,
    }
