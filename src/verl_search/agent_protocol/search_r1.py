"""The Search-R1 tag protocol (Search-R1, arXiv 2503.09516; `PeterGriffinJin/Search-R1`).

The model writes `<think>..</think>`, then `<search> query </search>` (the environment answers
`\n\n<information>...</information>\n\n`, loss mask 0) or `<answer> ... </answer>`, which ends the
trajectory. The prompt is the paper's, verbatim from `scripts/data_process/nq_search.py`
(`make_prefix`, template "base"); the format rules are Search-R1's `is_valid_sequence`
(`verl/utils/reward_score/qa_em_format.py`), applied to the response alone (verl gives the reward
the response, not the prompt, so there is no `<|im_start|>assistant` marker to look for).
Agent loop: `verl_search.agent_loop.search_r1.SearchR1AgentLoop`; token-exact cuts:
`verl_search.agent_protocol.tokens`.
"""

from __future__ import annotations

from verl_search.agent_protocol.answers import extract_answer
from verl_search.agent_protocol.base import Protocol
from verl_search.agent_protocol.vocabulary import (DEFAULT_TOPK, FORMAT_TAG_RE, OBSERVATION_PREFIX, OBSERVATION_SUFFIX,
                                             STOP_STRINGS, parse_action)

SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_INSIDE = {"in_think", "in_search", "in_information", "in_answer"}


def search_r1_format_ok(response: str) -> tuple[bool, str]:
    """Whether a tag-protocol response is well formed; `(ok, reason)`.

    >>> search_r1_format_ok("<think>x</think><answer>y</answer>")
    (True, 'valid')
    >>> search_r1_format_ok("<answer>y</answer>")[0]
    False
    """
    state = "start"
    for part in FORMAT_TAG_RE.split(response):
        if not part.strip():
            continue
        if FORMAT_TAG_RE.fullmatch(part):
            following = _TRANSITIONS.get((state, part))
            if following is None:
                return False, f"unexpected {part} in state {state}"
            state = following
        elif state not in _INSIDE:
            return False, f"text outside tags in state {state}: {part.strip()[:40]!r}"
    if state != "end":
        return False, f"incomplete: ended in state {state}"
    return True, "valid"



SEARCH_R1 = Protocol(
    name="search_r1",
    agent_name="search_r1_agent",
    summary="Search-R1 tags: <search> query </search>, <information> results, <answer> ... </answer>",
    messages=lambda question: [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=question)}],
    format_check=search_r1_format_ok,
    extract_answer=extract_answer,
    parse_action=parse_action,
    stop=tuple(STOP_STRINGS),
    observation_prefix=OBSERVATION_PREFIX,
    observation_suffix=OBSERVATION_SUFFIX,
    default_topk=DEFAULT_TOPK,
    source="Search-R1 search_r1/llm_agent/generation.py, scripts/data_process/nq_search.py",
    search_cap_key="max_turns",
)
