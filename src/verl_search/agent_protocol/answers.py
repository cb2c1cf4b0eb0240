"""Where the model's own answer is in a tag-protocol response (Search-R1 and tool-call protocols).

The response holds text the environment wrote (observations, fixed messages); only what the model
itself wrote is ever an answer. Standard library only: the rewards, eval and the protocols share it.
"""

from __future__ import annotations

from verl_search.agent_protocol.vocabulary import ANSWER_RE, INVALID_ACTION_MESSAGE, LAST_SEARCH_NOTICE, RETRIEVED_RE


def strip_retrieved(response: str) -> str:
    """What the model itself wrote: the response without `<information>...</information>` /
    `<tool_response>...</tool_response>` blocks (an unclosed block runs to the end) and without
    the agent loop's fixed messages. Search-R1's correction message contains the literal text
    `<answer> and </answer>`; left in, it would be scored as the model's answer."""
    for message in (INVALID_ACTION_MESSAGE, LAST_SEARCH_NOTICE):
        response = response.replace(message, " ")
    return RETRIEVED_RE.sub(" ", response)


def extract_answer(response: str) -> str | None:
    """The last `<answer>...</answer>` the model wrote, stripped; `None` if there is none.

    Only the response is given (verl's reward loop decodes the response tokens, not the prompt),
    so one answer tag suffices. Search-R1's `extract_solution` scores prompt + response and
    therefore needs two tags (the prompt's example `<answer> Beijing </answer>` is the first;
    Search-R1 issue #79); that rule would reject every correct response here.

    >>> extract_answer("<think>..</think><answer> Paris </answer>")
    'Paris'
    >>> extract_answer("<information><answer>leak</answer></information>") is None
    True
    """
    matches = ANSWER_RE.findall(strip_retrieved(response))
    return matches[-1].strip() if matches else None


def count_answers(response: str) -> int:
    """How many `<answer>` blocks the model wrote (retrieved text excluded)."""
    return len(ANSWER_RE.findall(strip_retrieved(response)))


