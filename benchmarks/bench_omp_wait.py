"""How OpenMP's wait policy changes torch on a machine whose cores two processes share.

Each measurement runs in fresh processes (libgomp reads `OMP_WAIT_POLICY` and `GOMP_SPINCOUNT` when torch loads
it): a SmolLM2-135M-shaped Llama (30 layers, hidden 576, random weights) doing forward and backward passes over 400
tokens for `--seconds`, alone and then as two processes at once, under libgomp's default (spin a while, then
sleep), `GOMP_SPINCOUNT=10000` and `OMP_WAIT_POLICY=PASSIVE` (sleep at once). Prints the seconds per pass of
each process and, per policy, the two-at-once seconds over the alone seconds (2.0 is a fair share of the cores).

    python benchmarks/bench_omp_wait.py [--seconds 25]

tests/conftest.py sets `OMP_WAIT_POLICY=PASSIVE` for the suite, whose two pytest-xdist workers compute at once
(docs/development.md). Results: docs/benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

POLICIES = {"default": {}, "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
            "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}

WORK = """
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, vocab_size=49152)
model = LlamaForCausalLM(config)
tokens = torch.randint(0, 49152, (1, 400))
model(tokens).logits.sum().backward()  # warm-up
started, passes = time.perf_counter(), 0
while time.perf_counter() - started < float(sys.argv[1]):
    model(tokens).logits.sum().backward()
    passes += 1
print((time.perf_counter() - started) / passes)
"""


def run(policy: dict, processes: int, seconds: float) -> list[float]:
    """Seconds per forward and backward pass of each of `processes` processes started together under `policy`."""
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(policy)
    started = [subprocess.Popen([sys.executable, "-c", WORK, str(seconds)], env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(processes)]
    return [float(process.communicate()[0]) for process in started]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=25.0, help="measured seconds per process (default: 25)")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; a pass: forward and backward of 400 tokens through a SmolLM2-135M shape")
    for name, policy in POLICIES.items():
        alone = run(policy, 1, args.seconds)[0]
        both = run(policy, 2, args.seconds)
        print(f"{name:24s} alone {alone:6.2f} s/pass   two at once {both[0]:6.2f} and {both[1]:6.2f} s/pass   "
              f"two at once / alone {sum(both) / 2 / alone:5.2f}")


if __name__ == "__main__":
    main()
