"""The four baselines of `verl-search eval` (`--protocol direct | cot | rag | ircot`) and, optionally, pass@k of a
trained model, on the quickstart's held-out questions with the quickstart's protocol settings, all on one start of
verl's vLLM rollout (`verl_search.eval.harness.run_evals`); then one table with the quickstart's own evaluations
(EM and F1 with 95% bootstrap intervals; the paired differences: `benchmarks/compare_evals.py`). Prints markdown.

    python benchmarks/eval_baselines.py RUN [--model smollm2] [--samples-model RUN/grpo/hf --samples 8]
                                            [--no-baselines] [--out DIR]

RUN is a finished `verl-search quickstart` folder: its `index/`, its protocol settings (`report.json`'s options)
and its `eval/{untrained,cold_start,grpo}` evaluations. The baselines evaluate `--model` (default: the run's own
`--model`, the untrained one) on `mini-wiki:test` sampled as the quickstart samples its test split (the same 102
questions at the defaults); `--samples-model` is evaluated `--samples` times per question at temperature 1 for
pass@1/4/8 (`verl_search.report.pass_at_k`). Everything is written under `--out` (default `RUN/baselines`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

BASELINES = ("direct", "cot", "rag", "ircot")
MODELS = ("untrained", "cold_start", "grpo")


def evaluations(run: Path, out: Path, model: str | None, samples_model: str | None, samples: int,
                baselines: bool = True) -> list:
    """`(name, EvalOptions)` of the baselines (unless `baselines` is false) and the sampled model, with `run`'s
    protocol settings."""
    from verl_search.quickstart.options import StudyOptions, protocol_options

    recorded = json.loads((run / "report.json").read_text())["meta"]["options"]
    options = StudyOptions(**{k: v for k, v in recorded.items() if k in StudyOptions.__dataclass_fields__})
    base = protocol_options(options, run / "index", "auto")
    per_source = math.ceil(options.test_questions / 3)
    common = dict(data=["mini-wiki:test"], max_per_source=per_source, seed=options.seed)
    out_list = [(name, dataclasses.replace(base, protocol=name, model=model or options.model, out=str(out / name),
                                           **common)) for name in BASELINES if baselines]
    if samples_model:
        out_list.append((f"samples_{samples}", dataclasses.replace(
            base, model=samples_model, out=str(out / f"samples_{samples}"), samples=samples, temperature=1.0,
            **common)))
    return out_list


def row(name: str, report: dict) -> str:
    """A markdown row: n, EM and F1 (mean [95% interval]) of an evaluation's `report.json`."""
    summary = report["summary"]["all"] if "summary" in report else report["all"]
    cells = [f"{summary[m]['mean']:.3f} [{summary[m]['ci95'][0]:.3f}, {summary[m]['ci95'][1]:.3f}]" for m in ("em", "f1")]
    return f"| {name} | {summary['n']} | {cells[0]} | {cells[1]} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished verl-search quickstart folder")
    parser.add_argument("--model", help="the model the baselines run (default: the run's --model)")
    parser.add_argument("--samples-model", help="a model to sample --samples times per question (pass@k)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                        help="run the four baselines (--no-baselines: only the --samples-model run)")
    parser.add_argument("--out", type=Path, help="default: RUN/baselines")
    args = parser.parse_args()
    from verl_search.eval.harness import run_evals

    out = args.out or args.run / "baselines"
    names, options = zip(*evaluations(args.run, out, args.model, args.samples_model, args.samples,
                                                args.baselines))
    summaries = run_evals(list(options))
    lines = ["| evaluation | n | EM [95% CI] | F1 [95% CI] |", "| --- | ---: | --- | --- |"]
    lines += [row(f"baseline: {name}", s) for name, s in zip(names, summaries) if name in BASELINES]
    for model in MODELS:
        report = args.run / "eval" / model / "report.json"
        if report.is_file():
            lines.append(row(f"model: {model}", json.loads(report.read_text())))
    print("\n".join(lines))
    for name, option, summary in zip(names, options, summaries):
        report = json.loads((Path(option.out) / "report.json").read_text())
        if "pass_at_k" in report:
            print(f"\n{name} ({option.model}): pass@k {json.dumps(report['pass_at_k'])}")
        print(f"{name}: seconds {summary.get('seconds')}")


if __name__ == "__main__":
    main()
