"""Reward functions for search agents, with verl's custom-reward signature.

Use with verl as::

    reward.custom_reward_function.path=pkg://verl_search.rewards
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.structure_format_score=0.2   # optional weights

`compute_score` is a pure function: no printing, no randomness.
"""

from verl_search.rewards.qa import (
    cover_exact_match,
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
)
from verl_search.rewards.research import research_score
from verl_search.rewards.score import compute_score, gold_answers

__all__ = [
    "compute_score",
    "gold_answers",
    "research_score",
    "cover_exact_match",
    "exact_match",
    "extract_answer",
    "f1_score",
    "normalize_answer",
]
