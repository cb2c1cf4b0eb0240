"""What torch.compile of verl's entropy costs on the CPU: verl's FSDP engine wraps
`verl.utils.torch_functional.entropy_from_logits_with_chunking` in `torch.compile(..., dynamic=True)`
unless `use_torch_compile=false` (`verl/workers/engine/fsdp/transformer_impl.py`), and calls it without
gradients (old log-probs) and with them, under `torch.utils.checkpoint` (the update).

Each mode runs in a fresh process with an empty inductor cache (`TORCHINDUCTOR_CACHE_DIR`), as on a fresh
machine, over the same sequence of calls: SmolLM2's vocabulary (49,152), responses of `--lengths` tokens, each
once without gradients and once with the checkpointed forward and backward. Printed: each call's seconds, each
mode's total, the ratio of compiled (empty cache) to eager, and the largest relative difference of a compiled
entropy sum from eager's.

    python benchmarks/bench_entropy_compile.py
    python benchmarks/bench_entropy_compile.py --lengths 300,517,800,1200,301,999 --warm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

VOCAB = 49_152  # SmolLM2-135M-Instruct


def run_mode(compiled: bool, lengths: list[int], chunk: int) -> dict:
    """In this process: every call of `lengths`, timed; returns seconds per call and the entropies' sums."""
    import torch
    from verl.utils import torch_functional

    fn = torch_functional.entropy_from_logits_with_chunking
    entropy = torch.compile(fn, dynamic=True) if compiled else fn
    torch.manual_seed(0)
    calls, sums = [], []
    for n in lengths:
        logits = torch.randn(n, VOCAB)
        start = time.perf_counter()
        with torch.no_grad():
            values = entropy(logits, chunk_size=chunk)
        no_grad = time.perf_counter() - start
        leaf = logits.clone().requires_grad_(True)
        start = time.perf_counter()
        torch.utils.checkpoint.checkpoint(entropy, leaf, chunk, use_reentrant=False).sum().backward()
        calls.append({"tokens": n, "no_grad_s": no_grad, "grad_s": time.perf_counter() - start})
        sums.append(values.double().sum().item())
    return {"calls": calls, "sums": sums}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="300,517,800,1200,301,999", help="response tokens per call")
    parser.add_argument("--chunk", type=int, default=2048, help="verl's entropy_from_logits_chunk_size")
    parser.add_argument("--warm", action="store_true", help="also run compiled again on the filled cache")
    parser.add_argument("--child", choices=["eager", "compiled"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.child:
        print(json.dumps(run_mode(args.child == "compiled", lengths, args.chunk)))
        return
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        modes = [("eager", "eager"), ("compiled", "compiled (empty cache)")]
        if args.warm:
            modes.append(("compiled", "compiled (filled cache)"))
        for mode, label in modes:
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--lengths", args.lengths,
                                  "--chunk", str(args.chunk)], env=env, capture_output=True, text=True, check=True)
            results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    print("| mode | " + " | ".join(f"{n} tok" for n in lengths) + " | total s |")
    print("| --- |" + " ---: |" * (len(lengths) + 1))
    totals = {}
    for label, result in results.items():
        cells = [f"{c['no_grad_s']:.2f} + {c['grad_s']:.2f}" for c in result["calls"]]
        totals[label] = sum(c["no_grad_s"] + c["grad_s"] for c in result["calls"])
        print(f"| {label} | " + " | ".join(cells) + f" | {totals[label]:.1f} |")
    print(f"compiled (empty cache) / eager: {totals['compiled (empty cache)'] / totals['eager']:.2f}x "
          "(each cell: seconds without gradients + with the checkpointed forward and backward)")
    eager_sums = results["eager"]["sums"]
    worst = max(abs(a - b) / max(abs(a), 1e-12) for label, r in results.items() if label != "eager"
                for a, b in zip(eager_sums, r["sums"]))
    print(f"largest relative difference of an entropy sum against eager: {worst:.1e}")


if __name__ == "__main__":
    main()
