"""Test-only reward: our `compute_score` with the score fixed at 0 (its other outputs kept, so the metrics
still flow). Picked by `VERL_SEARCH_TEST_REWARD=constant` (`main_ppo.py`): the training tests must then fail,
which shows that what they assert comes from the reward. Loaded by verl's reward loop from this file
(`reward.custom_reward_function.path`)."""

from verl_search.rewards import compute_score as _compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    result = _compute_score(data_source, solution_str, ground_truth, extra_info=extra_info, **kwargs)
    result["score"] = 0.0
    return result
