"""The replay buffer the shipped recipes install: verl's own, with DAPO group filtering honoured and the
step's search and group metrics added.

verl 0.9.1's trainer (the v1 trainer `main_ppo` runs) calls the replay buffer's `sample()` once per
training step for the step's trajectories and logs the metrics dict it returns (console, wandb,
tensorboard, file). Its public hook is `trainer.v1.sampler.custom_sampler.{path,name}`; the recipes set::

    trainer.v1.sampler.custom_sampler.path=pkg://verl_search.training.replay_buffer
    trainer.v1.sampler.custom_sampler.name=make_replay_buffer

**Group filtering.** verl's `_build_replay_buffer` (verl/trainer/ppo/v1/trainer_base.py, 0.9.1) hands the
settings of `algorithm.filter_groups` (DAPO's dynamic sampling: groups whose rewards are all equal carry no
GRPO advantage, are dropped and replaced by fresh prompts) to its built-in sampler only; a custom sampler gets
none, and the filter silently stays off. `make_replay_buffer` asks the trainer for the same settings, with
verl's own resolution (`_resolve_filter_groups_metric`; the trainer is the owner of the `refill_fn` verl
passes), so the filter acts exactly as with verl's sampler. It also honours
`algorithm.filter_groups.max_num_gen_batches`, which verl's sync sampler ignores: where the step's generation
batches reach it without enough groups that carry signal, the run stops with an error naming the setting
(DAPO's rule, verl's `ray_trainer.py` before the v1 trainer) instead of generating forever; no update runs on
groups without signal. A test pins both (tests/training/test_replay_buffer_on_cpu.py).

**Training at the limit.** With `trainer.v1.sampler.sampler_kwargs.train_at_max_gen_batches=true` (the
quickstart's), a step that reaches `max_num_gen_batches` trains instead of stopping: it filters out at most
`(max_num_gen_batches - 1) x train_batch_size` groups, refills no more than that many prompts, and keeps the groups
without signal that finish after that; the batch takes the groups with signal first and fills up with those (their
GRPO advantages are 0: they add no reward-driven update). A step then generates at most `max_num_gen_batches x
train_batch_size` groups, and never waits for a group it cannot get: at every poll the groups kept or running, plus
the refills still allowed, are at least a batch. `search/groups/trained_without_signal` counts the groups
kept so. This overrides two methods of verl 0.9.1's `ReplayBuffer` (`_dapo_filtered_keys`,
`_select_prompt_uids`), whose `sample()` has no hook for it; the resumed run of tests/training/test_recipes_on_cpu.py
(no group with signal) pins it.

Metrics added to every training step (names, units: docs/metrics.md): `search/*` of the trained
trajectories (`verl_search.training.metrics.search_metrics`) and the group metrics
`search/groups/informative_share`, `search/groups/generated`, `search/score_before_filter/mean`.

**The permuted-reward control.** With `trainer.v1.sampler.sampler_kwargs.permute_scores=true` the scores of each
trained batch are shuffled among its trajectories (seeded by `sampler_kwargs.permute_seed`, default 0) after
sampling and before the advantages: the same run, the same amount of updating, with rewards that no longer
belong to the responses. A gain of the real run over this control is the reward's. Filtering and the `search/*`
metrics see the true scores.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import (
    DAPO_FILTERED_REWARD_COUNTS_KEY,
    FILTER_GROUPS_REWARD_METRIC,
    ReplayBuffer,
    ReplayBufferAsync,
)

from verl_search.training.metrics import PREFIX, batch_search_metrics, final_keys
from verl_search.training.names import PERMUTE_KWARG, PERMUTE_SEED_KWARG, TRAIN_AT_LIMIT_KWARG

logger = logging.getLogger(__name__)

INFORMATIVE_SHARE = f"{PREFIX}/groups/informative_share"
"""Share of the trained batch's groups whose scores are not all equal (GRPO advantage not all 0), 0..1."""
GENERATED = f"{PREFIX}/groups/generated"
"""Prompt groups generated for the step: its first batch plus every refill (sync trainer only)."""
SCORE_BEFORE_FILTER = f"{PREFIX}/score_before_filter/mean"
"""Mean score per trajectory over the trained groups and the groups filtered out at the step."""
TRAINED_WITHOUT_SIGNAL = f"{PREFIX}/groups/trained_without_signal"
"""Groups trained at the step although their filter metric did not differ, kept because the step reached
`max_num_gen_batches` with `train_at_max_gen_batches` (sync trainer with group filtering only)."""
PERMUTED = f"{PREFIX}/control/permuted_scores"
"""1 at every step whose scores the permuted-reward control shuffled."""


def filter_settings(trainer_mode: str, refill_fn: Callable | None) -> dict[str, Any]:
    """The group-filtering keyword arguments verl 0.9.1 gives its built-in sampler (trainer_base.py,
    `_build_replay_buffer`), resolved by the trainer that owns `refill_fn` (its bound method
    `_add_prompts_to_generate`).

    Returns:
        `{}` when `refill_fn` is not a trainer's method (the buffer built outside a trainer); else
        `filter_groups_metric`, `sync_refill_failed_groups` and, for the sync trainer,
        `train_batch_size`, `gen_batch_size`, `max_inflight_gen_batches` and, with the filter on,
        `max_num_gen_batches` (which verl keeps from its own sampler; ours honours it).

    Raises:
        ValueError: `algorithm.filter_groups.enable` without a `metric` (verl's check).
        RuntimeError: the trainer has no `_resolve_filter_groups_metric` (a verl other than 0.9.x).
    """
    trainer = getattr(refill_fn, "__self__", None)
    config = getattr(trainer, "config", None)
    if config is None:
        return {}
    resolve = getattr(trainer, "_resolve_filter_groups_metric", None)
    if resolve is None:
        raise RuntimeError(f"{type(trainer).__name__} has no _resolve_filter_groups_metric: "
                           "verl_search.training.replay_buffer follows verl 0.9.1's trainer; install verl==0.9.1")
    sampler_config = config.trainer.v1.sampler
    metric = resolve()
    sync_refill = bool(sampler_config.get("sync_refill_failed_groups", False))
    settings: dict[str, Any] = {"filter_groups_metric": metric, "sync_refill_failed_groups": sync_refill}
    if trainer_mode == "sync":
        filter_groups = config.algorithm.get("filter_groups", None)
        train_batch_size = config.data.train_batch_size
        settings.update(
            train_batch_size=train_batch_size,
            gen_batch_size=1 if metric is not None or sync_refill
            else (config.data.get("gen_batch_size", None) or train_batch_size),
            max_inflight_gen_batches=filter_groups.get("max_inflight_gen_batches", 1) if metric is not None else 1,
        )
        if metric is not None:
            settings["max_num_gen_batches"] = int(filter_groups.get("max_num_gen_batches", 0) or 0)
    return settings


def group_scores(keys: list[str], partition_id: str) -> dict[str, list[float]]:
    """Score of each trajectory (its `rm_scores` summed: verl's reward before KL) of the batch stored in
    TransferQueue under `keys`, the last output per session, grouped by prompt uid."""
    keys = final_keys(list(keys))
    if not keys:
        return {}
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["rm_scores"])
    scores = data["rm_scores"]
    rows = scores.unbind() if getattr(scores, "is_nested", False) else list(scores)
    groups: dict[str, list[float]] = {}
    for key, row in zip(keys, rows, strict=True):
        groups.setdefault(key.split("_")[0], []).append(float(row.sum()))
    return groups


def group_metrics(groups: dict[str, list[float]], filtered: dict[float, int] | None,
                  filter_metric: str | None) -> dict[str, float]:
    """`INFORMATIVE_SHARE` of the trained `groups` ({uid: scores}) and, where the filtered groups' shared
    value is their score (filter metric `reward`, or no filter), `SCORE_BEFORE_FILTER`; `filtered` is verl's
    {shared value: groups filtered out} of the step.

    >>> m = group_metrics({"a": [1.0, 0.0], "b": [0.0, 0.0]}, {0.0: 2}, "reward")
    >>> m["search/groups/informative_share"], m["search/score_before_filter/mean"]
    (0.5, 0.125)
    """
    if not groups:
        return {}
    informative = [float(np.std(scores)) > 0 for scores in groups.values()]
    metrics = {INFORMATIVE_SHARE: float(np.mean(informative))}
    if filter_metric in (None, FILTER_GROUPS_REWARD_METRIC):
        size = int(np.mean([len(scores) for scores in groups.values()]))
        total = sum(sum(scores) for scores in groups.values())
        count = sum(len(scores) for scores in groups.values())
        for value, groups_filtered in (filtered or {}).items():
            total += float(value) * groups_filtered * size
            count += groups_filtered * size
        metrics[SCORE_BEFORE_FILTER] = total / count
    return metrics


def permuted_scores(rows: list[torch.Tensor], order: np.ndarray) -> list[torch.Tensor]:
    """Token-level scores with the trajectories' total scores permuted: row `i` gets row `order[i]`'s total on
    its last token, 0 elsewhere (where verl's agent loop puts the reward, `rm_scores[-1]`).

    >>> [r.tolist() for r in permuted_scores([torch.tensor([0., 1.]), torch.tensor([0., 0., 0.])], np.array([1, 0]))]
    [[0.0, 0.0], [0.0, 0.0, 1.0]]
    """
    totals = [float(row.sum()) for row in rows]
    permuted = []
    for row, source in zip(rows, order, strict=True):
        scores = torch.zeros_like(row)
        scores[-1] = totals[int(source)]
        permuted.append(scores)
    return permuted


def permute_batch_scores(keys: list[str], partition_id: str, rng: np.random.Generator) -> np.ndarray:
    """Shuffle the `rm_scores` of the trajectories stored in TransferQueue under `keys` (`permuted_scores`,
    written back); return the permutation over the keys in sorted order (`order[i]`: the trajectory
    `sorted(keys)[i]` now has the score of `sorted(keys)[order[i]]`)."""
    keys = sorted(keys)
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["rm_scores"])
    scores = data["rm_scores"]
    rows = list(scores.unbind()) if getattr(scores, "is_nested", False) else list(scores)
    order = rng.permutation(len(rows))
    data["rm_scores"] = torch.nested.as_nested_tensor(permuted_scores(rows, order), layout=torch.jagged)
    tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=data)
    return order


class _SearchReplayBuffer:
    """Adds the step's search and group metrics to what `sample()` returns; counts and bounds refills."""

    def __init__(self, *args, max_num_gen_batches: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_num_gen_batches = max_num_gen_batches
        self._verl_refill = self.refill_fn
        self._start_step(0)
        if self.refill_fn is not None:
            self.refill_fn = self._refill
        options = dict(self.sampler_kwargs or {})
        self.permute = bool(options.get(PERMUTE_KWARG, False))
        self._rng = np.random.default_rng(int(options.get(PERMUTE_SEED_KWARG, 0)))
        self.train_at_limit = bool(options.get(TRAIN_AT_LIMIT_KWARG, False))
        overridden = ("_dapo_filtered_keys", "_select_prompt_uids", "_dapo_classification_cache")
        if self.train_at_limit and not all(hasattr(self, name) for name in overridden):
            raise RuntimeError(f"{TRAIN_AT_LIMIT_KWARG} follows verl 0.9.1's ReplayBuffer ({', '.join(overridden)}), "
                               "which this verl lacks: install verl==0.9.1")

    def _start_step(self, global_steps: int) -> None:
        """Reset what the buffer counts per training step."""
        self._step = global_steps
        self._refilled = 0  # prompts refilled at this step
        self._filtered_out = 0  # groups filtered out at this step
        self._kept_alike: set[str] = set()  # groups without signal kept at this step (train_at_max_gen_batches)

    def _refills_allowed(self) -> int | None:
        """Prompts a step may refill: `(max_num_gen_batches - 1) x train_batch_size`; None: no limit."""
        batch = self.train_batch_size or 0
        return (self.max_num_gen_batches - 1) * batch if self.max_num_gen_batches > 0 and batch else None

    def _refill(self, count: int):
        allowed = self._refills_allowed()
        if allowed is not None and self._refilled + count > allowed:
            if self.train_at_limit:  # dispatch what the limit leaves; the groups kept fill the batch
                count = allowed - self._refilled
                if count <= 0:
                    return 0
            else:
                batch = self.train_batch_size
                raise RuntimeError(
                    f"step {self._step}: {self.max_num_gen_batches} generation batches of {batch} prompts gave fewer "
                    f"than {batch} groups whose rewards differ (algorithm.filter_groups.max_num_gen_batches="
                    f"{self.max_num_gen_batches}); no update runs on groups without signal. The questions are too "
                    "hard or too easy for the policy: raise actor_rollout_ref.rollout.n, train on questions the "
                    "policy sometimes answers, set algorithm.filter_groups.max_num_gen_batches=0 to keep generating, "
                    f"or trainer.v1.sampler.sampler_kwargs.{TRAIN_AT_LIMIT_KWARG}=true to train on the groups at hand")
        self._refilled += count
        return self._verl_refill(count)

    def _dapo_filtered_keys(self, partition_id: str):
        """verl's groups to filter out, less those kept once the step has filtered out as many as it may refill
        (`train_at_max_gen_batches`; the lowest uids are filtered out first)."""
        uids, counts = super()._dapo_filtered_keys(partition_id)
        allowed = self._refills_allowed()
        if not self.train_at_limit or allowed is None or partition_id == "val":
            return uids, counts
        uids = sorted(uids - self._kept_alike)
        room = max(0, allowed - self._filtered_out)
        self._kept_alike.update(uids[room:])
        uids = set(uids[:room])
        self._filtered_out += len(uids)
        cache = self._dapo_classification_cache[partition_id]
        return uids, Counter(cache[uid] for uid in uids)

    def _select_prompt_uids(self, partition_id: str, sampleable_keys: set[str], batch_size: int):
        """verl's choice (oldest first), with the groups that carry signal before those kept without it."""
        if not self._kept_alike:
            return super()._select_prompt_uids(partition_id, sampleable_keys, batch_size)
        ordered, partition, steps = super()._select_prompt_uids(partition_id, sampleable_keys, len(sampleable_keys))
        return sorted(ordered, key=lambda uid: uid in self._kept_alike)[:batch_size], partition, steps

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        self._start_step(global_steps)
        batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        if partition_id != "train":
            return batch, metrics
        added: dict[str, float] = {}
        if self.train_at_limit and self._refills_allowed() is not None:
            added[TRAINED_WITHOUT_SIGNAL] = float(len({key.split("_")[0] for key in batch.keys} & self._kept_alike))
        try:
            # the weights being trained are version global_steps - 1 (verl's off-policy metrics count so)
            added.update(batch_search_metrics(batch.keys, batch.partition_id, policy_version=global_steps - 1))
            added.update(group_metrics(group_scores(batch.keys, batch.partition_id),
                                       metrics.get(DAPO_FILTERED_REWARD_COUNTS_KEY), self.filter_groups_metric))
            if self.trainer_mode == "sync":
                added[GENERATED] = float(batch_size + self._refilled)
        except Exception:  # a metric must never stop a training run
            logger.warning("search metrics of step %s could not be computed", global_steps, exc_info=True)
        if self.permute:  # the control: unlike a metric, a failure here must stop the run
            permute_batch_scores(batch.keys, batch.partition_id, self._rng)
            added[PERMUTED] = 1.0
        return batch, {**metrics, **added}


class SearchReplayBuffer(_SearchReplayBuffer, ReplayBuffer):
    """verl's sync `ReplayBuffer` with group filtering as configured, plus the step's metrics."""


class SearchReplayBufferAsync(_SearchReplayBuffer, ReplayBufferAsync):
    """verl's async `ReplayBufferAsync` with group filtering as configured, plus the step's metrics."""


def make_replay_buffer(trainer_mode: str, refill_fn: Callable | None = None, **kwargs) -> ReplayBuffer:
    """verl's replay buffer for `trainer_mode` (`sync`: `ReplayBuffer`, else `ReplayBufferAsync`, as verl
    picks) with `algorithm.filter_groups` honoured (`filter_settings`) and the step's metrics.

    Args:
        trainer_mode: verl's `trainer.v1.trainer_mode`.
        refill_fn: the trainer's `_add_prompts_to_generate`, as verl passes it.
        kwargs: the rest of what verl passes a custom sampler (`trainer_config`, `max_off_policy_*`,
            `sampler_kwargs`).
    """
    settings = filter_settings(trainer_mode, refill_fn)
    if trainer_mode != "sync":
        settings.pop("max_num_gen_batches", None)
    cls = SearchReplayBuffer if trainer_mode == "sync" else SearchReplayBufferAsync
    return cls(trainer_mode=trainer_mode, refill_fn=refill_fn, **settings, **kwargs)
