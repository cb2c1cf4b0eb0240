"""Both shipped recipes through verl's own trainer (`python -m verl.trainer.main_ppo`, v1 trainer,
Ray, FSDP2, TransferQueue) on the CPU, started as users start them: `verl-search train RECIPE --cpu`.

* GRPO recipe: tool-call protocol, verl's `ToolAgentLoop` + hermes + our `SearchTool`.
* PPO recipe: Search-R1 tag protocol, our `SearchR1AgentLoop`, a critic.

Real: the trainer, the rollout replica (transformers on the CPU), the BM25 server on the mini
corpus, the reward loop with our reward, checkpoints and resume. Stand-ins: a tiny Qwen2 (real
Qwen2.5 tokenizer) fitted in seconds to open each turn with a search (`searching_model.py`; a
random model never calls a tool), and tiny batch sizes. Everything asserted comes from the
trainer's own outputs: its metrics file (verl's file logger), its checkpoints, its log, and the
samples its agent-loop workers put into TransferQueue (recorded through verl's public
`agent_loop_manager_class` hook, `recorder.py`).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import MINI_QA, REPO
from tests.training.recorder import RECORD_ENV
from tests.training.searching_model import QUERY, make_searching_model

RECIPES = {
    "grpo_tool": (REPO / "examples" / "grpo_qwen2.5-3b-instruct_tool" / "config.yaml", "tool"),
    "ppo_search_r1": (REPO / "examples" / "ppo_qwen2.5-3b-base_search_r1" / "config.yaml", "search_r1"),
}
TIMEOUT = 1500  # seconds per main_ppo run; a run takes 3-5 minutes on 2 shared cores
CHECKSUM = re.compile(r"rollout server 0: weight update (\d+), (\d+) tensors, checksum (\S+)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Per protocol: a train parquet (4 questions) and a validation parquet (2 other questions)."""
    from verl_search.data.preprocess import Source, build_rows, write_parquet

    folder = tmp_path_factory.mktemp("train_data")
    out = {}
    for protocol in ("tool", "search_r1"):
        rows = build_rows([Source.parse(str(MINI_QA))], "train", protocol, max_per_source=2, seed=0)
        train, val = rows[:4], rows[4:6]
        write_parquet(train, folder / f"{protocol}_train.parquet")
        write_parquet(val, folder / f"{protocol}_val.parquet")
        out[protocol] = (folder / f"{protocol}_train.parquet", folder / f"{protocol}_val.parquet", rows)
    return out


@pytest.fixture(scope="module")
def searching_models(tiny_qwen, data, tmp_path_factory):
    from verl_search.verl_config.shipped import config_path

    schema = yaml.safe_load(Path(config_path("tool")).read_text())["tools"][0]["tool_schema"]
    folder = tmp_path_factory.mktemp("searching")
    return {protocol: make_searching_model(tiny_qwen, folder / protocol, data[protocol][2], protocol, schema)
            for protocol in ("tool", "search_r1")}


def train(recipe: Path, model: Path, files, url: str, out: Path, steps: int, extra: tuple[str, ...] = ()) -> dict:
    """Run `verl-search train RECIPE --cpu [extra overrides]`; returns the exit code, log, metrics by step
    and records."""
    train_file, val_file, _ = files
    metrics, record = out / f"metrics_{steps}.jsonl", out / f"record_{steps}.jsonl"
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
        f"data.train_files={train_file}", f"data.val_files={val_file}",
        # 768 response tokens: room for one tool response (3 passages, ~450 tokens); verl's ToolAgentLoop
        # ends a trajectory rather than append a tool response that does not fit
        "data.train_batch_size=2", "data.max_prompt_length=1024", "data.max_response_length=768",
        "actor_rollout_ref.rollout.prompt_length=1024", "actor_rollout_ref.rollout.response_length=768",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",  # PPO: 2 samples per step
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",  # large enough that one step visibly moves the weights
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        "actor_rollout_ref.rollout.calculate_log_probs=true",  # the rollout's own log-probs, compared by verl
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=1", "trainer.test_freq=2",
        "trainer.total_epochs=100",  # the tool recipe trains one epoch (verl's example); the test data is 2 batches
        "trainer.val_before_train=false", f"trainer.default_local_dir={out / 'ckpt'}",
        "trainer.logger=[console,file]",
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tests.training.recorder.RecordingAgentLoopManager",
    ]
    if "grpo" in recipe.parent.name:
        overrides.append("actor_rollout_ref.rollout.n=2")
    overrides.extend(extra)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics), RECORD_ENV: str(record),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "RAY_DEDUP_LOGS": "0"}
    command = [sys.executable, "-m", "verl_search.cli", "train", str(recipe), "--cpu", "--retrieval-url", url,
               *overrides]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT, cwd=out)
    (out / f"train_{steps}.log").write_text(result.stdout + result.stderr)
    steps_logged = {}
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            entry = json.loads(line)
            steps_logged.setdefault(entry["step"], {}).update(entry["data"])
    records = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    return {"code": result.returncode, "log": result.stdout + result.stderr, "metrics": steps_logged,
            "records": records}


def checkpoint_weights(ckpt: Path, step: int) -> dict:
    import torch

    state = torch.load(ckpt / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt",
                       map_location="cpu", weights_only=False)
    return {name: (t.to_local() if hasattr(t, "to_local") else t) for name, t in state.items()}


def checksum(weights: dict, names) -> float:
    from verl_search.training.transformers_rollout import weights_checksum

    return weights_checksum([(name, weights[name]) for name in names])


@pytest.fixture(scope="module", params=sorted(RECIPES))
def run(request, searching_models, data, bm25_server, tmp_path_factory):
    """Two steps, then the same command with three steps: it resumes from the step-2 checkpoint."""
    recipe, protocol = RECIPES[request.param]
    out = tmp_path_factory.mktemp(request.param)
    url = f"{bm25_server.url}/retrieve"
    engine = ("actor_rollout_ref.rollout.name=verl_search_cpu",)  # the transformers rollout (vLLM: test_vllm_rollout)
    first = train(recipe, searching_models[protocol], data[protocol], url, out, steps=2, extra=engine)
    assert first["code"] == 0, first["log"][-6000:]
    resumed = train(recipe, searching_models[protocol], data[protocol], url, out, steps=3, extra=engine)
    assert resumed["code"] == 0, resumed["log"][-6000:]
    return {"name": request.param, "protocol": protocol, "out": out, "first": first, "resumed": resumed}


def test_steps_finish_with_finite_losses(run):
    metrics = run["first"]["metrics"]
    assert sorted(metrics) == [1, 2]
    for step, values in metrics.items():
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert math.isfinite(values[key]), (step, key, values[key])
        if run["name"].startswith("ppo"):
            # GAE advantages from the critic are never all zero (GRPO's are, while every sample of a
            # group scores 0 as here: its weights then move by weight decay and the KL loss only)
            assert math.isfinite(values["critic/vf_loss"]), values["critic/vf_loss"]
            assert values["actor/grad_norm"] > 0, "no gradient reached the actor"


def test_weights_change_and_the_rollout_serves_them(run):
    ckpt = run["out"] / "ckpt"
    step1, step2 = checkpoint_weights(ckpt, 1), checkpoint_weights(ckpt, 2)
    moved = sum(float((step2[n] - step1[n]).abs().max()) for n in step1)
    assert moved > 0, "the actor's weights did not change between steps 1 and 2"
    # the rollout server logs a checksum of every weight set it loads; update k+1 carries the
    # weights the actor had after step k (update 1 is the initial sync)
    updates = {int(k): (int(n), float(c)) for k, n, c in CHECKSUM.findall(run["first"]["log"])}
    assert {1, 2, 3} <= set(updates), sorted(updates)
    for step, weights in ((1, step1), (2, step2)):
        count, logged = updates[step + 1]
        names = sorted(weights)[:count] if count < len(weights) else sorted(weights)
        assert logged == pytest.approx(checksum(weights, names), rel=1e-9), (step, logged)
    assert updates[2][1] != pytest.approx(updates[3][1], rel=1e-9)
    # and verl's own check: the rollout's log-probs equal the trainer's for the same weights
    for step, values in run["first"]["metrics"].items():
        assert values["training/rollout_probs_diff_max"] < 1e-3, (step, values["training/rollout_probs_diff_max"])


def test_retrieved_tokens_are_masked_in_the_trained_batch(run):
    from transformers import AutoTokenizer

    from tests.conftest import QWEN_TOKENIZER

    tokenizer = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    records = run["first"]["records"]
    assert records, "no training sample was recorded"
    searched = {}  # samples whose observation holds passages about the fitted query, by training step
    for record in records:
        ids, mask = record["response_ids"], record["response_mask"]
        assert len(ids) == len(mask)
        model_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 1])
        observation = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
        if QUERY.split()[-1] in observation:  # passages about the fitted model's query came back
            searched[record["global_steps"]] = searched.get(record["global_steps"], 0) + 1
            assert "Doc 1(Title:" in observation
            assert "Doc 1(Title:" not in model_text, "retrieved text is in the tokens the actor is trained on"
        opener = "<information>" if run["protocol"] == "search_r1" else "<tool_response>"
        assert opener not in model_text
    # Step 1 samples the fitted weights, yet at temperature 1 a sample's tool call sometimes breaks (2 of 4 in one CI
    # run); later steps sample weights that lr 1e-3 has moved, whose calls break more often (0 of 4 in step 2 of that
    # run). So the masks above are checked on every sample, and step 1 must have searched at least once.
    first = sum(1 for record in records if record["global_steps"] == 1)
    assert searched.get(1, 0) >= 1, f"none of step 1's {first} samples searched ({searched} by step)"


def test_our_metrics_reach_the_logged_step_metrics(run):
    values = run["first"]["metrics"][2]  # validation ran at step 2 (test_freq=2)
    keys = {key.split("/")[-2] for key in values if key.startswith(("val-core/", "val-aux/"))}
    assert {"acc", "num_searches", "failed_searches"} <= keys, sorted(values)
    searches = [v for k, v in values.items() if k.startswith("val-aux/") and "/num_searches/" in k]
    assert max(searches) >= 1, searches
    failed = {k: v for k, v in values.items() if "/failed_searches/mean" in k}
    assert failed, sorted(values)
    # the BM25 server answers every well-formed call; after two updates at lr 1e-3 a validation sample
    # sometimes writes a call with broken arguments (counted as failed: 0.25 per trajectory in one CI run),
    # so what is checked is that searches reached the server, not that none was malformed
    for key, value in failed.items():
        searches = values[key.replace("/failed_searches/", "/num_searches/")]
        assert value == 0 or value < searches, (key, value, searches)


def test_a_resumed_run_continues_from_the_checkpoint(run):
    resumed = run["resumed"]
    assert sorted(resumed["metrics"]) == [3], sorted(resumed["metrics"])
    assert "global_step_2" in resumed["log"]
    assert (run["out"] / "ckpt" / "global_step_3").is_dir()
    assert (run["out"] / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
