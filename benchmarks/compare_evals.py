"""Paired comparison of `verl-search eval` runs on the same questions: EM and F1 differences with 95% bootstrap
intervals and sign tests, overall and per question shape, and the by-shape table beside the baselines that know
nothing (`verl_search.report.baselines`). Prints markdown.

    python benchmarks/compare_evals.py BEFORE_FOLDER AFTER_FOLDER [AFTER_FOLDER ...] [--train data/train.parquet]
        [--seen-by FOLDER]

Each folder holds an evaluation's `trajectories.jsonl` (or `trajectories.jsonl.gz`); the first is the baseline
every other is compared with, on the questions all of them share. An evaluation with several samples per question
(`verl-search eval --samples`, such as the quickstart's frontier and probe folders) is compared per question, on the
mean of its samples (`verl_search.report.evaluation.by_question`), and without the by-shape table. `--seen-by
FOLDER` keeps the questions whose gold answer is visible in that evaluation's own observations
(`verl_search.report.observations.gold_visible`; the learning run's subset is its cold start's).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from verl_search.report.baselines import by_shape, question_shape, shape_table
from verl_search.report.evaluation import by_question
from verl_search.report.records import SAMPLE_MARK, question_id
from verl_search.report.compare import paired_bootstrap
from verl_search.report.quickstart import training_answer


def records(folder: Path) -> dict[str, dict]:
    """Question id -> record; for a sampled evaluation, question id -> `{"question", "samples", "em", "f1",
    "score"}` (means over its samples)."""
    plain, packed = folder / "trajectories.jsonl", folder / "trajectories.jsonl.gz"
    lines = plain.read_text().splitlines() if plain.is_file() else gzip.open(packed, "rt").read().splitlines()
    rows = {r["id"]: r for r in map(json.loads, lines)}
    if not any(SAMPLE_MARK in i for i in rows):
        return rows
    questions = {question_id(i): r["question"] for i, r in rows.items()}
    means = by_question(list(rows.values()))["questions"]
    return {q: {**means[q], "question": questions[q]} for q in means}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--train", type=Path, help="training parquet: adds the most-frequent-answer baseline")
    parser.add_argument("--seen-by", type=Path, help="an evaluation folder: only the questions whose gold its "
                        "observations show")
    args = parser.parse_args()
    labels = [folder.name for folder in args.folders]
    if len(set(labels)) < len(labels):  # runs/a/eval/frontier, runs/b/eval/frontier: the whole paths
        labels = [str(folder) for folder in args.folders]
    runs = {label: records(folder) for label, folder in zip(labels, args.folders)}
    names = list(runs)
    ids = sorted(set.intersection(*(set(r) for r in runs.values())))
    if args.seen_by:
        from verl_search.report.observations import gold_visible

        common = set(ids)
        ids = [i for i, r in records(args.seen_by).items() if i in common and gold_visible(r)]
        print(f"{len(ids)} questions in common whose gold {args.seen_by}'s observations show\n")
    else:
        print(f"{len(ids)} questions in common\n")
    print("| comparison | questions | n | difference [95% CI] | better / worse | sign test p |")
    print("| --- | --- | ---: | --- | --- | ---: |")
    shapes = {"all": ids, **{s: [i for i in ids if question_shape(runs[names[0]][i]["question"]) == s]
                             for s in ("two_option", "open")}}
    for after in names[1:]:
        for shape, chosen in shapes.items():
            for key in ("em", "f1") if chosen else ():
                c = paired_bootstrap([runs[names[0]][i][key] for i in chosen], [runs[after][i][key] for i in chosen])
                print(f"| {names[0]} -> {after}: {key} | {shape} | {c['n']} | {c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, "
                      f"{c['ci95'][1]:+.3f}] | {c['better']} / {c['worse']} | {c['sign_p']:.3f} |")
    if any("samples" in run[ids[0]] for run in runs.values()):
        return  # sampled: no single answer per question to put beside the baselines
    frequent = training_answer(args.train) if args.train else None
    print()
    print(shape_table(by_shape({name: [runs[name][i] for i in ids] for name in names}, frequent)))


if __name__ == "__main__":
    main()
