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

from verl_search.agent_protocol.answers import count_answers, extract_answer, strip_retrieved  # noqa: F401 (re-exported)
from verl_search.agent_protocol.vocabulary import (INFORMATION_RE, INVALID_ACTION_MESSAGE, LAST_SEARCH_NOTICE,
                                             NO_PASSAGES, TRUNCATION_MARK)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation.

    >>> normalize_answer("  The Eiffel-Tower! ")
    'eiffeltower'
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold alias, else 0.0."""
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(g) for g in golds))


def cover_exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 if a normalised gold alias occurs inside the normalised prediction (Search-R1's
    `subem_check`), else 0.0."""
    normalized = normalize_answer(prediction)
    return float(any(normalize_answer(g) and normalize_answer(g) in normalized for g in golds))


_YES_NO = ("yes", "no", "noanswer")


def f1_score(prediction: str, golds: Iterable[str], *, yes_no_exact: bool = False) -> float:
    """Best token-level F1 between the prediction and a gold alias (SQuAD), in [0, 1].

    `yes_no_exact`: a `yes` / `no` / `noanswer` prediction or gold alias only counts when both are equal
    (ReSearch's `get_f1_score`, `src/verl/utils/reward_score/re_search.py`, branch `re-search`).

    >>> f1_score("the Paris city", ["Paris"])
    0.6666666666666666
    >>> f1_score("yes", ["yes indeed"]), f1_score("yes", ["yes indeed"], yes_no_exact=True)
    (0.6666666666666666, 0.0)
    """
    normalized = normalize_answer(prediction)
    prediction_tokens = normalized.split()
    best = 0.0
    for gold in golds:
        expected = normalize_answer(gold)
        if yes_no_exact and (normalized in _YES_NO or expected in _YES_NO) and normalized != expected:
            continue
        gold_tokens = expected.split()
        common = Counter(prediction_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(prediction_tokens), overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def retrieval_has_answer(response: str, golds: Iterable[str]) -> bool:
    """Whether a normalised gold answer occurs in some `<information>` block (Search-R1's
    `is_retrieval_correct`)."""
    blocks = [normalize_answer(block) for block in INFORMATION_RE.findall(response)]
    return any(normalize_answer(g) and normalize_answer(g) in block for g in golds for block in blocks)


def answer_in_text(text: str, golds: Iterable[str]) -> bool:
    """Whether a normalised gold alias occurs in the normalised `text` as whole words: the gold is
    *visible* in what a model read (an observation, as the agent loop rendered it). Stricter than
    `retrieval_has_answer`'s substring test, which counts `ann` inside `anne` and `no` inside `not`.

    >>> answer_in_text("Doc 1(Title: \\"Jaws\\") Directed by Steven Spielberg.", ["steven spielberg"])
    True
    >>> answer_in_text("Anne Boleyn was queen.", ["Ann"]), answer_in_text("", ["Ann"])
    (False, False)
    """
    padded = f" {normalize_answer(text)} "
    return any(normalize_answer(g) and f" {normalize_answer(g)} " in padded for g in golds)


_FRAME = re.compile(r"</?(?:information|result)>|Doc \d+\(Title: |" + "|".join(
    re.escape(text) for text in (TRUNCATION_MARK, LAST_SEARCH_NOTICE, INVALID_ACTION_MESSAGE, NO_PASSAGES)))


def answer_in_observation(observation: str, golds: Iterable[str]) -> bool:
    """`answer_in_text` on an observation as the model read it (an agent loop's decoded observation tokens),
    the environment's own words removed first (the `<information>` / `<result>` tags, `Doc k(Title: `, the
    truncation mark, the last-search notice, the correction message, "No passages found."): a gold `1` is not
    visible through `Doc 1`, nor a gold `no` through an empty search.

    >>> answer_in_observation("<information>Doc 1(Title: \\"Jaws\\") A 1975 film ...(truncated)</information>", ["1"])
    False
    >>> answer_in_observation("<information>Doc 1(Title: \\"Jaws\\") A 1975 film.</information>", ["Jaws"])
    True
    >>> answer_in_observation("<information>No passages found.</information>", ["no"])
    False
    """
    return answer_in_text(_FRAME.sub(" ", observation), golds)
