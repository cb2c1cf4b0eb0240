"""Print the tables of README.md from the kept evaluations: learning_run's GRPO (8 steps) and this run's GRPO
after 4, 8 and 12 steps, each against the cold start (learning_run's; this run's cold start gave the same
prediction on every test question, checked here) and against learning_run's control, on all 320 test questions
and on the 101 whose gold the cold start's observations show; paired bootstrap as the study's report
(`verl_search.report.compare.paired_bootstrap`, 10,000 resamples, seed 0).

    python results/learning_run_steps/summarize.py
"""

from __future__ import annotations

from pathlib import Path

from verl_search.report.baselines import option_shares, question_shape
from verl_search.report.compare import paired_bootstrap
from verl_search.report.observations import gold_visible
from verl_search.report.records import read_trajectories

HERE = Path(__file__).parent
FIRST = HERE.parent / "learning_run"
MODELS = {"learning_run, 8 steps": FIRST / "eval" / "grpo",
          **{f"this run, {n} steps": HERE / f"step{n}" / "eval" / "grpo" for n in (4, 8, 12)}}


def records(folder: Path) -> dict[str, dict]:
    """Question id -> evaluation record of `folder`'s `trajectories.jsonl` (`report.records.read_trajectories`).

    Raises:
        FileNotFoundError: the folder holds no `trajectories.jsonl`.
    """
    path = folder / "trajectories.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the kept evaluations are read from this folder's checkout")
    return read_trajectories(path)


def cell(before: dict, after: dict, ids: list[str], key: str = "f1") -> str:
    c = paired_bootstrap([before[i][key] for i in ids], [after[i][key] for i in ids])
    return f"{c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] ({c['better']} / {c['worse']})"


def two_option(run: dict, ids: list[str]) -> str:
    """EM on the two-option questions and the share of their answers naming neither option
    (`verl_search.report.baselines.option_shares`)."""
    chosen = [run[i] for i in ids if question_shape(run[i]["question"]) == "two_option"]
    em = sum(r["em"] for r in chosen) / len(chosen)
    return f"{em:.3f} | {option_shares(chosen)['neither']:.2f}"


def main() -> None:
    cold, control = records(FIRST / "eval" / "cold_start"), records(FIRST / "eval" / "grpo_control")
    again = records(HERE / "step12" / "eval" / "cold_start")
    same = sum(again[i]["prediction"] == cold[i]["prediction"] for i in cold)
    print(f"this run's cold start: the same prediction as learning_run's on {same} of {len(cold)} test questions\n")
    ids = sorted(cold)
    seen = [i for i in ids if gold_visible(cold[i])]
    print(f"| GRPO model | cold start -> GRPO F1, all {len(ids)} | cold start -> GRPO F1, the {len(seen)} seen | "
          "control -> GRPO F1, all | two-option EM | two-option answers naming neither |")
    print("| --- | --- | --- | --- | ---: | ---: |")
    print(f"| cold start | | | | {two_option(cold, ids)} |")
    runs = {name: records(folder) for name, folder in MODELS.items()}
    for name, run in runs.items():
        print(f"| {name} | {cell(cold, run, ids)} | {cell(cold, run, seen)} | {cell(control, run, ids)} | "
              f"{two_option(run, ids)} |")
    first, replicate = runs["learning_run, 8 steps"], runs["this run, 8 steps"]
    print(f"\nlearning_run's GRPO -> this run's GRPO after 8 steps: F1 all {cell(first, replicate, ids)}; "
          f"the {len(seen)} seen {cell(first, replicate, seen)}; EM all {cell(first, replicate, ids, 'em')}")
    changed = {name: sum(run[i]["prediction"] != cold[i]["prediction"] for i in ids) for name, run in runs.items()}
    print("test questions whose prediction differs from the cold start's: "
          + "; ".join(f"{name} {count}" for name, count in changed.items()))


if __name__ == "__main__":
    main()
