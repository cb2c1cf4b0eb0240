"""Format checks of a response, for the optional format reward.

* Search-R1 tag protocol: the model's turns must follow
  `<think>..</think>` then either `<search>..</search>` (answered by `<information>..</information>`,
  then `<think>` again) or `<answer>..</answer>`, which ends the response; only whitespace between
  tags. This is Search-R1's `is_valid_sequence` (`verl/utils/reward_score/qa_em_format.py`),
  applied to the response alone (verl gives the reward the response, not the prompt, so there is
  no `<|im_start|>assistant` marker to look for).
* Tool-call protocol (hermes): every `<tool_call>` is closed and holds a JSON object with a
  `name`; the response ends with one `<answer>..</answer>` after the last tool response.
"""

from __future__ import annotations

import json

from verl_search.protocol.vocabulary import FORMAT_TAG_RE, INFORMATION_RE, TOOL_CALL_RE, TOOL_RESPONSE_RE
from verl_search.rewards.qa import normalize_answer

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


def tool_call_format_ok(response: str) -> tuple[bool, str]:
    """Whether a tool-call (hermes) response is well formed; `(ok, reason)`.

    >>> tool_call_format_ok('<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    ...                     '<tool_response>..</tool_response><answer>x</answer>')
    (True, 'valid')
    """
    own = TOOL_RESPONSE_RE.sub(" ", response)
    if own.count("<tool_call>") != own.count("</tool_call>"):
        return False, "unclosed <tool_call>"
    for body in TOOL_CALL_RE.findall(own):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            return False, "a <tool_call> is not JSON"
        if not isinstance(call, dict) or "name" not in call:
            return False, 'a <tool_call> has no "name"'
    tail = own.split("</tool_call>")[-1]
    if tail.count("<answer>") != 1 or tail.count("</answer>") != 1:
        return False, "no single <answer> after the last tool call"
    if tail.split("</answer>")[-1].strip():
        return False, "text after </answer>"
    return True, "valid"


def retrieval_has_answer(response: str, golds: list[str]) -> bool:
    """Whether a normalised gold answer occurs in some `<information>` block (Search-R1's
    `is_retrieval_correct`)."""
    blocks = [normalize_answer(block) for block in INFORMATION_RE.findall(response)]
    return any(normalize_answer(g) and normalize_answer(g) in block for g in golds for block in blocks)
