"""`verl_search.training.metrics`: the per-step search metrics from trajectories' extra fields. The replay buffer
they travel through: `test_replay_buffer_on_cpu.py`. That verl merges the sampler's metrics into each logged step is checked on
verl's own trainer, not on its source:
`test_recipes_on_cpu.py::test_search_metrics_logged_at_step_1_equal_the_rollouts`."""

from __future__ import annotations

import pytest

from verl_search.training.metrics import final_keys, search_metrics


def reward(acc=0.0, answered=1.0, f1=0.0, cover_em=0.0, format_ok=0.0):
    return {"acc": acc, "answered": answered, "f1": f1, "cover_em": cover_em, "format_ok": format_ok}


def test_counts_shares_and_reward_means():
    metrics = search_metrics([
        # two searches, one failed, right answer
        {"num_searches": 2, "failed_searches": 1, "reward_extra_info": reward(acc=1.0, f1=1.0, format_ok=1.0)},
        # a tool-protocol trajectory that never searched: SearchTool wrote no counter
        {"reward_extra_info": reward(answered=0.0)},
        # three searches, none failed, a wrong answer half right by F1
        {"num_searches": 3, "failed_searches": 0, "reward_extra_info": reward(f1=0.5, cover_em=1.0)},
    ])
    assert metrics == pytest.approx({
        "search/num_searches/mean": 5 / 3, "search/num_searches/max": 3.0, "search/num_searches/min": 0.0,
        "search/searched/mean": 2 / 3, "search/failed_searches/mean": 1 / 3, "search/failed_share": 1 / 5,
        "search/answered/mean": 2 / 3, "search/em/mean": 1 / 3, "search/f1/mean": 0.5,
        "search/cover_em/mean": 1 / 3, "search/format_ok/mean": 1 / 3,
    })


def test_valid_turns_come_from_the_tag_protocol_turn_records():
    turns = [{"generated": "<search> a </search>"}, {"generated": "no tags at all"},
             {"generated": "<think>x</think><answer> b </answer>"}, {"generated": "<search> unclosed"}]
    metrics = search_metrics([{"turns": turns[:2], "answered": False}, {"turns": turns[2:], "answered": True}])
    assert metrics["search/valid_turns/share"] == 0.5
    # without a reward, `answered` comes from the agent loop, and no reward metric is made up
    assert metrics["search/answered/mean"] == 0.5
    assert not any(key.startswith(("search/em", "search/f1", "search/format_ok")) for key in metrics)


def test_stale_tokens_are_counted_from_each_turns_weight_versions():
    def turn(text: str, tokens: int, first: int, last: int) -> dict:
        return {"generated": text, "generated_tokens": tokens, "min_global_steps": first, "max_global_steps": last}

    turns = [turn("<search> a </search>", 5, 1, 1), turn("<answer> b </answer>", 15, 1, 2),
             turn("<answer> c </answer>", 20, 2, 2)]
    trajectories = [{"turns": turns[:2]}, {"turns": turns[2:]}]
    # training from version 2 (step 3): turn 1 is wholly stale, turn 2 (aborted and resumed) in part
    assert search_metrics(trajectories, policy_version=2) == pytest.approx(
        {**search_metrics(trajectories), "search/stale_tokens/share": 5 / 40, "search/stale_tokens/share_max": 20 / 40})
    assert "search/stale_tokens/share" not in search_metrics(trajectories)  # no version given
    fresh = search_metrics(trajectories, policy_version=1)
    assert fresh["search/stale_tokens/share"] == fresh["search/stale_tokens/share_max"] == 0
    # turns without versions (an engine that reports none) make no stale-token metric
    unversioned = [{"turns": [{"generated": "<answer> b </answer>", "generated_tokens": 4}]}]
    assert "search/stale_tokens/share" not in search_metrics(unversioned, policy_version=2)


def test_a_reward_metric_is_left_out_unless_every_trajectory_has_it():
    metrics = search_metrics([{"reward_extra_info": reward(acc=1.0)}, {"reward_extra_info": {"answered": 0.0}}])
    assert "search/em/mean" not in metrics and "search/valid_turns/share" not in metrics
    assert search_metrics([]) == {}


def test_the_last_output_of_each_session_counts():
    keys = ["u1_0_0", "u1_0_1", "u1_1_0", "u2_0_0"]
    assert sorted(final_keys(keys)) == ["u1_0_1", "u1_1_0", "u2_0_0"]
