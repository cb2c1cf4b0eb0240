"""The quickstart's GRPO stage, timed per step, with variants of its overrides, run one after the other.

Each variant trains GRPO from the cold start of a finished quickstart run (`RUN/cold_start/hf`, its index and
train split), with the quickstart's default flags (`verl_search.quickstart.grpo.grpo_overrides`: 2 questions x 8
rollouts, the EM reward, group filtering) plus the variant's overrides, into `--out/NAME`. Printed per step:
generation seconds, groups generated (`sync` only), generation seconds per group, the update's milliseconds per
token (verl's `timing_per_token_ms/update_actor`), `old_log_prob` seconds, step seconds, trained tokens (verl's
`perf/total_num_tokens`: prompt + response tokens of the step's batch) per step second, the mean response length,
and, where verl logs them (the async modes), the mean spans and staleness of the trained trajectories in weight versions
(`training/off_policy/*`); then the variant's wall seconds, its steps per hour over the wall time (start-up
included) and over the steps alone, and its trained tokens per second over the steps alone. The groups drawn differ
between variants (sampling), so compare seconds per group and per token, not step seconds.

    python benchmarks/bench_grpo_stage.py runs/quickstart --steps 1 \\
        --variant default= \\
        --variant four-in-flight=algorithm.filter_groups.max_inflight_gen_batches=4 \\
        --variant recompute=actor_rollout_ref.model.enable_gradient_checkpointing=true

verl's trainer modes on one recipe, without group filtering (every step trains its `prompts-per-step` first
finished groups; docs/training.md, "Asynchronous training"):

    python benchmarks/bench_grpo_stage.py runs/quickstart --steps 3 --no-filter \\
        --recipe examples/grpo_qwen2.5-3b-base_search_r1_async/config.yaml \\
        --variant sync=trainer.v1.trainer_mode=sync --variant colocate_async=

The observation window's cost (docs/benchmarks/observation-window.md): an item whose key is a study option (a
`StudyOptions` field such as `max_obs_tokens`, no dot in its key) sets that option, as `verl-search study` would,
instead of adding a verl override (the agent loop's limits and the response length follow from it):

    python benchmarks/bench_grpo_stage.py runs/quickstart --steps 2 --no-filter \\
        --variant obs160=max_obs_tokens=160 --variant obs320=max_obs_tokens=320 \\
        --variant obs480=max_obs_tokens=480 --variant obs640=max_obs_tokens=640

(`--variant NAME=OVERRIDE[,OVERRIDE...]`; `NAME=` adds nothing.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path


def main() -> None:
    from verl_search.cpu.precision import resolve_dtype
    from verl_search.quickstart.grpo import grpo_overrides, run_grpo, shipped_recipe
    from verl_search.quickstart.options import StudyOptions, protocol_options

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a quickstart --out folder whose cold start is done")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--variant", action="append", required=True, help="NAME=OVERRIDE[,OVERRIDE...]")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_grpo_stage"))
    parser.add_argument("--recipe", type=Path, default=None, help="a recipe YAML (default: the shipped GRPO one)")
    parser.add_argument("--no-filter", action="store_true", help="group filtering off (the quickstart has it on)")
    args = parser.parse_args()
    option_fields = {f.name for f in dataclasses.fields(StudyOptions)}
    for variant in args.variant:
        name, _, extra = variant.partition("=")
        items = [o for o in extra.split(",") if o]
        settings = {k: int(v) if v.lstrip("-").isdigit() else v
                    for k, _, v in (o.partition("=") for o in items if o.partition("=")[0] in option_fields)}
        options = StudyOptions(**settings)
        protocol = protocol_options(options, args.run / "index", engine="vllm")
        out = args.out / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        overrides = grpo_overrides(protocol, model=args.run / "cold_start" / "hf",
                                   train_file=args.run / "data" / "train.parquet",
                                   val_file=args.run / "data" / "test.parquet", out=out, steps=args.steps,
                                   prompts_per_step=options.prompts_per_step, group_size=options.group_size,
                                   lr=options.grpo_lr, kl=False, reward=options.reward,
                                   max_gen_batches=None if args.no_filter else options.max_gen_batches,
                                   dtype=resolve_dtype(options.dtype))
        overrides += [o for o in items if o.partition("=")[0] not in option_fields]
        started = time.perf_counter()
        run_grpo(args.recipe or shipped_recipe(), args.run / "index", overrides, out, args.steps)
        wall = time.perf_counter() - started
        step_seconds = tokens = 0.0
        for line in (out / "metrics.jsonl").read_text().splitlines():
            entry = json.loads(line)
            print(f"{name} step {entry['step']}: {_step_line(entry['data'])}", flush=True)
            step_seconds += entry["data"]["timing_s/step"]
            tokens += entry["data"].get("perf/total_num_tokens", float("nan"))
        print(f"{name}: {wall:.0f} s wall; {3600 * args.steps / wall:.1f} steps per hour of wall time, "
              f"{3600 * args.steps / step_seconds:.1f} per hour of steps; {tokens / step_seconds:.1f} trained "
              "tokens per step second", flush=True)
        shutil.rmtree(out / "ckpt", ignore_errors=True)


def _step_line(data: dict) -> str:
    """One step's numbers (module docstring) from verl's metrics of that step."""
    nan = float("nan")
    groups = data.get("search/groups/generated", nan)
    line = (f"gen {data['timing_s/gen']:.0f} s, {groups:.0f} groups, {data['timing_s/gen'] / groups:.1f} s per group; "
            f"update {data['timing_per_token_ms/update_actor']:.1f} ms per token; old_log_prob "
            f"{data.get('timing_s/old_log_prob', nan):.0f} s; step {data['timing_s/step']:.0f} s; "
            f"{data.get('perf/total_num_tokens', nan) / data['timing_s/step']:.1f} trained tokens per s; response "
            f"{data.get('response_length/mean', nan):.0f} tokens (mean)")
    if "training/off_policy/trajectory_spans/mean" in data:
        line += (f"; spans {data['training/off_policy/trajectory_spans/mean']:.2f} (max "
                 f"{data['training/off_policy/trajectory_spans/max']:.0f}), staleness "
                 f"{data['training/off_policy/trajectory_staleness/mean']:.2f}, worst "
                 f"{data['training/off_policy/trajectory_staleness_worst/mean']:.2f} (max "
                 f"{data['training/off_policy/trajectory_staleness_worst/max']:.0f})")
    return line


if __name__ == "__main__":
    main()
