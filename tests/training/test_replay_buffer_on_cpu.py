"""`verl_search.training.replay_buffer`: the shipped recipes' replay buffer gets the group-filtering settings verl
gives its own sampler, from verl's own `_build_replay_buffer` on a recipe's composed config (no trainer started:
the method reads only the config, the trainer mode and the trainer's refill method). That the filter then acts in
a run, and the cap stops a run without signal before any update: `test_recipes_on_cpu.py`."""

from __future__ import annotations

import pytest
from verl.trainer.ppo.v1 import PPOTrainerSync

from tests.conftest import REPO
from verl_search.training.replay_buffer import (
    SearchReplayBuffer,
    SearchReplayBufferAsync,
    group_metrics,
    make_replay_buffer,
)
from verl_search.training.names import TRAIN_AT_LIMIT_KWARG
from verl_search.verl_config.compose import compose_verl_config

RECIPE = REPO / "examples" / "grpo_qwen2.5-3b-base_search_r1" / "config.yaml"
FILTER = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=reward",
          "algorithm.filter_groups.max_inflight_gen_batches=2", "data.train_batch_size=8"]
SETTINGS = ("filter_groups_metric", "sync_refill_failed_groups", "train_batch_size", "gen_batch_size",
            "max_inflight_gen_batches")


def built(overrides: list[str], custom: bool = True, mode: str = "sync"):
    """verl 0.9.1's `_build_replay_buffer` on the recipe composed with `overrides`: with the recipe's sampler
    (ours), or with the custom sampler removed (verl's built-in one)."""
    config = compose_verl_config([*overrides, f"trainer.v1.trainer_mode={mode}"], recipe=RECIPE)
    if not custom:
        config.trainer.v1.sampler.custom_sampler = None
    trainer = object.__new__(PPOTrainerSync)
    trainer.config, trainer.trainer_mode = config, mode
    return trainer._build_replay_buffer()


@pytest.mark.parametrize("overrides", [FILTER, [], ["data.train_batch_size=8", "+data.gen_batch_size=4"]],
                         ids=["filter", "default", "gen_batch_size"])
def test_the_recipes_buffer_gets_what_verl_gives_its_own(overrides):
    ours, verls = built(overrides), built(overrides, custom=False)
    assert type(ours) is SearchReplayBuffer and type(verls).__name__ == "ReplayBuffer"
    assert {k: getattr(ours, k) for k in SETTINGS} == {k: getattr(verls, k) for k in SETTINGS}
    if overrides is FILTER:
        assert ours.filter_groups_metric == "reward" and ours.gen_batch_size == 1
        assert ours.max_inflight_gen_batches == 2 and ours.train_batch_size == 8


def test_async_modes_get_verls_async_buffer_with_the_filter():
    ours = built(FILTER, mode="colocate_async")
    assert type(ours) is SearchReplayBufferAsync and ours.filter_groups_metric == "reward"


def test_a_filter_without_a_metric_is_refused_as_verl_refuses_it():
    with pytest.raises(ValueError, match="filter_groups.metric"):
        built(["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=null"])


def test_refills_past_max_num_gen_batches_stop_the_step():
    buffer = built([*FILTER, "algorithm.filter_groups.max_num_gen_batches=3"])
    dispatched = []
    buffer._verl_refill = dispatched.append  # the trainer's method would start rollouts
    buffer._refill(8)
    buffer._refill(8)  # 3 generation batches of 8 prompts: the first and two refills
    with pytest.raises(RuntimeError, match="max_num_gen_batches=3.*no update runs"):
        buffer._refill(1)
    assert dispatched == [8, 8]


AT_LIMIT = [*FILTER, "algorithm.filter_groups.max_num_gen_batches=3",
            f"+trainer.v1.sampler.sampler_kwargs.{TRAIN_AT_LIMIT_KWARG}=true"]
"""8 prompts a batch, 3 batches a step at most, then train on the groups at hand: 16 refills allowed."""


def test_at_the_limit_refills_stop_without_an_error():
    buffer = built(AT_LIMIT)
    dispatched = []
    buffer._verl_refill = dispatched.append
    buffer._refill(10)
    buffer._refill(10)  # 6 of these 10 fit
    assert buffer._refill(1) == 0
    assert dispatched == [10, 6] and buffer._refilled == 16


def finished(buffer, alike: list[str], with_signal: list[str]) -> None:
    """Finished groups of step 1 as verl's sampler holds them once classified (`_dapo_classification_cache`:
    the shared score of a group without signal, None for one with signal), so verl's own `_dapo_filtered_keys`
    reads no TransferQueue."""
    buffer.finished_keys["train"] = set(alike) | set(with_signal)
    buffer._dapo_classification_cache["train"] = {**{uid: 0.0 for uid in alike}, **{uid: None for uid in with_signal}}
    buffer.prompt_global_steps["train"] = {uid: 1 for uid in buffer.finished_keys["train"]}


def test_at_the_limit_groups_past_the_refills_allowed_are_kept_and_trained_last():
    buffer = built(AT_LIMIT)
    alike = [f"a{i:02d}" for i in range(20)]
    finished(buffer, alike[:12], [])
    uids, counts = buffer._dapo_filtered_keys("train")
    assert uids == set(alike[:12]) and counts == {0.0: 12}  # room for 16
    finished(buffer, alike[12:], ["s1", "s2"])  # verl cleared the 12; 8 more alike and 2 with signal finish
    uids, counts = buffer._dapo_filtered_keys("train")
    assert uids == set(alike[12:16]) and counts == {0.0: 4}  # the 4 that fit; the lowest uids first
    assert buffer._kept_alike == set(alike[16:])
    finished(buffer, alike[16:], ["s1", "s2"])
    assert buffer._dapo_filtered_keys("train") == (set(), {})  # kept groups stay kept
    # a batch of 3: both groups with signal first, then a kept one
    selected, _, _ = buffer._select_prompt_uids("train", set(alike[16:]) | {"s1", "s2"}, 3)
    assert selected[:2] in (["s1", "s2"], ["s2", "s1"]) and selected[2] in alike[16:]


def test_without_the_setting_every_group_without_signal_is_filtered_out():
    buffer = built([*FILTER, "algorithm.filter_groups.max_num_gen_batches=3"])
    finished(buffer, [f"a{i:02d}" for i in range(20)], ["s1"])
    uids, _ = buffer._dapo_filtered_keys("train")
    assert len(uids) == 20 and not buffer._kept_alike


def test_outside_a_trainer_the_buffer_is_verls_default():
    kwargs = dict(trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop", sampler_kwargs={})
    assert type(make_replay_buffer("sync", **kwargs)) is SearchReplayBuffer
    assert make_replay_buffer("sync", **kwargs).filter_groups_metric is None
    assert type(make_replay_buffer("colocate_async", **kwargs)) is SearchReplayBufferAsync


def test_group_metrics():
    groups = {"a": [1.0, 0.0, 0.0, 0.0], "b": [0.2, 0.2, 0.2, 0.2]}
    metrics = group_metrics(groups, {0.0: 1}, "reward")
    assert metrics["search/groups/informative_share"] == 0.5
    # 12 trajectories: the trained 8 and one filtered group of 4 at 0
    assert metrics["search/score_before_filter/mean"] == pytest.approx((1.0 + 0.8) / 12)
    # a filter on another metric says nothing about the filtered groups' scores
    assert "search/score_before_filter/mean" not in group_metrics(groups, {1.0: 1}, "acc")
    assert group_metrics({}, None, None) == {}
