"""Print the tables of README.md from the kept evaluations: every 8-step GRPO model made with learning_run's
settings from the same cold start (learning_run's own, learning_run_steps' model after 8 steps, and the repeats
kept here), each against the cold start and against the control runs (learning_run's, and repeats 2, 1 and 3's own:
the same run with its scores shuffled), on all 320 test questions and on the 101 whose gold the cold start's
observations show; each control against the cold start; then the setting's gain over its runs, two ways:

- per question, the runs' mean F1 against the cold start's (paired bootstrap over questions as the study's report,
  `verl_search.report.compare.paired_bootstrap`, 10,000 resamples, seed 0): what an average run of the setting
  gains, with the questions' sampling in the interval but not the runs';
- per run, its mean F1 difference, and a Student t interval over the runs (n - 1 degrees of freedom): the runs'
  spread in the interval; against the controls, the GRPO runs' mean gain over the cold start less the controls'
  mean, with Welch's t interval (the spread of both kinds of run);
- runs per arm: at the per-run gains' pooled standard deviation, how many GRPO runs and as many controls a
  two-sided two-sample t test (0.05) needs to find the measured difference with 80% power (noncentral t,
  `runs_per_arm`); both the spread and the difference are estimates from these few runs.

    python results/learning_run_repeats/summarize.py
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import statistics
from pathlib import Path

from verl_search.report.baselines import question_shape
from verl_search.report.compare import paired_bootstrap
from verl_search.report.observations import gold_visible
from verl_search.report.repeats import gains, per_question, runs_per_arm, t_interval, welch_interval

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
             ((int(p.name.removeprefix("rep")), p) for p in sorted(HERE.glob("rep[0-9]*")) if p.name[3:].isdigit())}}
ROLLOUTS = {"learning_run": FIRST / "grpo" / "rollouts",
            "learning_run_steps, step 8": HERE.parent / "learning_run_steps" / "step12" / "grpo" / "rollouts",
            **{name: folder.parent.parent / "grpo" / "rollouts" for name, folder in MODELS.items()
               if name.startswith("repeat")}}
CONTROLS = {"learning_run's control": FIRST / "eval" / "grpo_control",
            "repeat 2's control": HERE / "rep2_control" / "eval" / "grpo_control",
            "repeat 1's control": HERE / "rep1_control" / "eval" / "grpo_control",
            "repeat 3's control": HERE / "rep3_control" / "eval" / "grpo_control"}
"""The permuted-reward control runs, numbered 1, 2, 3, 4 in the tables."""


def interval(c: dict) -> str:
    return f"{c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"


def over_runs(cold: dict, runs: list[dict], ids: list[str], key: str = "f1") -> tuple[str, str]:
    """(the runs' mean per question against the cold start, bootstrap over questions; the runs' mean
    differences with a t interval over runs, and their range)."""
    pooled = interval(paired_bootstrap([cold[i][key] for i in ids], per_question(runs, ids, key)))
    t = t_interval(gains(cold, runs, ids, key))
    return pooled, (f"{t['mean']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}] "
                    f"(runs {t['range'][0]:+.3f} to {t['range'][1]:+.3f})")


def over_controls(cold: dict, runs: list[dict], controls: list[dict], ids: list[str], key: str = "f1") -> tuple[str, str]:
    """(the GRPO runs' mean per question against the controls' mean, bootstrap over questions; the GRPO runs' mean
    gain over the cold start less the controls', Welch's t interval over both kinds of run)."""
    pooled = interval(paired_bootstrap(per_question(controls, ids, key), per_question(runs, ids, key)))
    w = welch_interval(gains(cold, runs, ids, key), gains(cold, controls, ids, key))
    return pooled, f"{w['mean_diff']:+.3f} [{w['ci95'][0]:+.3f}, {w['ci95'][1]:+.3f}] (df {w['df']:.1f})"


def trained_prompts(folder: Path, steps: int = 8) -> set[str]:
    """The prompts of the groups GRPO trained on at steps 1..`steps` (verl's rollout dump, `STEP.jsonl`)."""
    prompts = set()
    for step in range(1, steps + 1):
        with open(folder / f"{step}.jsonl", encoding="utf-8") as f:
            prompts |= {json.loads(line)["input"] for line in f if line.strip()}
    return prompts


def main() -> None:
    cold = records(FIRST / "eval" / "cold_start")
    controls = {name: records(folder) for name, folder in CONTROLS.items()}
    ids = sorted(cold)
    seen = [i for i in ids if gold_visible(cold[i])]
    two = [i for i in ids if question_shape(cold[i]["question"]) == "two_option"]
    runs = {name: records(folder) for name, folder in MODELS.items()}
    print(f"{len(runs)} GRPO models, {len(controls)} controls; {len(ids)} test questions, {len(seen)} seen by the "
          f"cold start, {len(two)} two-option\n")
    numbered = list(enumerate(controls.values(), 1))
    print(f"| GRPO model | cold start -> GRPO F1, all {len(ids)} | the {len(seen)} seen | the {len(two)} two-option | "
          + " | ".join(f"control {n} -> GRPO F1, all | the {len(seen)} seen" for n, _ in numbered) + " |")
    print("| --- " * (4 + 2 * len(numbered)) + "|")
    for name, run in runs.items():
        print(f"| {name} | {cell(cold, run, ids)} | {cell(cold, run, seen)} | {cell(cold, run, two)} | "
              + " | ".join(f"{cell(c, run, ids)} | {cell(c, run, seen)}" for _, c in numbered) + " |")
    print(f"\n| control | cold start -> control F1, all {len(ids)} | the {len(seen)} seen | EM, all | the "
          f"{len(seen)} seen |")
    print("| --- | --- | --- | --- | --- |")
    for n, (name, control) in enumerate(controls.items(), 1):
        print(f"| {n}: {name} | {cell(cold, control, ids)} | {cell(cold, control, seen)} | "
              f"{cell(cold, control, ids, 'em')} | {cell(cold, control, seen, 'em')} |")
    for (a, ca), (b, cb) in itertools.combinations(numbered, 2):
        print(f"| control {a} -> control {b} | {cell(ca, cb, ids)} | {cell(ca, cb, seen)} | "
              f"{cell(ca, cb, ids, 'em')} | {cell(ca, cb, seen, 'em')} |")
    print(f"\n| over the {len(runs)} runs | against | questions | per question, the runs' mean (bootstrap) | "
          "per run (t over runs) |")
    print("| --- | --- | --- | --- | --- |")
    for label, chosen in ((f"all {len(ids)}", ids), (f"the {len(seen)} seen", seen),
                          (f"the {len(two)} two-option", two)):
        for key in ("f1", "em"):
            pooled, per_run = over_runs(cold, list(runs.values()), chosen, key)
            print(f"| {key.upper()} | cold start | {label} | {pooled} | {per_run} |")
    for label, chosen in ((f"all {len(ids)}", ids), (f"the {len(seen)} seen", seen),
                          (f"the {len(two)} two-option", two)):
        for key in ("f1", "em"):
            pooled, per_run = over_controls(cold, list(runs.values()), list(controls.values()), chosen, key)
            print(f"| {key.upper()} | the {len(controls)} controls | {label} | {pooled} | {per_run} (Welch) |")
    print()
    for label, chosen in ((f"all {len(ids)}", ids), (f"the {len(seen)} seen", seen)):
        a, b = gains(cold, list(runs.values()), chosen, "f1"), gains(cold, list(controls.values()), chosen, "f1")
        spread, n = runs_per_arm(a, b)
        print(f"F1 on {label}: GRPO runs' gains minus the controls' {statistics.mean(a) - statistics.mean(b):+.3f}, "
              f"per-run SD {spread:.3f} (pooled over {len(a)} GRPO and {len(b)} control runs): "
              + (f"{n} runs per arm for 80% power" if n else "more than 1000 runs per arm for 80% power"))
    trained = {name: trained_prompts(folder) for name, folder in ROLLOUTS.items()}
    first = trained["learning_run"]
    print("\nquestions trained in 8 steps, and how many of them learning_run also trained: "
          + "; ".join(f"{name} {len(t)} ({len(t & first)})" for name, t in trained.items()))
    changed = {name: sum(run[i]["prediction"] != cold[i]["prediction"] for i in ids) for name, run in runs.items()}
    print("\ntest questions whose prediction differs from the cold start's: "
          + "; ".join(f"{name} {count}" for name, count in changed.items()))


if __name__ == "__main__":
    main()
