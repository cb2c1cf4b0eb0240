"""The Search-R1 tag protocol, token-exact: actions, cuts and observations.

Source: Search-R1 `search_r1/llm_agent/generation.py`. The model writes `<search> query </search>`
or `<answer> ... </answer>`; the environment appends `\\n\\n<information>...</information>\\n\\n`
after a search, and Search-R1's correction message after anything else. Unlike the original:

* the sampled token ids are kept as they are: a turn is cut to the shortest *token prefix* whose
  text holds the first closing tag (no decode + re-encode of the model's own tokens);
* observations are cut by tokens and always keep their closing `</information>` (the original
  right-truncated the whole block to 500 tokens and lost it, Search-R1 issue #127).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STOP_STRINGS = ["</search>", "</answer>"]
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
LAST_SEARCH_NOTICE = "\nThis was the last search: no more searches are allowed. Give the final answer now."
OBSERVATION_PREFIX = "\n\n<information>"
OBSERVATION_SUFFIX = "</information>\n\n"
TRUNCATION_MARK = " ...(truncated)"


@dataclass
class Action:
    """What one model turn asked for: `kind` is `search`, `answer` or `invalid`."""

    kind: str
    content: str = ""


def parse_action(text: str) -> Action:
    """The first complete `<search>`/`<answer>` block of a turn (Search-R1's `postprocess_predictions`).

    >>> parse_action("<think>hm</think><search> capital of France </search>")
    Action(kind='search', content='capital of France')
    >>> parse_action("I think it is Paris.")
    Action(kind='invalid', content='')
    """
    match = _ACTION.search(text)
    if match is None:
        return Action("invalid")
    return Action(match.group(1), match.group(2).strip())


def cut_at_first_stop(token_ids: list[int], decode, stops: list[str] = STOP_STRINGS) -> list[int]:
    """The shortest prefix of `token_ids` whose decoded text contains a stop string.

    Engines may return tokens past a stop string (no stop strings passed, a token that spans the
    tag and what follows, or a speculative decoder). Returns `token_ids` unchanged when no stop
    string occurs. `decode(ids) -> str`. Binary search: O(log n) decodes.
    """
    def has_stop(k: int) -> bool:
        text = decode(token_ids[:k])
        return any(stop in text for stop in stops)

    if not token_ids or not has_stop(len(token_ids)):
        return list(token_ids)
    low, high = 1, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if has_stop(middle):
            high = middle
        else:
            low = middle + 1
    return list(token_ids[:low])


def observation_tokens(body: str, encode, max_tokens: int, notice: str = "") -> tuple[list[int], bool]:
    """Tokens of `\\n\\n<information>{body}{notice}</information>\\n\\n`, at most `max_tokens`.

    The body is tokenised once and cut by tokens (with a `...(truncated)` mark); the prefix, the
    notice and the closing `</information>` are always kept. `encode(text) -> list[int]`.

    Returns:
        `(token_ids, truncated)`; `token_ids` is empty when even the frame does not fit.
    """
    head = encode(OBSERVATION_PREFIX)
    tail = encode(notice + OBSERVATION_SUFFIX)
    body_ids = encode(body)
    if len(head) + len(body_ids) + len(tail) <= max_tokens:
        return head + body_ids + tail, False
    mark = encode(TRUNCATION_MARK)
    room = max_tokens - len(head) - len(tail) - len(mark)
    if room < 0:
        return [], True
    return head + body_ids[:room] + mark + tail, True
