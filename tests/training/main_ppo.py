"""Test-only: run a shipped recipe through verl's own trainer as users start it (`verl-search train RECIPE
--cpu`, i.e. `python -m verl.trainer.main_ppo` with the CPU plugin) and read back what the trainer wrote.

Every run is instrumented through verl's public hooks only:

* `recorder.py` (`rollout.agent.agent_loop_manager_class`): every training sample the agent-loop workers put
  into TransferQueue (response ids, response mask, reward, extra fields);
* `probe.py` (`register_trainer`, `trainer.v1.trainer_mode`): per update, the log-probabilities (actor) and
  value losses (critic) of the step's own batch before and after the update, with verl's computations;
* verl's file logger (`VERL_FILE_LOGGER_PATH`): the metrics of every step.

`actor_checkpoint` reads the actor's weights from verl's checkpoint; `rollout_probability_gap` recomputes the
probabilities of recorded samples under given weights, to compare with the rollout engine's.

`VERL_SEARCH_TEST_REWARD=constant` replaces the recipe's reward by `constant_reward.py` (our reward's
outputs with the score fixed at 0): the training tests must then fail, which shows that what they assert
comes from the reward (docs/development.md shows the command and the failure).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.trainer_runs import kvcache_gib, run_trainer
from tests.training.probe import PROBE_ENV, PROBE_TRAINER
from tests.training.recorder import RECORD_ENV

RECIPES = {
    "grpo_search_r1": (REPO / "examples" / "grpo_qwen2.5-3b-base_search_r1" / "config.yaml", "search_r1"),  # quickstart's
    "grpo_tool": (REPO / "examples" / "grpo_qwen2.5-3b-instruct_tool" / "config.yaml", "tool"),
    "ppo_search_r1": (REPO / "examples" / "ppo_qwen2.5-3b-base_search_r1" / "config.yaml", "search_r1"),
    "grpo_research": (REPO / "examples" / "grpo_qwen2.5-7b-instruct_research" / "config.yaml", "research"),
}
"""Test name -> (shipped recipe, protocol)."""
TIMEOUT = 1500
"""Seconds per `main_ppo` run; a run of 2 steps takes 3-5 minutes on 2 shared cores."""
REWARD_ENV = "VERL_SEARCH_TEST_REWARD"
CONSTANT_REWARD = Path(__file__).with_name("constant_reward.py")


def reward_overrides() -> list[str]:
    """The recipe's own reward, or the constant one where `VERL_SEARCH_TEST_REWARD=constant`."""
    choice = os.environ.get(REWARD_ENV, "")
    if choice not in ("", "constant"):
        raise ValueError(f"{REWARD_ENV}={choice!r}: use 'constant' or leave it unset")
    if choice == "constant":
        return [f"reward.custom_reward_function.path={CONSTANT_REWARD}",
                "reward.custom_reward_function.name=compute_score"]
    return []


def train(recipe: Path, model: Path, train_file: Path, val_file: Path, url: str, out: Path, steps: int,
          overrides: list[str] | tuple[str, ...] = (), trainer: str = PROBE_TRAINER) -> dict:
    """`verl-search train RECIPE --cpu` for `steps` steps (it resumes from a checkpoint in `out/ckpt`).

    `trainer`: the probe of verl's sync trainer (`PROBE_TRAINER`) or of its `colocate_async` one
    (`ASYNC_PROBE_TRAINER`). Returns `code`, `log`, `metrics` ({step: {name: value}}), `records` (recorder.py
    lines) and `probe`
    (probe.py lines) of this run; the log is also written to `out/train_{steps}.log`.
    """
    from verl_search.cpu.names import PLUGIN_MODULE

    metrics, record, probe = (out / f"{name}_{steps}.jsonl" for name in ("metrics", "record", "probe"))
    command = [
        sys.executable, "-m", "verl_search.cli", "train", str(recipe), "--cpu", "--retrieval-url", url,
        f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
        f"data.train_files={train_file}", f"data.val_files={val_file}",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=100",  # the test data is a batch or two
        "trainer.val_before_train=false", f"trainer.default_local_dir={out / 'ckpt'}",
        "trainer.logger=[console,file]", f"trainer.v1.trainer_mode={trainer}",
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tests.training.recorder.RecordingAgentLoopManager",
        *overrides, *reward_overrides(),
    ]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics), RECORD_ENV: str(record), PROBE_ENV: str(probe),
           # the probe trainer registers itself in every verl process, after the CPU plugin
           "VERL_USE_EXTERNAL_MODULES": f"{PLUGIN_MODULE},tests.training.probe",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "RAY_DEDUP_LOGS": "0", "VLLM_CPU_KVCACHE_SPACE": kvcache_gib()}
    code, log = run_trainer(command, env, out, out / f"train_{steps}.log", TIMEOUT)
    by_step: dict[int, dict] = {}
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            entry = json.loads(line)
            by_step.setdefault(entry["step"], {}).update(entry["data"])
    return {"code": code, "log": log, "metrics": by_step, "records": _lines(record), "probe": _lines(probe)}


def actor_checkpoint(ckpt: Path, step: int) -> dict:
    """The actor's weights in verl's checkpoint of `step` under `ckpt` (`trainer.default_local_dir`), as plain
    tensors by parameter name (FSDP2's DTensors made local: one logical GPU holds them all)."""
    import torch

    state = torch.load(ckpt / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt",
                       map_location="cpu", weights_only=False)
    return {name: (t.to_local() if hasattr(t, "to_local") else t) for name, t in state.items()}


def rollout_probability_gap(model_folder, records: list[dict], state: dict | None = None) -> float:
    """Largest |p_rollout - p| over the model-written response tokens of `records` (recorder.py lines), p the
    probability under the model at `model_folder` (with `state` loaded), recomputed here with transformers at
    temperature 1 over the full distribution, as the run samples; what verl's `rollout_probs_diff_max` measures."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl_search.cpu.vllm_cpu import log_softmax_fp32

    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied to the embedding
        model.tie_weights()
    gap = 0.0
    with torch.no_grad():
        for record in records:
            prompt, response = record["prompt_ids"], record["response_ids"]
            hidden = model.model(input_ids=torch.tensor([prompt + response])).last_hidden_state[0]
            # the LM head (the whole vocabulary) only where the model wrote the next token, not the observations
            written = torch.tensor(record["response_mask"], dtype=torch.bool)
            # verl's trainer's formula (`logits - logsumexp`): PyTorch's CPU fp32 log_softmax is off by up to 1.6e-4
            log_probs = log_softmax_fp32(model.lm_head(hidden[len(prompt) - 1:-1][written]))
            mine = log_probs.gather(-1, torch.tensor(response)[written].unsqueeze(-1)).squeeze(-1).exp()
            theirs = torch.tensor(record["response_logprobs"])[written].exp()
            gap = max(gap, float((mine - theirs).abs().max()))
    return gap


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
