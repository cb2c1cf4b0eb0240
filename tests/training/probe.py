"""Test-only: verl's sync trainer, registered as `PROBE_TRAINER` (and its `colocate_async` trainer, as
`ASYNC_PROBE_TRAINER`), that measures what each update did to the batch it was computed on, with verl's own
computations.

* actor: the batch's `old_log_probs` (verl's `compute_log_prob` before the update) and, right after
  `update_actor`, the same `actor_rollout_wg.compute_log_prob` on the same batch;
* critic: the batch's `values` (verl's critic before the update) and, right after the critic's update,
  the critic's values on the same batch again (the batch's own `values` are put back afterwards).

Measured at step 1 only (each measurement is one more pass over the batch); `$VERL_SEARCH_TEST_PROBE_STEPS`
(comma-separated) names other steps. Each becomes JSON lines in `$VERL_SEARCH_TEST_PROBE`: per trajectory its
TransferQueue key, response
tokens (mask 1), score, advantage, summed log-probs before/after over all mask-1 tokens and over the last turn's
(the mask-1 tokens after the last observation; the whole response when it has none) (actor), or its mean return, mean value
and value loss `0.5 * mean((value - return)^2)` over mask-1 tokens before/after (critic). With verl's rollout
correction on (`algorithm.rollout_correction.rollout_is`), an actor record also holds, per mask-1 token, the
trainer's log-prob before the update, the rollout engine's, and the importance weight the loss reads
(`rollout_is_weights`). Nothing else changes.

Loaded through verl's public hooks only: `VERL_USE_EXTERNAL_MODULES` imports this module (after the
CPU plugin), `register_trainer` registers the class, `trainer.v1.trainer_mode=PROBE_TRAINER` picks it.
"""

from __future__ import annotations

import json
import os

import torch
import transfer_queue as tq
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
from verl.workers.utils.padding import response_from_nested

PROBE_ENV = "VERL_SEARCH_TEST_PROBE"
PROBE_STEPS_ENV = "VERL_SEARCH_TEST_PROBE_STEPS"
PROBE_TRAINER = "verl_search_probe"
ASYNC_PROBE_TRAINER = "verl_search_probe_colocate_async"


def _measured(step: int) -> bool:
    return str(step) in os.environ.get(PROBE_STEPS_ENV, "1").split(",")


def _rows(data, fields) -> dict[str, list[torch.Tensor]]:
    """Per field, one tensor per trajectory (TransferQueue hands back jagged nested tensors)."""
    return {field: list(data[field].unbind()) if data[field].is_nested else list(data[field]) for field in fields}


def _last_turn(mask: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the last run of mask-1 tokens in a response mask: the model's last turn, after the last
    observation (mask 0) the agent loop put between its turns."""
    positions = mask.nonzero().flatten()
    last = torch.zeros_like(mask, dtype=torch.bool)
    if len(positions):
        gaps = (positions[1:] - positions[:-1] > 1).nonzero().flatten()
        start = int(positions[int(gaps[-1]) + 1]) if len(gaps) else int(positions[0])
        last[start:] = mask[start:].bool()
    return last


def _write(records: list[dict]) -> None:
    with open(os.environ[PROBE_ENV], "a", encoding="utf-8") as probe:
        for record in records:
            probe.write(json.dumps(record) + "\n")


class _Probe:
    """Records each update's effect on its own batch (module docstring), in front of a verl trainer class.

    verl branches on `trainer_mode == "sync"` (the replay buffer, refill granularity, checkpoints) and reads
    `trainer.v1.<mode>`: the probe reports its trainer's mode (`MODE`), whatever name picked it, so the run is
    that verl trainer in every branch."""

    MODE = "sync"

    @property
    def trainer_mode(self) -> str:
        return self.MODE

    @trainer_mode.setter
    def trainer_mode(self, name: str) -> None:  # verl assigns the configured name; the probe keeps its mode
        pass

    def _update_actor(self, batch, metrics):
        if not _measured(self.global_steps):
            return super()._update_actor(batch, metrics)
        fields = ["old_log_probs", "advantages", "rm_scores", "response_mask", "responses"]
        weighted = self.config.algorithm.get("rollout_correction", {}).get("rollout_is") is not None
        if weighted:
            fields += ["rollout_log_probs", "rollout_is_weights"]
        before = _rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields), fields)
        batch = super()._update_actor(batch, metrics)
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                 "temperature": self.config.actor_rollout_ref.rollout.temperature})
        self.actor_rollout_wg.compute_log_prob(batch)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["log_probs", "response_mask"])
        after = list(response_from_nested(data["log_probs"], data["response_mask"]).unbind())
        records = []
        for i, key in enumerate(batch.keys):
            m = before["response_mask"][i].bool()
            turn = _last_turn(m)
            records.append({
                "kind": "actor", "step": self.global_steps, "key": key,
                "response": before["responses"][i][m].tolist(),
                "score": float(before["rm_scores"][i].sum()),
                "advantage": float(before["advantages"][i][m][0]) if m.any() else 0.0,
                "log_prob_before": float(before["old_log_probs"][i][m].sum()),
                "log_prob_after": float(after[i][m].sum()),
                "last_turn_log_prob_before": float(before["old_log_probs"][i][turn].sum()),
                "last_turn_log_prob_after": float(after[i][turn].sum()),
                **({"token_log_probs": before["old_log_probs"][i][m].tolist(),
                    "token_rollout_log_probs": before["rollout_log_probs"][i][m].tolist(),
                    "token_is_weights": before["rollout_is_weights"][i][m].tolist()} if weighted else {}),
            })
        _write(records)
        return batch

    def _update_critic(self, batch, metrics):
        if not _measured(self.global_steps):
            return super()._update_critic(batch, metrics)
        fields = ["values", "returns", "response_mask"]
        saved = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["values"])
        before = _rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields), fields)
        batch = super()._update_critic(batch, metrics)
        self._compute_values(batch, metrics={})
        after = _rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["values"]),
                      ["values"])["values"]
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=saved)

        def loss(values: torch.Tensor, i: int) -> float:
            m = before["response_mask"][i].bool()
            turn = _last_turn(m)
            return float(0.5 * ((values[m] - before["returns"][i][m]) ** 2).mean())

        def mean(values: torch.Tensor, i: int) -> float:
            return float(values[before["response_mask"][i].bool()].mean())

        _write([{"kind": "critic", "step": self.global_steps, "key": key,
                 "tokens": int(before["response_mask"][i].sum()),
                 "return": mean(before["returns"][i], i),
                 "value_before": mean(before["values"][i], i), "value_after": mean(after[i], i),
                 "value_loss_before": loss(before["values"][i], i),
                 "value_loss_after": loss(after[i], i)} for i, key in enumerate(batch.keys)])
        return batch


class ProbeTrainer(_Probe, PPOTrainerSync):
    """verl's sync trainer, probed."""


class AsyncProbeTrainer(_Probe, PPOTrainerColocateAsync):
    """verl's `colocate_async` trainer (partial rollout), probed."""

    MODE = "colocate_async"


if TRAINER_REGISTRY.get(PROBE_TRAINER) is None:
    register_trainer(PROBE_TRAINER)(ProbeTrainer)
if TRAINER_REGISTRY.get(ASYNC_PROBE_TRAINER) is None:
    register_trainer(ASYNC_PROBE_TRAINER)(AsyncProbeTrainer)
