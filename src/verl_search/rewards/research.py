"""ReSearch's reward: token F1 of the `\\boxed{}` answer, 0.1 when well formed and wrong, 0 when malformed.

Rules from `Agent-RL/ReSearch`, branch `re-search`, `src/verl/utils/reward_score/re_search.py`
(`compute_score`, `get_f1_score`), in this order:

1. the response breaks a format rule (`verl_search.agent_protocol.research.format_check`): 0;
2. the response did not end with EOS (cut at the length limit): 0;
3. no `<answer>` block, or no `\\boxed{}` in it that closes: 0;
4. otherwise the best token F1 of the boxed answer against the gold answers (SQuAD normalisation;
   a `yes`/`no`/`noanswer` prediction or gold only counts when both are equal), and
   `format_score` (0.1) when that F1 is 0.

verl decodes the response without special tokens, so the EOS of rule 2 is not in the text: the
ReSearch agent loop records it in the trajectory field `ended_with_eos` (any of the tokenizer's and the
generation config's EOS tokens; ReSearch checks the tokenizer's only); when that field is absent
(a response scored outside our agent loop) rule 2 is skipped. ReSearch scores base-model
responses only up to a second `Assistant:` (it splits the whole sequence there); we score the
whole response.
"""

from __future__ import annotations

from verl_search.agent_protocol.research import extract_answer, format_check
from verl_search.rewards.qa import f1_score

#: ReSearch's score of a well-formed response whose answer has F1 0
FORMAT_SCORE = 0.1


def research_score(response: str, golds: list[str], ended_with_eos: bool | None = None,
                   format_score: float = FORMAT_SCORE) -> tuple[float, str]:
    """ReSearch's reward of one response; `(score, reason)`.

    Args:
        response: the decoded response (retrieved `<result>` blocks included).
        golds: the gold answers.
        ended_with_eos: whether generation ended with EOS; None skips that rule (see the module docstring).
        format_score: the score of a well-formed response with F1 0 (ReSearch: 0.1).

    >>> research_score("<think>x</think> <answer> \\\\boxed{Paris} </answer>", ["Paris"], True)
    (1.0, 'correct answer, f1 1.000')
    >>> research_score("<think>x</think> <answer> \\\\boxed{Paris} </answer>", ["Paris"], False)
    (0.0, 'over length')
    """
    ok, reason = format_check(response)
    if not ok:
        return 0.0, f"bad format: {reason}"
    if ended_with_eos is False:
        return 0.0, "over length"
    answer = extract_answer(response)
    if answer is None:
        return 0.0, "cannot extract a boxed answer"
    f1 = f1_score(answer, golds, yes_no_exact=True)
    if f1 > 0:
        return f1, f"correct answer, f1 {f1:.3f}"
    return format_score, "wrong answer but good format"
