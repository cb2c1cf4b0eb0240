"""Print the tables of README.md from the kept evaluations: every 8-step GRPO model made with learning_run's
settings from the same cold start (learning_run's own, learning_run_steps' model after 8 steps, and the repeats
kept here), each against the cold start and against learning_run's control, on all 320 test questions and on the
101 whose gold the cold start's observations show; then the setting's gain over its runs, two ways:

- per question, the runs' mean F1 against the cold start's (paired bootstrap over questions as the study's report,
  `verl_search.report.compare.paired_bootstrap`, 10,000 resamples, seed 0): what an average run of the setting
  gains, with the questions' sampling in the interval but not the runs';
- per run, its mean F1 difference, and a Student t interval over the runs (n - 1 degrees of freedom): the runs'
  spread in the interval.

    python results/learning_run_repeats/summarize.py
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

from verl_search.report.baselines import question_shape
from verl_search.report.compare import paired_bootstrap
from verl_search.report.observations import gold_visible

HERE = Path(__file__).parent
_STEPS = importlib.util.spec_from_file_location("learning_run_steps_summarize",
                                                HERE.parent / "learning_run_steps" / "summarize.py")
steps_summary = importlib.util.module_from_spec(_STEPS)
_STEPS.loader.exec_module(steps_summary)
records, cell = steps_summary.records, steps_summary.cell  # one reader and one table cell for both folders' tables
FIRST = HERE.parent / "learning_run"
MODELS = {"learning_run": FIRST / "eval" / "grpo",
          "learning_run_steps, step 8": HERE.parent / "learning_run_steps" / "step8" / "eval" / "grpo",
          **{f"repeat {n}": folder / "eval" / "grpo" for n, folder in
             ((int(p.name.removeprefix("rep")), p) for p in sorted(HERE.glob("rep[0-9]*")))}}
ROLLOUTS = {"learning_run": FIRST / "grpo" / "rollouts",
            "learning_run_steps, step 8": HERE.parent / "learning_run_steps" / "step12" / "grpo" / "rollouts",
            **{name: folder.parent.parent / "grpo" / "rollouts" for name, folder in MODELS.items()
               if name.startswith("repeat")}}
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Student t's 0.975 quantile by degrees of freedom."""


def interval(c: dict) -> str:
    return f"{c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"


def over_runs(cold: dict, runs: list[dict], ids: list[str], key: str = "f1") -> tuple[str, str]:
    """(the runs' mean per question against the cold start, bootstrap over questions; the runs' mean
    differences with a t interval over runs, and their range)."""
    mean = [sum(run[i][key] for run in runs) / len(runs) for i in ids]
    pooled = interval(paired_bootstrap([cold[i][key] for i in ids], mean))
    gains = [sum(run[i][key] - cold[i][key] for i in ids) / len(ids) for run in runs]
    centre, half = statistics.mean(gains), T_975[len(gains) - 1] * statistics.stdev(gains) / len(gains) ** 0.5
    return pooled, (f"{centre:+.3f} [{centre - half:+.3f}, {centre + half:+.3f}] "
                    f"(runs {min(gains):+.3f} to {max(gains):+.3f})")


def trained_prompts(folder: Path, steps: int = 8) -> set[str]:
    """The prompts of the groups GRPO trained on at steps 1..`steps` (verl's rollout dump, `STEP.jsonl`)."""
    prompts = set()
    for step in range(1, steps + 1):
        with open(folder / f"{step}.jsonl", encoding="utf-8") as f:
            prompts |= {json.loads(line)["input"] for line in f if line.strip()}
    return prompts


def main() -> None:
    cold, control = records(FIRST / "eval" / "cold_start"), records(FIRST / "eval" / "grpo_control")
    ids = sorted(cold)
    seen = [i for i in ids if gold_visible(cold[i])]
    two = [i for i in ids if question_shape(cold[i]["question"]) == "two_option"]
    runs = {name: records(folder) for name, folder in MODELS.items()}
    print(f"{len(runs)} GRPO models; {len(ids)} test questions, {len(seen)} seen by the cold start, "
          f"{len(two)} two-option\n")
    print(f"| GRPO model | cold start -> GRPO F1, all {len(ids)} | the {len(seen)} seen | "
          f"the {len(two)} two-option | control -> GRPO F1, all | the {len(seen)} seen |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, run in runs.items():
        print(f"| {name} | {cell(cold, run, ids)} | {cell(cold, run, seen)} | {cell(cold, run, two)} | "
              f"{cell(control, run, ids)} | {cell(control, run, seen)} |")
    print(f"\n| over the {len(runs)} runs | against | questions | per question, the runs' mean (bootstrap) | "
          "per run (t over runs) |")
    print("| --- | --- | --- | --- | --- |")
    for against, base in (("cold start", cold), ("control", control)):
        for label, chosen in ((f"all {len(ids)}", ids), (f"the {len(seen)} seen", seen),
                              (f"the {len(two)} two-option", two)):
            for key in ("f1", "em"):
                pooled, per_run = over_runs(base, list(runs.values()), chosen, key)
                print(f"| {key.upper()} | {against} | {label} | {pooled} | {per_run} |")
    trained = {name: trained_prompts(folder) for name, folder in ROLLOUTS.items()}
    first = trained["learning_run"]
    print("\nquestions trained in 8 steps, and how many of them learning_run also trained: "
          + "; ".join(f"{name} {len(t)} ({len(t & first)})" for name, t in trained.items()))
    changed = {name: sum(run[i]["prediction"] != cold[i]["prediction"] for i in ids) for name, run in runs.items()}
    print("\ntest questions whose prediction differs from the cold start's: "
          + "; ".join(f"{name} {count}" for name, count in changed.items()))


if __name__ == "__main__":
    main()
