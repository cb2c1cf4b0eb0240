"""GRPO steps through the training launcher (`training.launch`: check-config, then verl's `main_ppo` with
the CPU plugin, as `verl-search train RECIPE --cpu --index INDEX` runs them), on the shipped GRPO
Search-R1 recipe with CPU-size overrides, then the last checkpoint merged into a Hugging Face folder by
verl's model merger.

The protocol limits (turns, top-k, tokens per turn and per observation, validation temperature)
come from the same `EvalOptions` object the evaluations use (`options.protocol_options`). An
interrupted run resumes from its last checkpoint (`trainer.resume_mode=auto`, one checkpoint per
step, the newest kept).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from verl_search.agent_protocol.registry import search_cap_keys
from verl_search.eval.options import EvalOptions
from verl_search.report.grpo_signal import filter_metric_key
from verl_search.training.names import PERMUTE_KWARG, PERMUTE_SEED_KWARG, TRAIN_AT_LIMIT_KWARG
from verl_search.training.progress import failure_message, run_logged

logger = logging.getLogger(__name__)

URL_INTERPOLATION = '${oc.env:VERL_SEARCH_URL,"http://127.0.0.1:8000/retrieve"}'
GRPO_KVCACHE_SPACE_GIB = 1
"""vLLM's KV cache (GiB) in the GRPO stage where `VLLM_CPU_KVCACHE_SPACE` is unset: 23,296 tokens of
SmolLM2-135M in fp32, room for a step's 16 trajectories, while the trainer holds the actor beside it
(`train --cpu` alone and the evaluations keep `cpu.vllm_cpu.DEFAULT_KVCACHE_SPACE_GIB`, 2: a batch of
34 evaluation questions fills more than 1 GiB)."""
INFLIGHT_GEN_BATCHES = 1
"""verl's `algorithm.filter_groups.max_inflight_gen_batches` with group filtering on: at most 1 generation batch
(2 questions x 8 rollouts at the default sizes) pending or running while refilling, verl's default. verl refills two
prompts for every group filtered out and lets the groups still running finish once enough carry signal, so more
in flight means more groups generated and discarded: on the quickstart's questions (about half of the groups carry
signal) 4 in flight generated 2.9 groups per trained group and more than 4 at 2 of 14 steps; 1 is modelled at 2.3,
and more than 4 at 1 step in 20 without a limit (`benchmarks/sim_dynamic_sampling.py`, results/dynamic_sampling;
the study's `max_gen_batches`, 4 by default, bounds it). A group
generates faster with more beside it (6.8 s against 5.1-5.4 s with 4 in flight, 18-28 groups a step), which
pays only when a step needs many groups."""
#: the shipped GRPO recipe: package data, a link to examples/grpo_qwen2.5-3b-base_search_r1/config.yaml in a
#: checkout (one file), copied into the wheel, so the quickstart runs from any directory
RECIPE = "grpo_qwen2.5-3b-base_search_r1.yaml"


def shipped_recipe() -> Path:
    """The shipped Search-R1 GRPO recipe (`examples/grpo_qwen2.5-3b-base_search_r1/config.yaml`), as
    installed with the package."""
    from importlib import resources

    return Path(str(resources.files("verl_search.configs") / RECIPE))


def rollout_name(engine: str) -> str:
    """`actor_rollout_ref.rollout.name` for an engine `cpu.engine.choose_engine` returned: verl's `vllm`
    (the CPU plugin's vLLM replica) or our transformers rollout (`verl_search_cpu`)."""
    from verl_search.cpu import vllm_cpu
    from verl_search.cpu.names import ROLLOUT_NAME

    return vllm_cpu.ROLLOUT_NAME if engine == "vllm" else ROLLOUT_NAME


def agent_loop_yaml(protocol: EvalOptions, path: Path) -> Path:
    """A copy of the shipped agent-loop YAML with `protocol`'s turns, top-k and token limits (the
    URL stays `$VERL_SEARCH_URL`, which `verl-search train --index` sets)."""
    from verl_search.verl_config.shipped import config_path

    entries = yaml.safe_load(Path(config_path("agent-loop")).read_text())
    # each loop's own name for its search cap (`Protocol.search_cap_key`), as `verl-search eval` sets it
    caps = search_cap_keys()
    for entry in entries:
        entry.update({caps[entry["name"]]: protocol.max_turns} if entry["name"] in caps else {}, topk=protocol.topk,
                     max_tokens_per_turn=protocol.max_tokens_per_turn, max_obs_tokens=protocol.max_obs_tokens)
        entry["retrieval_service_url"] = URL_INTERPOLATION
    text = yaml.safe_dump(entries, sort_keys=False).replace(f"'{URL_INTERPOLATION}'", URL_INTERPOLATION)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def weight_bucket_megabytes(model: str | Path) -> int:
    """verl's weight-sync bucket (`checkpoint_engine.update_weights_bucket_megabytes`, MB) for the model
    folder `model`: its largest fp32 tensor (the embedding, `vocab_size x hidden_size`, or an MLP
    projection), rounded up to 64 MB, at least 128 MB. verl's default, 2,048 MB, puts all of a small model
    in one bucket: a whole extra copy of it on each side of the sync (0.5 GiB for SmolLM2-135M).

    Raises:
        FileNotFoundError: `model` has no `config.json`.
    """
    import json
    import math

    config = json.loads((Path(model) / "config.json").read_text())
    hidden = config["hidden_size"]
    largest = max(config["vocab_size"], config.get("intermediate_size", 0)) * hidden * 4
    return max(128, 64 * math.ceil(largest / (64 << 20)))


REWARD_WEIGHTS = {
    # Search-R1's qa_em_format: EM, plus 0.2 for a well-formed trajectory, 0.1 for a malformed one with an answer
    "em": {"structure_format_score": 0.2, "final_format_score": 0.1},
    # ReSearch's re_search.py: F1 of a well-formed answer, 0.1 when well formed with F1 0, 0 when malformed
    "f1": {"answer_score": "f1", "structure_format_score": 0.1},
}
"""`QuickstartOptions.reward` -> `compute_score` keyword arguments."""


def reward_overrides(reward: str) -> list[str]:
    """The recipe overrides that make `compute_score` the `reward` (`REWARD_WEIGHTS`).

    Raises:
        ValueError: `reward` is not a key of `REWARD_WEIGHTS`.
    """
    if reward not in REWARD_WEIGHTS:
        raise ValueError(f"reward={reward!r}: use one of {', '.join(REWARD_WEIGHTS)}")
    return [f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in REWARD_WEIGHTS[reward].items()]


def filter_overrides(max_gen_batches: int, metric: str = "reward") -> list[str]:
    """DAPO's dynamic sampling (verl's `algorithm.filter_groups`, honoured by the recipe's replay buffer,
    `verl_search.training.replay_buffer`) on `metric` (`report.grpo_signal.filter_metric_key`: `reward`, `acc`
    or `f1`): at most `max_gen_batches` generation batches a step (0: no limit), at the limit training on the
    groups at hand (`TRAIN_AT_LIMIT_KWARG`), `INFLIGHT_GEN_BATCHES` of them generating at once."""
    return ["algorithm.filter_groups.enable=true", f"algorithm.filter_groups.metric={metric}",
            f"algorithm.filter_groups.max_num_gen_batches={max_gen_batches}",
            f"algorithm.filter_groups.max_inflight_gen_batches={INFLIGHT_GEN_BATCHES}",
            f"+trainer.v1.sampler.sampler_kwargs.{TRAIN_AT_LIMIT_KWARG}=true"]


def grpo_overrides(protocol: EvalOptions, *, model: str, train_file: Path, val_file: Path, out: Path, steps: int,
                   prompts_per_step: int, group_size: int, lr: float, kl: bool, reward: str = "em",
                   max_gen_batches: int | None = None, permuted_reward: bool = False, seed: int = 0,
                   filter_metric: str = "reward", dtype: str = "float32") -> list[str]:
    """Hydra overrides of the recipe for a CPU-size GRPO run writing into `out`, rolling out on
    `protocol.engine` (`rollout_name`; vLLM computing in `protocol.dtype`), the actor computing in `dtype`
    (`float32` or `bfloat16`: FSDP mixed precision, `cpu.precision.mixed_precision`), trained on `reward`
    (`reward_overrides`), with group filtering
    unless `max_gen_batches` is None (`filter_overrides`, on `filter_metric_key(filter_metric, ...)`: `reward`
    or `answer`); `permuted_reward`: the control, its scores shuffled within each step by `seed`
    (`verl_search.training.replay_buffer`).

    Raises:
        ValueError: `reward` or `filter_metric` unknown (`reward_overrides`, `filter_metric_key`); `dtype` not
            `float32` or `bfloat16`.
    """
    from verl_search.cpu.precision import mixed_precision

    metric = filter_metric_key(filter_metric, reward, protocol.protocol)
    precision = mixed_precision(dtype)
    rollout = "actor_rollout_ref.rollout"
    vllm = protocol.engine == "vllm"
    return [
        f"{rollout}.name={rollout_name(protocol.engine)}",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train_file}", f"data.val_files={val_file}",
        f"data.train_batch_size={prompts_per_step}", f"{rollout}.n={group_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts_per_step}",
        # one trajectory per micro-batch: with a 49k-token vocabulary the logits (and their log-softmax and
        # gradient) are the actor's peak of memory, about 0.2 GB per 1,000 tokens each in fp32; in bf16, 4 per
        # micro-batch made the update slower (docs/benchmarks/cpu-dtype.md)
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=1",
        # and the entropy computed in chunks and recomputed in the backward pass, not kept (same values)
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
        "actor_rollout_ref.actor.entropy_checkpointing=true",
        # but the layers' activations kept, not recomputed (verl's default gradient checkpointing is a GPU-memory
        # setting): on SmolLM2-135M the update takes 28% less time (11.6 against 16.0 ms per token) for 0.1 GB more
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        # the trainer's compute dtype, and the vLLM rollout's (`--dtype`)
        f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={precision}",
        f"++actor_rollout_ref.ref.fsdp_config.mixed_precision={precision}",
        *([f"{rollout}.dtype={protocol.dtype}"] if vllm else []),
        f"{rollout}.checkpoint_engine.update_weights_bucket_megabytes={weight_bucket_megabytes(model)}",
        f"actor_rollout_ref.actor.use_kl_loss={str(kl).lower()}",  # without it there is no reference model
        f"actor_rollout_ref.actor.optim.lr={lr}", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        f"data.max_prompt_length={protocol.prompt_length}", f"data.max_response_length={protocol.response_length}",
        f"{rollout}.prompt_length={protocol.prompt_length}", f"{rollout}.response_length={protocol.response_length}",
        f"{rollout}.val_kwargs.temperature={protocol.temperature}",
        f"{rollout}.agent.agent_loop_config_path={agent_loop_yaml(protocol, out / 'agent_loops.yaml')}",
        *reward_overrides(reward), *(filter_overrides(max_gen_batches, metric) if max_gen_batches is not None else []),
        *([f"+trainer.v1.sampler.sampler_kwargs.{PERMUTE_KWARG}=true",
           f"+trainer.v1.sampler.sampler_kwargs.{PERMUTE_SEED_KWARG}={seed}"] if permuted_reward else []),
        f"trainer.total_training_steps={steps}", "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=1",
        # each checkpoint also holds the Hugging Face weights (about 1 s to write), the stage's model without a
        # merger process (about 10 s: its imports)
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.resume_mode=auto", "trainer.test_freq=-1", "trainer.val_before_train=false",
        f"trainer.default_local_dir={out / 'ckpt'}", f"trainer.rollout_data_dir={out / 'rollouts'}",
        "trainer.logger=[console,file]", "trainer.experiment_name=quickstart-grpo-cpu",
    ]


def run_grpo(recipe: Path, index: Path, overrides: list[str], out: Path, steps: int) -> Path:
    """Train as `verl-search train RECIPE --cpu --index INDEX OVERRIDES` does (check-config in a child
    process, while the trainer starts: problems it finds stop the trainer; `index` served for the run, `server.local.serve_for_run`;
    `main_ppo` with the launcher's command and environment, vLLM's KV cache `GRPO_KVCACHE_SPACE_GIB` where
    `VLLM_CPU_KVCACHE_SPACE` is unset); return the last checkpoint's Hugging Face folder, copied to `out/hf` (the
    checkpoint holds the weights, `hf_model`; verl's model merger makes them where it does not).

    Raises:
        FileNotFoundError: `recipe` does not exist.
        RuntimeError: check-config found problems, or training or merging failed (the message names the
            log and quotes its end, `training.progress.failure_message`).
    """
    from verl_search.cpu.vllm_cpu import KVCACHE_ENV
    from verl_search.server.local import serve_for_run
    from verl_search.training.launch import check_in_child, main_ppo_command, train_env, train_overrides

    if not Path(recipe).is_file():
        raise FileNotFoundError(f"recipe {recipe} does not exist; pass --recipe PATH (a recipe YAML) or leave "
                                "--recipe out for the shipped one")
    log, metrics = out / "train.log", out / "metrics.jsonl"
    overrides = train_overrides(overrides, cpu=True)
    base = {KVCACHE_ENV: str(GRPO_KVCACHE_SPACE_GIB), **os.environ, "VERL_FILE_LOGGER_PATH": str(metrics),
            "RAY_DEDUP_LOGS": "0"}
    # check-config (a child process, about 13 s of imports on one core) runs while the trainer starts (about 7 s
    # of imports on the other before Ray); problems it finds stop the trainer, long before its first step
    def refuse_problems() -> None:
        problems = check.result()
        if problems:
            raise RuntimeError(f"{recipe} with the GRPO stage's overrides fails check-config: " + "; ".join(problems))

    with ThreadPoolExecutor(1) as pool:
        check = pool.submit(check_in_child, recipe, overrides)
        with serve_for_run(None, str(index)) as url:
            code = run_logged(main_ppo_command(recipe, overrides), train_env(cpu=True, retrieval_url=url, base=base),
                              log, metrics, steps, out.name,
                              while_running=lambda: refuse_problems() if check.done() else None)
            refuse_problems()  # a trainer that ended before the check: the check's verdict comes first
    checkpoint = out / "ckpt" / f"global_step_{steps}" / "actor"
    if code != 0 or not checkpoint.is_dir():
        raise RuntimeError(failure_message(f"GRPO training failed (exit {code}, no {checkpoint})", log))
    merged = out / "hf"
    saved = checkpoint / "huggingface"
    if not (merged / "config.json").is_file() and any(saved.glob("*.safetensors")):
        partial = out / "hf.partial"  # renamed when whole: a copy cut short is never taken for the model
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(saved, partial)
        shutil.rmtree(merged, ignore_errors=True)
        partial.rename(merged)
    if not (merged / "config.json").is_file():  # a checkpoint saved without its weights (before hf_model)
        merge = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                 "--local_dir", str(checkpoint), "--target_dir", str(merged)]
        with open(log, "a", encoding="utf-8") as sink:
            code = subprocess.call(merge, stdout=sink, stderr=subprocess.STDOUT)
        if code != 0:
            raise RuntimeError(failure_message(f"verl's model merger failed on {checkpoint} (exit {code})", log))
    return merged
