"""Answer extraction and QA metrics: EM, token F1 and cover-EM with SQuAD normalisation.

Normalisation follows Search-R1 (`verl/utils/reward_score/qa_em.py`, from the SQuAD v1.1
evaluation script): lower-case, drop punctuation, drop the articles a/an/the, collapse spaces.
A prediction is scored against every gold alias and the best alias counts.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

from verl_search.protocol.vocabulary import ANSWER_RE, INVALID_ACTION_MESSAGE, LAST_SEARCH_NOTICE, RETRIEVED_RE

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation.

    >>> normalize_answer("  The Eiffel-Tower! ")
    'eiffeltower'
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


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


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold alias, else 0.0."""
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(g) for g in golds))


def cover_exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 if a normalised gold alias occurs inside the normalised prediction (Search-R1's
    `subem_check`), else 0.0."""
    normalized = normalize_answer(prediction)
    return float(any(normalize_answer(g) and normalize_answer(g) in normalized for g in golds))


def f1_score(prediction: str, golds: Iterable[str]) -> float:
    """Best token-level F1 between the prediction and a gold alias (SQuAD), in [0, 1]."""
    prediction_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_tokens = normalize_answer(gold).split()
        common = Counter(prediction_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(prediction_tokens), overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
