"""One training step of each shipped recipe through verl's own trainer on the CPU
(`verl-search train RECIPE --cpu`), checked for what the step learned and what it logged.

* GRPO recipe (tool-call protocol, verl's `ToolAgentLoop` + our `SearchTool`): 2 prompts x 8
  samples; our reward (`verl_search.rewards.compute_score`, EM) scores the samples of a group
  differently; weight decay off. After the one update, verl's actor `compute_log_prob` on the same
  batch gives the samples with a positive advantage (the right answer) a higher log-probability on
  average and those with a negative one a lower one, and the advantage-weighted sum of the changes
  (the objective the update ascends) is positive.
* PPO recipe (Search-R1 tag protocol, our agent loop, a critic): the critic's value loss on the
  step's batch, from verl's critic before and after its update, falls.
* Both: the step's `search/*` metrics (`verl_search.training.metrics`, through the recipes'
  replay-buffer hook) are in verl's logged metrics at step 1 and equal what the agent-loop workers
  produced for that step (recorded through verl's `agent_loop_manager_class` hook, `recorder.py`).

Real: the trainer, rollout, agent loops, tool, reward, logger; the PPO run searches the BM25
server on the mini corpus, the GRPO run a URL where nothing listens (every search fails, so the
failure counters are exercised). Stand-ins: a tiny Qwen2 (real Qwen2.5 tokenizer) fitted to answer
right, answer wrong or search (`answering_model.py`), whose rows' gold answer is the right one.
The before/after measurements come from `probe.py`, a subclass of verl's sync trainer registered
through verl's public `register_trainer` and picked with `trainer.v1.trainer_mode`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import MINI_QA, REPO
from tests.training.answering_model import FIT_STEPS, MOVES, WEIGHTS, make_answering_model, rows
from tests.training.probe import PROBE_ENV, PROBE_TRAINER
from tests.training.recorder import RECORD_ENV

GRPO_RECIPE = REPO / "examples" / "grpo_qwen2.5-3b-instruct_tool" / "config.yaml"
PPO_RECIPE = REPO / "examples" / "ppo_qwen2.5-3b-base_search_r1" / "config.yaml"
TIMEOUT = 1500  # seconds per main_ppo run; one step takes 3-5 minutes on 2 shared cores
DEAD_URL = "http://127.0.0.1:9/retrieve"  # the discard port: nothing listens, every search fails at once
SEARCH_METRICS = {"num_searches/mean", "num_searches/max", "num_searches/min", "searched/mean",
                  "failed_searches/mean", "failed_share", "answered/mean", "em/mean", "f1/mean",
                  "cover_em/mean", "format_ok/mean"}


def fitted_model(tiny_qwen, folder: Path, protocol: str, count: int) -> tuple[Path, Path]:
    """(model fitted on 4 rows' prompts, train parquet of the first `count` of them, gold answer `RIGHT`).

    The fit is seeded; with `VERL_SEARCH_TEST_CACHE` set, a fitted model is kept there and reused.
    """
    from verl_search.verl_config.shipped import config_path
    from verl_search.data.preprocess import Source, build_rows, write_parquet

    source = rows(build_rows([Source.parse(str(MINI_QA))], "train", protocol, max_per_source=2, seed=0), 4)
    write_parquet(source[:count], folder / "train.parquet")
    schema = yaml.safe_load(Path(config_path("tool")).read_text())["tools"][0]["tool_schema"]
    cache = os.environ.get("VERL_SEARCH_TEST_CACHE")
    fit = [protocol, MOVES[protocol], WEIGHTS, FIT_STEPS, source, schema]
    key = hashlib.sha256(json.dumps(fit).encode()).hexdigest()[:16]
    model = Path(cache) / f"answering_{protocol}_{key}" if cache else folder / "model"
    if not (model / "fitted.json").is_file():
        partial = model.with_name(model.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        make_answering_model(tiny_qwen, partial, source, protocol, schema)
        partial.rename(model)
    return model, folder / "train.parquet"


def train_one_step(recipe: Path, model: Path, train_file: Path, url: str, out: Path, overrides: list[str]) -> dict:
    """`verl-search train RECIPE --cpu` for one step; the log, metrics by step, recorded samples, probe lines."""
    from verl_search.training.names import PLUGIN_MODULE

    metrics, record, probe = out / "metrics.jsonl", out / "record.jsonl", out / "probe.jsonl"
    command = [
        sys.executable, "-m", "verl_search.cli", "train", str(recipe), "--cpu", "--retrieval-url", url,
        f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
        f"data.train_files={train_file}", f"data.val_files={train_file}",
        "data.max_prompt_length=1024", "actor_rollout_ref.rollout.prompt_length=1024",
        "actor_rollout_ref.actor.optim.weight_decay=0.0", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        "trainer.total_training_steps=1", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", f"trainer.default_local_dir={out / 'ckpt'}",
        "trainer.logger=[console,file]", f"trainer.v1.trainer_mode={PROBE_TRAINER}",
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tests.training.recorder.RecordingAgentLoopManager",
        *overrides,
    ]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics), RECORD_ENV: str(record), PROBE_ENV: str(probe),
           # the probe trainer registers itself in every verl process, after the CPU plugin
           "VERL_USE_EXTERNAL_MODULES": f"{PLUGIN_MODULE},tests.training.probe",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "RAY_DEDUP_LOGS": "0"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT, cwd=out)
    log = result.stdout + result.stderr
    (out / "train.log").write_text(log)
    assert result.returncode == 0, log[-6000:]
    by_step: dict[int, dict] = {}
    for line in metrics.read_text().splitlines():
        entry = json.loads(line)
        by_step.setdefault(entry["step"], {}).update(entry["data"])
    read = lambda path: [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []  # noqa: E731
    return {"log": log, "metrics": by_step, "records": read(record), "probe": read(probe)}


@pytest.fixture(scope="module")
def grpo_run(tiny_qwen, tmp_path_factory):
    folder = tmp_path_factory.mktemp("grpo_learns")
    model, train_file = fitted_model(tiny_qwen, folder, "tool", count=2)
    return train_one_step(GRPO_RECIPE, model, train_file, DEAD_URL, folder, [
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=8",  # 2 groups of 8 samples: one update
        "data.max_response_length=256", "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",  # full-vocabulary logits: 2 sequences at a time
        "actor_rollout_ref.actor.optim.lr=1e-4",
    ])


@pytest.fixture(scope="module")
def ppo_run(tiny_qwen, bm25_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ppo_learns")
    model, train_file = fitted_model(tiny_qwen, folder, "search_r1", count=4)
    return train_one_step(PPO_RECIPE, model, train_file, f"{bm25_server.url}/retrieve", folder, [
        "data.train_batch_size=4",
        # room for one <information> block (3 passages) and the turns after it
        "data.max_response_length=640", "actor_rollout_ref.rollout.response_length=640",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.optim.lr=1e-4", "critic.optim.weight_decay=0.0", "critic.optim.lr_warmup_steps_ratio=0.0",
    ])


def test_grpo_update_raises_rewarded_and_lowers_unrewarded_log_probs(grpo_run):
    samples = [p for p in grpo_run["probe"] if p["kind"] == "actor" and p["step"] == 1]
    assert len(samples) == 16, len(samples)
    rewarded = [s for s in samples if s["advantage"] > 0]
    unrewarded = [s for s in samples if s["advantage"] < 0]
    # groups whose samples all scored alike have advantage 0 and no gradient of their own
    assert rewarded and unrewarded, [(s["score"], s["advantage"]) for s in samples]
    assert all(s["score"] == 1.0 for s in rewarded) and all(s["score"] == 0.0 for s in unrewarded)
    change = lambda group: [s["log_prob_after"] - s["log_prob_before"] for s in group]  # noqa: E731
    # the objective the update ascends: sum of advantage x log-probability over the batch
    assert sum(s["advantage"] * d for s, d in zip(samples, change(samples))) > 0, change(samples)
    # on average the rewarded answers gained and the unrewarded lost; a single sample may move against
    # its own sign by a few thousandths when it shares tokens with samples of the other sign
    assert np.mean(change(rewarded)) > 0 > np.mean(change(unrewarded)), (change(rewarded), change(unrewarded))


def test_ppo_critic_value_loss_falls_on_its_batch(ppo_run):
    batch = [p for p in ppo_run["probe"] if p["kind"] == "critic" and p["step"] == 1]
    assert len(batch) == 4, batch
    tokens = np.array([p["tokens"] for p in batch])
    before = float(np.dot(tokens, [p["value_loss_before"] for p in batch]) / tokens.sum())
    after = float(np.dot(tokens, [p["value_loss_after"] for p in batch]) / tokens.sum())
    assert after < before, (before, after)


def expected_metrics(records: list[dict]) -> dict[str, float]:
    """The `search/*` values, computed here from the samples the agent-loop workers produced."""
    from verl_search.protocol.vocabulary import parse_action

    fields = [r["extra_fields"] for r in records]
    infos = [f["reward_extra_info"] for f in fields]
    searches = np.array([f.get("num_searches", 0) for f in fields], dtype=float)
    failed = np.array([f.get("failed_searches", 0) for f in fields], dtype=float)
    expected = {
        "num_searches/mean": searches.mean(), "num_searches/max": searches.max(),
        "num_searches/min": searches.min(), "searched/mean": (searches > 0).mean(),
        "failed_searches/mean": failed.mean(), "failed_share": failed.sum() / searches.sum() if searches.sum() else 0,
        "answered/mean": np.mean([i["answered"] for i in infos]), "em/mean": np.mean([i["acc"] for i in infos]),
        "f1/mean": np.mean([i["f1"] for i in infos]), "cover_em/mean": np.mean([i["cover_em"] for i in infos]),
        "format_ok/mean": np.mean([i["format_ok"] for i in infos]),
    }
    turns = [t for f in fields for t in f.get("turns", [])]
    if turns:
        expected["valid_turns/share"] = np.mean([parse_action(t["generated"]).kind != "invalid" for t in turns])
    return {f"search/{k}": float(v) for k, v in expected.items()}


@pytest.mark.parametrize("name", ["grpo_run", "ppo_run"])
def test_search_metrics_are_logged_at_step_1_as_the_rollouts_were(name, request):
    run = request.getfixturevalue(name)
    logged = {k: v for k, v in run["metrics"][1].items() if k.startswith("search/")}
    records = [r for r in run["records"] if r["global_steps"] == 1]
    assert len(records) == (16 if name == "grpo_run" else 4), len(records)
    expected = expected_metrics(records)
    names = {f"search/{n}" for n in SEARCH_METRICS} | ({"search/valid_turns/share"} if name == "ppo_run" else set())
    assert set(logged) == names == set(expected), sorted(logged)
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, abs=1e-6), (key, logged[key], value)
    if name == "grpo_run":  # nothing listens at the GRPO run's URL
        assert logged["search/searched/mean"] > 0 and logged["search/failed_share"] == 1.0, logged
    else:
        assert logged["search/failed_searches/mean"] == 0.0, logged
