"""Several runs of one study setting, judged together: `verl-search repeats RUN...`.

One GRPO run is one draw of its sampled rollouts; two runs of the same command from the same cold start can
differ by as much as the gain one of them reports (docs/learning-run.md). This module reads several study
folders (`verl-search study --out RUN`, each holding `eval/grpo/` and, with `--control`, `eval/grpo_control/`;
`--start-from` makes more from one cold start) and compares the GRPO runs with the cold start and with the
permuted-reward controls two ways, on all test questions, on those whose gold the cold start's own
observations show (`seen`), and on two-option questions:

- **per question**: the runs' mean score on each question against the cold start's (or the controls' mean),
  paired bootstrap over questions (`compare.paired_bootstrap`): what an average run of the setting gains, the
  questions' sampling in the interval but not the runs';
- **over runs**: each run's mean difference from the cold start, with a Student t interval over the runs
  (n - 1 degrees of freedom); against the controls, the GRPO runs' mean gain less the controls', with Welch's
  t interval: the spread between runs in the interval;
- **runs per arm**: at the per-run gains' pooled standard deviation, the GRPO runs and as many controls a
  two-sided two-sample t test at 0.05 needs to find the measured difference with 80% power (noncentral t;
  both the spread and the difference are estimates from the runs given).

Scores are the evaluation records' `em` and `f1` (`eval/NAME/trajectories.jsonl`, `report.records`).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from verl_search.report.baselines import question_shape
from verl_search.report.compare import paired_bootstrap
from verl_search.report.observations import gold_visible
from verl_search.report.records import read_trajectories

logger = logging.getLogger(__name__)

KEYS = ("f1", "em")


@dataclass
class Repeats:
    """The evaluations of several runs of one setting: `cold` (the cold start's records by question id),
    `runs` and `controls` (run folder name -> its GRPO / control model's records), and `ids` (the questions
    every evaluation holds, sorted)."""

    cold: dict[str, dict]
    runs: dict[str, dict[str, dict]] = field(default_factory=dict)
    controls: dict[str, dict[str, dict]] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)

    def subsets(self) -> dict[str, list[str]]:
        """`all`, `seen` (gold visible in the cold start's observations, `observations.gold_visible`) and
        `two_option` (`baselines.question_shape`) question ids."""
        return {"all": self.ids, "seen": [i for i in self.ids if gold_visible(self.cold[i])],
                "two_option": [i for i in self.ids if question_shape(self.cold[i]["question"]) == "two_option"]}


def load_repeats(folders: list[Path]) -> Repeats:
    """Read the study folders `folders`: each one's `eval/grpo` is a GRPO run and `eval/grpo_control` a control
    (either may be missing); `eval/cold_start` is the cold start, which every folder that holds one must share
    (the same prediction on every question; its records from the first such folder).

    Raises:
        FileNotFoundError: a folder does not exist, or none holds `eval/cold_start/trajectories.jsonl`.
        ValueError: two folders' cold starts differ (the runs did not start from one cold start: make repeats with
            `verl-search study --start-from`), a folder holds neither a GRPO run nor a control, or no question
            is in every evaluation.
    """
    cold, cold_from, runs, controls = None, None, {}, {}
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such study folder (pass the --out folders of verl-search study)")
        name = folder.name if folder.name not in runs and folder.name not in controls else str(folder)
        start = read_trajectories(folder / "eval" / "cold_start" / "trajectories.jsonl")
        if start and cold is None:
            cold, cold_from = start, folder
        elif start:
            differ = sorted(i for i in start.keys() & cold.keys() if start[i]["prediction"] != cold[i]["prediction"])
            if differ:
                raise ValueError(f"{folder}'s cold start differs from {cold_from}'s on {len(differ)} questions "
                                 f"(e.g. {differ[0]!r}): repeats compare runs of one cold start; make them with "
                                 f"verl-search study --start-from {cold_from}")
        grpo = read_trajectories(folder / "eval" / "grpo" / "trajectories.jsonl")
        control = read_trajectories(folder / "eval" / "grpo_control" / "trajectories.jsonl")
        if not grpo and not control:
            raise ValueError(f"{folder} holds no eval/grpo/ or eval/grpo_control/ evaluation: pass finished study "
                             f"folders")
        if grpo:
            runs[name] = grpo
        if control:
            controls[name] = control
    if cold is None:
        raise FileNotFoundError("none of the folders holds eval/cold_start/trajectories.jsonl: pass at least one "
                                "finished study folder with a cold start (--sft-examples)")
    ids = set(cold)
    for records in (*runs.values(), *controls.values()):
        ids &= records.keys()
    if not ids:
        raise ValueError("no question is in every evaluation: were the runs evaluated on the same test questions?")
    if len(ids) < len(cold):
        logger.warning("%d of the cold start's %d questions are missing from some evaluation (an unfinished one?): "
                       "every comparison is on the %d in all", len(cold) - len(ids), len(cold), len(ids))
    return Repeats(cold, runs, controls, sorted(ids))


def gains(base: dict, runs: list[dict], ids: list[str], key: str) -> list[float]:
    """Each run's mean `key` difference from `base` on `ids` (one value per run)."""
    return [sum(run[i][key] - base[i][key] for i in ids) / len(ids) for run in runs]


def per_question(runs: list[dict], ids: list[str], key: str) -> list[float]:
    """The runs' mean `key` on each question of `ids` (one value per question)."""
    return [sum(run[i][key] for run in runs) / len(runs) for i in ids]


def t_interval(values: list[float]) -> dict:
    """`{"n", "mean", "ci95", "range"}`: the mean of `values` with a Student t interval (n - 1 degrees of
    freedom; `ci95` is None for fewer than two values or no spread)."""
    from scipy import stats

    ci = None
    if len(values) > 1 and statistics.pstdev(values) > 0:
        ci = [float(x) for x in stats.ttest_1samp(values, 0.0).confidence_interval(0.95)]
    return {"n": len(values), "mean": statistics.mean(values), "ci95": ci, "range": [min(values), max(values)]}


def welch_interval(a: list[float], b: list[float]) -> dict:
    """`{"mean_diff", "ci95", "df"}`: mean(a) - mean(b) with Welch's t interval (None where either side has
    fewer than two values or neither spreads)."""
    from scipy import stats

    out = {"mean_diff": statistics.mean(a) - statistics.mean(b), "ci95": None, "df": None}
    if len(a) > 1 and len(b) > 1 and statistics.pstdev(a) + statistics.pstdev(b) > 0:
        welch = stats.ttest_ind(a, b, equal_var=False)
        out["ci95"] = [float(x) for x in welch.confidence_interval(0.95)]
        out["df"] = float(welch.df)
    return out


def runs_per_arm(a: list[float], b: list[float], power: float = 0.8, alpha: float = 0.05,
                 most: int = 1000) -> tuple[float, int | None]:
    """(the pooled standard deviation of the per-run gains `a` and `b`; the fewest runs per arm n at which a
    two-sided two-sample t test at `alpha` has `power` for a difference of mean(a) - mean(b): df 2n - 2,
    noncentrality d * sqrt(n / 2), d the difference over the pooled SD; None above `most` runs or without spread).

    Raises:
        ValueError: fewer than three runs in all (no pooled standard deviation).
    """
    from scipy import stats

    if len(a) + len(b) < 3 or not a or not b:
        raise ValueError(f"runs_per_arm needs runs on both sides and three in all, got {len(a)} and {len(b)}")
    pooled = (((len(a) - 1) * (statistics.variance(a) if len(a) > 1 else 0.0)
               + (len(b) - 1) * (statistics.variance(b) if len(b) > 1 else 0.0)) / (len(a) + len(b) - 2)) ** 0.5
    if pooled == 0:
        return 0.0, None
    effect = abs(statistics.mean(a) - statistics.mean(b)) / pooled
    for n in range(2, most + 1):
        df, shift = 2 * n - 2, effect * (n / 2) ** 0.5
        critical = stats.t.ppf(1 - alpha / 2, df)
        if stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift) >= power:
            return pooled, n
    return pooled, None


def summarize(repeats: Repeats, samples: int = 10000, seed: int = 0) -> dict:
    """The comparisons of the module docstring, per subset (`Repeats.subsets`) and score (`KEYS`):

    `{"runs": [names], "controls": [names], "subsets": {subset: size}, "comparisons": {subset: {key: {
    "per_run": {name: paired_bootstrap of cold start -> run}, "own_control": {name: control -> run, for a
    folder holding both}, "controls": {name: cold start -> control}, "runs_vs_cold_start": {"per_question":
    paired_bootstrap, "over_runs": t_interval}, "runs_vs_controls": {"per_question", "over_runs":
    welch_interval, "runs_per_arm", "pooled_sd"}}}}}` (the last two only with runs and controls).
    """
    cold, runs, controls = repeats.cold, list(repeats.runs.values()), list(repeats.controls.values())
    subsets = repeats.subsets()
    out = {"runs": list(repeats.runs), "controls": list(repeats.controls),
           "subsets": {name: len(ids) for name, ids in subsets.items()}, "comparisons": {}}
    for subset, ids in subsets.items():
        if not ids:
            continue
        by_key = out["comparisons"][subset] = {}
        for key in KEYS:
            def column(records: dict) -> list[float]:
                return [records[i][key] for i in ids]

            def pair(before: list[float], after: list[float]) -> dict:
                return paired_bootstrap(before, after, samples, seed)

            base = column(cold)
            entry = by_key[key] = {
                "per_run": {name: pair(base, column(run)) for name, run in repeats.runs.items()},
                "own_control": {name: pair(column(repeats.controls[name]), column(run))
                                for name, run in repeats.runs.items() if name in repeats.controls},
                "controls": {name: pair(base, column(control)) for name, control in repeats.controls.items()}}
            if not runs:
                continue
            run_means, run_gains = per_question(runs, ids, key), gains(cold, runs, ids, key)
            entry["runs_vs_cold_start"] = {"per_question": pair(base, run_means),
                                           "over_runs": t_interval(run_gains)}
            if controls:
                control_gains = gains(cold, controls, ids, key)
                entry["runs_vs_controls"] = {"per_question": pair(per_question(controls, ids, key), run_means),
                                             "over_runs": welch_interval(run_gains, control_gains)}
                if len(run_gains) + len(control_gains) >= 3:
                    entry["runs_vs_controls"]["pooled_sd"], entry["runs_vs_controls"]["runs_per_arm"] = \
                        runs_per_arm(run_gains, control_gains)
    return out


def _ci(c: dict | None, mean: str = "mean_diff") -> str:
    if c is None:
        return "—"
    ci = c.get("ci95")
    return f"{c[mean]:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


SUBSET_LABELS = {"all": "all {n} test questions", "seen": "the {n} whose gold the cold start saw",
                 "two_option": "the {n} two-option"}


def render(summary: dict) -> str:
    """`summarize`'s result as Markdown: per subset, each run against the cold start and its own control, each
    control against the cold start, then the runs pooled (F1 and EM), and the runs per arm for F1."""
    lines = [f"# {len(summary['runs'])} GRPO runs, {len(summary['controls'])} permuted-reward controls", "",
             "Per question: paired bootstrap over questions; over runs: Student's t interval"
             + (" (Welch's against the controls)." if summary["controls"] else "."), ""]
    for subset, by_key in summary["comparisons"].items():
        lines += [f"## {SUBSET_LABELS[subset].format(n=summary['subsets'][subset])}", "",
                  "| run | cold start -> GRPO F1 | its own control -> GRPO F1 | cold start -> control F1 |",
                  "| --- | --- | --- | --- |"]
        f1 = by_key["f1"]
        for name in dict.fromkeys([*summary["runs"], *summary["controls"]]):
            lines.append(f"| {name} | {_ci(f1['per_run'].get(name))} | {_ci(f1['own_control'].get(name))} | "
                         f"{_ci(f1['controls'].get(name))} |")
        lines += ["", "| score | against | per question, the runs' mean | over runs |", "| --- | --- | --- | --- |"]
        for key, entry in by_key.items():
            if "runs_vs_cold_start" in entry:
                c = entry["runs_vs_cold_start"]
                lines.append(f"| {key.upper()} | cold start | {_ci(c['per_question'])} | {_ci(c['over_runs'], 'mean')} "
                             f"(runs {c['over_runs']['range'][0]:+.3f} to {c['over_runs']['range'][1]:+.3f}) |")
            if "runs_vs_controls" in entry:
                c = entry["runs_vs_controls"]
                lines.append(f"| {key.upper()} | the controls | {_ci(c['per_question'])} | {_ci(c['over_runs'])} |")
        c = by_key["f1"].get("runs_vs_controls", {})
        if "pooled_sd" in c:
            n = c["runs_per_arm"]
            lines += ["", f"F1: per-run SD {c['pooled_sd']:.3f}; at this spread and difference a t test over runs "
                          + (f"needs {n} runs per arm for 80% power." if n else "needs more than 1,000 runs per arm "
                             "for 80% power (or the runs do not spread).")]
        lines.append("")
    return "\n".join(lines)
