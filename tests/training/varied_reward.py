"""Test-only reward: our `compute_score` plus 0.001 per character of the response, so the samples
of a GRPO group (which all score 0 with the tiny model) get different rewards, non-zero
advantages, and an update that changes the actor. Loaded by verl's reward loop from this file
(`reward.custom_reward_function.path`)."""

from verl_search.rewards import compute_score as _compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    result = _compute_score(data_source, solution_str, ground_truth, extra_info=extra_info, **kwargs)
    result["score"] = float(result["score"]) + 0.001 * len(solution_str)
    return result
