"""Search behaviour in every training step's metrics: searches, failures, answers, valid turns, EM/F1.

verl 0.9.1's trainer (the v1 trainer `main_ppo` runs) logs, at each training step, only its own
numbers (`critic/score/*`, `actor/*`, ...); the reward's extra outputs reach the logger at
validation only. The shipped recipes' replay buffer (`verl_search.training.replay_buffer`, verl's
public custom-sampler hook) adds `batch_search_metrics` of each sampled training batch to the step's
metrics. The numbers come from each trajectory's `extra_fields` (written by the agent loop and
`SearchTool`, `verl_search.agent_protocol.vocabulary`) and its `reward_extra_info` (what
`verl_search.rewards.compute_score` returned), read from TransferQueue: they work with any rollout
engine. Names, units and sources: docs/metrics.md.

Limit: with a reward model colocated with the trainer (`reward.reward_model.enable_resource_pool=false`)
the reward runs after sampling and the reward metrics (`em`, `f1`, `cover_em`, `format_ok`) are absent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import transfer_queue as tq

from verl_search.agent_protocol.vocabulary import ANSWERED, FAILED_SEARCHES, NUM_SEARCHES, TURNS, parse_action

PREFIX = "search"
"""Every metric name starts with `search/`."""
REWARD_INFO = "reward_extra_info"
"""verl's key, in a trajectory's `extra_fields`, for the reward function's extra outputs."""
REWARD_MEANS = {"em": "acc", "f1": "f1", "cover_em": "cover_em", "format_ok": "format_ok"}
"""Metric name -> `compute_score` output averaged over the step's trajectories."""


def _number(value: Any, default: float = 0.0) -> float:
    if value is None:
        return default
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def _plain(value: Any) -> Any:
    """The Python object inside what TransferQueue hands back (`NonTensorData`, 0-d arrays)."""
    value = getattr(value, "data", value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    return value


def search_metrics(trajectories: Iterable[dict], policy_version: int | None = None) -> dict[str, float]:
    """Search-behaviour metrics of one training step's trajectories.

    Args:
        trajectories: each trajectory's `extra_fields` dict (verl's `AgentLoopOutput.extra_fields`
            after the reward: `num_searches`, `failed_searches`, `answered`, `turns`,
            `reward_extra_info`); missing counters count as 0.
        policy_version: the weight version the step trains from (verl's `global_steps - 1`, as its
            `training/off_policy/*` metrics count, `verl/trainer/ppo/v1/trainer_base.py`); with it, and turn
            records that carry their versions, the stale-token shares below.

    Returns:
        `{name: value}`, names under `search/` (see docs/metrics.md): `num_searches/{mean,max,min}`
        [searches per trajectory], `searched/mean` and `answered/mean` [share of trajectories],
        `failed_searches/mean` [failed searches per trajectory], `failed_share` [failed / all
        searches, 0 without searches], `valid_turns/share` [valid model turns / model turns; only
        when trajectories carry turn records, i.e. the Search-R1 and ReSearch agent loops],
        `em/mean`, `f1/mean`, `cover_em/mean`, `format_ok/mean` [0..1; only when every
        trajectory's `reward_extra_info` has the reward output]; `stale_tokens/share` and
        `stale_tokens/share_max` [model tokens of turns generated wholly (`max_global_steps`), or at least
        in part (`min_global_steps`), by weights older than `policy_version` / all model tokens of turns with
        versions: the share of stale tokens lies between the two; a turn an asynchronous trainer aborted and
        resumed across the update is in the second only]. Empty for no trajectories.

    >>> m = search_metrics([{"num_searches": 2, "failed_searches": 1, "reward_extra_info": {"answered": 1.0}},
    ...                     {"reward_extra_info": {"answered": 0.0}}])
    >>> m["search/num_searches/mean"], m["search/failed_share"], m["search/answered/mean"]
    (1.0, 0.5, 0.5)
    """
    rows = [dict(_plain(t) or {}) for t in trajectories]
    if not rows:
        return {}
    infos = [dict(_plain(row.get(REWARD_INFO)) or {}) for row in rows]
    searches = np.array([_number(row.get(NUM_SEARCHES)) for row in rows])
    failed = np.array([_number(row.get(FAILED_SEARCHES)) for row in rows])
    answered = np.array([_number(info["answered"]) if "answered" in info else _number(row.get(ANSWERED))
                         for row, info in zip(rows, infos)])
    metrics = {
        f"{PREFIX}/num_searches/mean": float(searches.mean()),
        f"{PREFIX}/num_searches/max": float(searches.max()),
        f"{PREFIX}/num_searches/min": float(searches.min()),
        f"{PREFIX}/searched/mean": float((searches > 0).mean()),
        f"{PREFIX}/failed_searches/mean": float(failed.mean()),
        f"{PREFIX}/failed_share": float(failed.sum() / searches.sum()) if searches.sum() else 0.0,
        f"{PREFIX}/answered/mean": float(answered.mean()),
    }
    turns = [_plain(row.get(TURNS)) for row in rows]
    records = [record for trajectory in turns if trajectory is not None for record in list(trajectory)]
    if records:
        valid = sum(_action(_plain(record)) != "invalid" for record in records)
        metrics[f"{PREFIX}/valid_turns/share"] = valid / len(records)
        if policy_version is not None:
            metrics.update(stale_token_shares([_plain(record) for record in records], policy_version))
    for name, key in REWARD_MEANS.items():
        if all(key in info for info in infos):
            metrics[f"{PREFIX}/{name}/mean"] = float(np.mean([_number(info[key]) for info in infos]))
    return metrics


def stale_token_shares(turns: list[dict], policy_version: int) -> dict[str, float]:
    """`stale_tokens/share` and `stale_tokens/share_max` of turn records (`search_metrics`); empty when no turn
    carries its versions and token count.

    >>> stale_token_shares([{"generated_tokens": 10, "min_global_steps": 2, "max_global_steps": 2},
    ...                     {"generated_tokens": 30, "min_global_steps": 2, "max_global_steps": 3},
    ...                     {"generated_tokens": 60, "min_global_steps": 3, "max_global_steps": 3}], 3)
    {'search/stale_tokens/share': 0.1, 'search/stale_tokens/share_max': 0.4}
    """
    versioned = [t for t in turns if "min_global_steps" in t and "max_global_steps" in t and "generated_tokens" in t]
    total = sum(int(t["generated_tokens"]) for t in versioned)
    if not total:
        return {}
    whole = sum(int(t["generated_tokens"]) for t in versioned if int(t["max_global_steps"]) < policy_version)
    part = sum(int(t["generated_tokens"]) for t in versioned if int(t["min_global_steps"]) < policy_version)
    return {f"{PREFIX}/stale_tokens/share": whole / total, f"{PREFIX}/stale_tokens/share_max": part / total}


def _action(record: dict) -> str:
    """A turn record's action: the one its agent loop recorded (`ReSearchAgentLoop`), else Search-R1's reading."""
    return record.get("action") or parse_action(str(record.get("generated", ""))).kind


def final_keys(keys: list[str]) -> list[str]:
    """The last output of each session: verl stores output `i` of session `s` of prompt `uid` under
    `{uid}_{s}_{i}`; a multi-output agent loop's earlier outputs share its reward (verl's
    validation keeps the last one the same way)."""
    last: dict[str, tuple[int, str]] = {}
    for key in keys:
        parts = key.rsplit("_", 2)
        session, index = (f"{parts[0]}_{parts[1]}", int(parts[2])) if len(parts) == 3 and parts[2].isdigit() else (key, 0)
        if session not in last or index > last[session][0]:
            last[session] = (index, key)
    return [key for _, key in last.values()]


def batch_search_metrics(keys: list[str], partition_id: str, policy_version: int | None = None) -> dict[str, float]:
    """`search_metrics` of the trajectories stored in TransferQueue under `keys` (last output per session)."""
    keys = final_keys(list(keys))
    if not keys:
        return {}
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields"])
    values = data["extra_fields"]
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    return search_metrics(values, policy_version)
