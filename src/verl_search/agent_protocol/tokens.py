"""The Search-R1 tag protocol, token-exact: cuts and observations (the vocabulary is `verl_search.agent_protocol.vocabulary`).

Source: Search-R1 `search_r1/llm_agent/generation.py`. The model writes `<search> query </search>`
or `<answer> ... </answer>`; the environment appends `\\n\\n<information>...</information>\\n\\n`
after a search, and Search-R1's correction message after anything else. Unlike the original:

* the sampled token ids are kept as they are: a turn is cut to the shortest *token prefix* whose
  text holds the first closing tag (no decode + re-encode of the model's own tokens);
* observations are cut by tokens and always keep their closing `</information>` (the original
  right-truncated the whole block to 500 tokens and lost it, Search-R1 issue #127).
"""

from __future__ import annotations

from verl_search.agent_protocol.vocabulary import OBSERVATION_PREFIX, OBSERVATION_SUFFIX, STOP_STRINGS, TRUNCATION_MARK


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


def observation_tokens(body: str, encode, max_tokens: int, notice: str = "", prefix: str = OBSERVATION_PREFIX,
                       suffix: str = OBSERVATION_SUFFIX) -> tuple[list[int], bool]:
    """Tokens of `{prefix}{body}{notice}{suffix}` (default: Search-R1's
    `\\n\\n<information>...</information>\\n\\n`), at most `max_tokens`.

    The body is tokenised once and cut by tokens (with a `...(truncated)` mark); the prefix, the
    notice and the suffix (the closing tag) are always kept. `encode(text) -> list[int]`.

    Returns:
        `(token_ids, truncated)`; `token_ids` is empty when even the frame does not fit.
    """
    head = encode(prefix)
    tail = encode(notice + suffix)
    body_ids = encode(body)
    if len(head) + len(body_ids) + len(tail) <= max_tokens:
        return head + body_ids + tail, False
    mark = encode(TRUNCATION_MARK)
    room = max_tokens - len(head) - len(tail) - len(mark)
    if room < 0:
        return [], True
    return head + body_ids[:room] + mark + tail, True
