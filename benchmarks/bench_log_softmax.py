"""PyTorch's fp32 `log_softmax` on the CPU against `logit - logsumexp` (verl's trainer) and float64.

vLLM's CPU sampler returns `logits.log_softmax(dim=-1, dtype=torch.float32)` as the rollout's
log-probs; verl's trainer recomputes them as `logit - torch.logsumexp(logits)`
(`verl.utils.torch_functional.logprobs_from_logits_v2`). verl's `training/rollout_probs_diff_max`
compares the two as probabilities. This prints, per kind of logit row, the largest and mean
|exp(fp32 formula) - exp(float64 log_softmax)| of the top token for each formula:

* `peaked`: a tiny Qwen2 fitted to search (`tests/training/searching_model.py`), as measured on its logits:
  one token at 12.5, the other 151,664 around -5.3 (std 0.27);
* `spread`: a spread distribution: N(0, 0.5) logits with one token at 13 (a real model's
  shape; SmolLM2's vocabulary of 49,152 and Qwen2.5's of 151,665).

No model, no vLLM; seconds. `python benchmarks/bench_log_softmax.py [--rows 64]`
"""

from __future__ import annotations

import argparse
import os

import torch


def rows(kind: str, vocab: int, count: int, generator: torch.Generator) -> torch.Tensor:
    if kind == "peaked":
        logits = torch.randn(count, vocab, generator=generator) * 0.27 - 5.3
        logits[:, 0] = 12.5
    else:
        logits = torch.randn(count, vocab, generator=generator) * 0.5
        logits[:, 0] = 13.0
    return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()}")
    print("| logits | vocab | p(top) | torch.log_softmax fp32: max / mean prob error | logit - logsumexp fp32: max / mean |")
    print("| --- | --- | --- | --- | --- |")
    for kind, vocab in (("peaked", 151_665), ("spread", 49_152), ("spread", 151_665)):
        logits = rows(kind, vocab, args.rows, generator)
        exact = torch.log_softmax(logits.double(), dim=-1)[:, 0].exp()
        softmax = torch.log_softmax(logits, dim=-1)[:, 0].double().exp()
        lse = (logits[:, 0] - torch.logsumexp(logits, dim=-1)).double().exp()
        e1, e2 = (softmax - exact).abs(), (lse - exact).abs()
        print(f"| {kind} | {vocab:,} | {exact.mean():.3f} | {e1.max():.1e} / {e1.mean():.1e} | {e2.max():.1e} / {e2.mean():.1e} |")


if __name__ == "__main__":
    main()
