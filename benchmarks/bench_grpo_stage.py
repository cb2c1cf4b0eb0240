"""The quickstart's GRPO stage, timed per step, with variants of its overrides, run one after the other.

Each variant trains GRPO from the cold start of a finished quickstart run (`RUN/cold_start/hf`, its index and
train split), with the quickstart's default flags (`verl_search.quickstart.grpo.grpo_overrides`: 2 questions x 8
rollouts, the EM reward, group filtering) plus the variant's overrides, into `--out/NAME`. Printed per step:
generation seconds, groups generated, generation seconds per group, the update's milliseconds per token (verl's
`timing_per_token_ms/update_actor`), `old_log_prob` seconds, step seconds; then the variant's wall seconds. The
groups drawn differ between variants (sampling), so compare seconds per group and per token, not step seconds.

    python benchmarks/bench_grpo_stage.py runs/quickstart --steps 1 \\
        --variant default= \\
        --variant one-in-flight=algorithm.filter_groups.max_inflight_gen_batches=1 \\
        --variant recompute=actor_rollout_ref.model.enable_gradient_checkpointing=true

(`--variant NAME=OVERRIDE[,OVERRIDE...]`; `NAME=` adds nothing.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def main() -> None:
    from verl_search.quickstart.grpo import grpo_overrides, run_grpo, shipped_recipe
    from verl_search.quickstart.options import StudyOptions, protocol_options

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a quickstart --out folder whose cold start is done")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--variant", action="append", required=True, help="NAME=OVERRIDE[,OVERRIDE...]")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_grpo_stage"))
    args = parser.parse_args()
    options = StudyOptions()
    protocol = protocol_options(options, args.run / "index", engine="vllm")
    for variant in args.variant:
        name, _, extra = variant.partition("=")
        out = args.out / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        overrides = grpo_overrides(protocol, model=args.run / "cold_start" / "hf",
                                   train_file=args.run / "data" / "train.parquet",
                                   val_file=args.run / "data" / "test.parquet", out=out, steps=args.steps,
                                   prompts_per_step=options.prompts_per_step, group_size=options.group_size,
                                   lr=options.grpo_lr, kl=False, reward=options.reward,
                                   max_gen_batches=options.max_gen_batches)
        overrides += [o for o in extra.split(",") if o]
        started = time.perf_counter()
        run_grpo(shipped_recipe(), args.run / "index", overrides, out, args.steps)
        wall = time.perf_counter() - started
        for line in (out / "metrics.jsonl").read_text().splitlines():
            entry = json.loads(line)
            data = entry["data"]
            groups = data.get("search/groups/generated", float("nan"))
            print(f"{name} step {entry['step']}: gen {data['timing_s/gen']:.0f} s, {groups:.0f} groups, "
                  f"{data['timing_s/gen'] / groups:.1f} s per group; update "
                  f"{data['timing_per_token_ms/update_actor']:.1f} ms per token; old_log_prob "
                  f"{data['timing_s/old_log_prob']:.0f} s; step {data['timing_s/step']:.0f} s", flush=True)
        print(f"{name}: {wall:.0f} s wall", flush=True)
        shutil.rmtree(out / "ckpt", ignore_errors=True)


if __name__ == "__main__":
    main()
