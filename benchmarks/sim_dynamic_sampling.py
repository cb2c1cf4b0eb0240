"""How many groups DAPO's group filtering generates per trained group, by how many generation batches are in
flight: a simulation of verl 0.9.1's sync replay buffer, with the share of groups that carry signal estimated
from GRPO runs' `metrics.jsonl`.

The rule simulated is verl's (`verl/trainer/ppo/v1/replay_buffer.py`, `ReplayBuffer.sample`, 0.9.1): a step
starts with `train_batch_size` prompts; every finished group whose scores are all equal is evicted and adds two
prompts of refill credit; refills are dispatched while fewer than `max_inflight_gen_batches x train_batch_size`
prompts are pending or running; once `train_batch_size` groups with signal have finished, no more are dispatched,
the groups still running finish (and are counted), the surplus is discarded. Each group carries signal with
probability p, independently; groups finish in a random order (durations uniform in [0.6, 1.4] x the mean).
With `--max-gen-batches N` the rule of `verl_search.training.replay_buffer` with `train_at_max_gen_batches`
(the quickstart's) is added: at most `(N - 1) x train_batch_size` groups are evicted and refilled a step, the
groups without signal that finish after that are kept, and the step trains on the groups with signal first, then
on kept ones; the table then also gives the share of steps that train a group without signal.

p is estimated from the runs given (a `metrics.jsonl` or `.jsonl.gz` of the GRPO stage, one per run): per step,
the groups generated (`search/groups/generated`) less those evicted (`training/filter_groups/evicted_samples`) are
the ones that carried signal. It is a model of the count of groups, not a measurement of seconds; how long a
group takes depends on how many generate at once (docs/quickstart.md, "GRPO").

    python benchmarks/sim_dynamic_sampling.py results/dynamic_sampling/*/metrics.jsonl --steps 2
    python benchmarks/sim_dynamic_sampling.py results/dynamic_sampling/*/metrics.jsonl --in-flight 1 \
        --max-gen-batches 0 4
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import random
from pathlib import Path

GENERATED = "search/groups/generated"
EVICTED = "training/filter_groups/evicted_samples"
SURPLUS = "training/filter_groups/discarded_surplus_samples"


def read_steps(path: Path) -> list[dict]:
    """The logged steps of a `metrics.jsonl` (or `.jsonl.gz`) of verl's file logger: `{"step", "data"}` each."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def signal_counts(paths: list[Path]) -> tuple[int, int, list[float]]:
    """(groups that carried signal, groups generated, groups generated per trained group of every step) over the
    runs; a step that logged no `GENERATED` is left out.

    Raises:
        ValueError: no step logged it (group filtering off, or not the sync trainer).
    """
    signal = generated = 0
    ratios = []
    for path in paths:
        for step in read_steps(path):
            data = step["data"]
            if GENERATED not in data:
                continue
            count, evicted = int(data[GENERATED]), int(data.get(EVICTED, 0))
            signal, generated = signal + count - evicted, generated + count
            ratios.append(count / (count - evicted - int(data.get(SURPLUS, 0))))  # over the trained groups
    if not generated:
        raise ValueError(f"no step of {[str(p) for p in paths]} logged {GENERATED}: group filtering was off")
    return signal, generated, ratios


def simulate_step(p: float, in_flight: int, batch: int, rng: random.Random,
                  max_gen_batches: int = 0) -> tuple[int, int]:
    """(groups generated, groups trained without signal) by one step of verl's sync DAPO sampling (the module's
    rule) before `batch` groups are ready, with at most `in_flight` x `batch` prompts pending or running, and at
    most `max_gen_batches` x `batch` generated (0: no limit; then `p` must be > 0, else no step ends)."""
    limit, generated, found, kept, evicted, credit, draining = in_flight * batch, 0, 0, 0, 0, 0, False
    refills = (max_gen_batches - 1) * batch if max_gen_batches > 0 else float("inf")
    running: list[tuple[float, bool]] = []

    def dispatch(now: float, count: int) -> None:
        nonlocal generated
        for _ in range(count):
            heapq.heappush(running, (now + rng.uniform(0.6, 1.4), rng.random() < p))
            generated += 1

    dispatch(0.0, batch)
    while running:
        now, has_signal = heapq.heappop(running)
        if has_signal:
            found += 1
        elif evicted < refills:
            evicted, credit = evicted + 1, credit + 2
        else:
            kept += 1
        if found + kept >= batch:
            draining, credit = True, 0
        if not draining and credit:
            count = min(credit, limit - len(running), refills - (generated - batch))
            credit -= count
            dispatch(now, int(count))
    return generated, max(0, batch - found)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path, nargs="*", help="GRPO stages' metrics.jsonl(.gz), to estimate p")
    parser.add_argument("--p", type=float, nargs="*", default=None, help="signal shares to simulate (default: "
                        "the estimate, and 0.1 either side)")
    parser.add_argument("--batch", type=int, default=2, help="prompts per step (the quickstart's 2)")
    parser.add_argument("--steps", type=int, default=2, help="steps per run (the quickstart's 2)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4],
                        help="algorithm.filter_groups.max_inflight_gen_batches values")
    parser.add_argument("--max-gen-batches", type=int, nargs="+", default=[0],
                        help="the study's --max-gen-batches values, training at the limit (0: no limit)")
    parser.add_argument("--limit", type=float, default=4.0, help="groups generated per trained group to count above")
    parser.add_argument("--trials", type=int, default=20000)
    args = parser.parse_args()
    shares = args.p
    if args.metrics:
        signal, generated, ratios = signal_counts(args.metrics)
        estimate = signal / generated
        print(f"{len(args.metrics)} runs, {len(ratios)} steps: {signal} of {generated} groups carried signal "
              f"(p = {estimate:.3f}); generated per trained group by step: "
              f"{', '.join(f'{r:.1f}' for r in ratios)}; above {args.limit:g}: {sum(r > args.limit for r in ratios)}")
        shares = shares or [round(estimate - 0.1, 3), round(estimate, 3), round(estimate + 0.1, 3)]
    if not shares:
        parser.error("give metrics files or --p")
    if not all(0 <= p <= 1 for p in shares) or (0 in shares and 0 in args.max_gen_batches):
        parser.error(f"--p {shares}: a share of groups with signal in [0, 1]; at 0 without a limit no step ends")
    print(f"\n| p | in flight (batches) | generation batches at most | groups per trained group, mean | "
          f"a step above {args.limit:g} | a run of {args.steps} steps with one | most in {args.trials} steps | "
          "steps training a group without signal |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in shares:
        for in_flight in args.in_flight:
            for max_gen_batches in args.max_gen_batches:
                rng = random.Random(0)
                steps = [simulate_step(p, in_flight, args.batch, rng, max_gen_batches) for _ in range(args.trials)]
                ratios = [generated / args.batch for generated, _ in steps]
                above = sum(r > args.limit for r in ratios) / len(ratios)
                unsignalled = sum(without > 0 for _, without in steps) / len(steps)
                print(f"| {p:.3f} | {in_flight} | {max_gen_batches or 'no limit'} | {sum(ratios) / len(ratios):.2f} | "
                      f"{above:.3f} | {1 - (1 - above) ** args.steps:.3f} | {max(ratios):.1f} | {unsignalled:.3f} |")

if __name__ == "__main__":
    main()
