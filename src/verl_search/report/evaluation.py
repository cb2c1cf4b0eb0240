"""Aggregate evaluated trajectories into `report.json`, `report.md` and `report.png`.

Per data source (and `all`): EM, F1 and cover-EM with 95% confidence intervals, mean searches per
question, the share of questions that searched and that answered, failed searches, and mean
generated tokens. EM and cover-EM are 0/1 per question: Wilson score interval. F1 is continuous:
normal interval `mean +- 1.96 * sd / sqrt(n)`, clipped to [0, 1].
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

Z95 = 1.959964


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a proportion; `(0, 1)` when `n == 0`.

    >>> [round(x, 4) for x in wilson_interval(5, 10)]
    [0.2366, 0.7634]
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def mean_interval(values: list[float], z: float = Z95) -> tuple[float, float]:
    """Normal 95% interval of a mean, clipped to [0, 1]; `(0, 1)` with fewer than 2 values."""
    n = len(values)
    if n < 2:
        return 0.0, 1.0
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return max(0.0, mean - z * sd / math.sqrt(n)), min(1.0, mean + z * sd / math.sqrt(n))


def summarize(records: list[dict]) -> dict[str, dict]:
    """Metrics per `data_source` and for `all` from trajectory records (see `harness`)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[record["data_source"]].append(record)
        groups["all"].append(record)
    summary = {}
    for source, rows in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        n = len(rows)
        entry = {"n": n}
        for key in ("em", "cover_em"):
            hits = sum(r[key] for r in rows)
            low, high = wilson_interval(hits, n)
            entry[key] = {"mean": hits / n, "ci95": [low, high]}
        f1 = [r["f1"] for r in rows]
        entry["f1"] = {"mean": sum(f1) / n, "ci95": list(mean_interval(f1))}
        entry["mean_searches"] = sum(r["num_searches"] for r in rows) / n
        entry["searched"] = sum(r["num_searches"] > 0 for r in rows) / n
        entry["answered"] = sum(bool(r["answered"]) for r in rows) / n
        entry["failed_searches"] = sum(r["failed_searches"] for r in rows)
        entry["mean_generated_tokens"] = sum(r["generated_tokens"] for r in rows) / n
        if any("judge" in r for r in rows):  # LLM-as-a-judge accuracy over the judged records; failures apart
            judged = [r["judge"] == "correct" for r in rows if r.get("judge") is not None]
            entry["judge"] = {"mean": sum(judged) / len(judged) if judged else 0.0,
                              "ci95": list(wilson_interval(sum(judged), len(judged))), "n": len(judged),
                              "failures": sum(r.get("judge") is None for r in rows)}
        summary[source] = entry
    return summary


def to_markdown(summary: dict[str, dict], title: str, judge: dict | None = None) -> str:
    """The summary as a markdown table; with `judge` (`{"model", ...}`) a judge column and a note saying which
    column is which."""
    judged = judge is not None and all("judge" in e for e in summary.values())
    extra = " judge [95% CI] | judge failures |" if judged else ""
    lines = [f"# {title}", "", "| data source | n | EM [95% CI] | F1 [95% CI] | cover-EM [95% CI] |" + extra +
             " searches/q | searched | answered | failed searches | tokens/q |",
             "| --- | ---: | --- | --- | --- |" + (" --- | ---: |" if judged else "") + " ---: | ---: | ---: | ---: | ---: |"]
    for source, e in summary.items():
        keys = ("em", "f1", "cover_em", "judge") if judged else ("em", "f1", "cover_em")
        cells = [f"{e[k]['mean']:.3f} [{e[k]['ci95'][0]:.3f}, {e[k]['ci95'][1]:.3f}]"
                 if k != "judge" or e[k]["n"] else "none judged" for k in keys]
        if judged:
            cells.append(str(e["judge"]["failures"]))
        lines.append(f"| {source} | {e['n']} | {' | '.join(cells)} | {e['mean_searches']:.2f} | {e['searched']:.2f} | "
                     f"{e['answered']:.2f} | {e['failed_searches']} | {e['mean_generated_tokens']:.0f} |")
    if judged:
        lines += ["", f"EM, F1 and cover-EM compare the prediction with the gold answers by rule (SQuAD normalisation). "
                      f"**judge** is LLM-as-a-judge accuracy: `{judge['model']}` asked whether the prediction answers the "
                      "question (ReSearch's prompt, `verl_search.eval.judge`), over the judged predictions; "
                      "**judge failures** (no verdict after retries) are left out, not scored as wrong. "
                      "Papers that report \"accuracy\" from a judge are comparable to the judge column, not to EM."]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, dict], path: Path, title: str) -> None:
    """Bar chart of EM, F1 and cover-EM per data source, with 95% CI error bars, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = list(summary)
    metrics = ("em", "f1", "cover_em")
    width = 0.8 / len(metrics)
    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(sources)), 4))
    for i, metric in enumerate(metrics):
        means = [summary[s][metric]["mean"] for s in sources]
        errors = [[m - summary[s][metric]["ci95"][0] for s, m in zip(sources, means)],
                  [summary[s][metric]["ci95"][1] - m for s, m in zip(sources, means)]]
        positions = [x + (i - 1) * width for x in range(len(sources))]
        axis.bar(positions, means, width, yerr=errors, capsize=3, label=metric)
    axis.set_xticks(range(len(sources)), [f"{s}\n(n={summary[s]['n']})" for s in sources])
    axis.set_ylim(0, 1)
    axis.set_ylabel("score")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def by_question(records: list[dict]) -> dict:
    """Each question's sampled success over its records (`rows.repeat_rows`: ids `QUESTION#k`).

    Returns:
        `{"questions": {question id: {"samples", "em", "f1", "score"}}` (means over its samples), `"never"`,
        `"sometimes"`, `"always"`: questions whose samples matched exactly in none, some or all of them
        (`"sometimes"`: the questions at the policy's frontier, the ones whose GRPO groups carry signal)}.
    """
    from verl_search.report.records import question_id

    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[question_id(record["id"])].append(record)
    questions = {qid: {"samples": len(rows), **{key: sum(r[key] for r in rows) / len(rows)
                                                for key in ("em", "f1", "score")}}
                 for qid, rows in sorted(groups.items())}
    return {"questions": questions, "never": sum(q["em"] == 0 for q in questions.values()),
            "sometimes": sum(0 < q["em"] < 1 for q in questions.values()),
            "always": sum(q["em"] == 1 for q in questions.values())}


def write_report(records: list[dict], out_dir: Path, title: str, meta: dict) -> dict:
    """Write `report.json` (summary, `by_shape`, `by_question` and `pass_at_k` with several samples per question,
    `meta`), `report.md` and `report.png`; return the summary.

    `by_shape`: the model's EM / F1 by question shape beside the first- and last-named-option baselines
    (`verl_search.report.baselines`), also a section of `report.md`; `by_question`: see `by_question`; `pass_at_k`:
    pass@1, 4, 8 (where k <= samples) per data source with bootstrap intervals (`report.pass_at_k`), also in `report.md`."""
    from verl_search.report.baselines import by_shape, shape_table
    from verl_search.report.pass_at_k import pass_at_k_markdown, summarize_pass_at_k
    from verl_search.report.records import SAMPLE_MARK

    summary = summarize(records)
    shapes = by_shape({"model": records})
    report = {"meta": meta, "summary": summary, "by_shape": shapes}
    text = (to_markdown(summary, title, meta.get("judge")) + "\n## By question shape, beside baselines that know nothing\n\n"
            + shape_table(shapes))
    if any(SAMPLE_MARK in record["id"] for record in records):
        report["by_question"] = questions = by_question(records)
        text += (f"\n## Sampled success per question\n\n{len(questions['questions'])} questions, "
                 f"{len(records)} samples: exact match in none of a question's samples for {questions['never']}, "
                 f"in some for {questions['sometimes']} (the policy's frontier), in all for {questions['always']} "
                 "(`report.json` `by_question`).\n")
        report["pass_at_k"] = passes = summarize_pass_at_k(records)
        text += "\n" + pass_at_k_markdown(passes)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    (out_dir / "report.md").write_text(text, encoding="utf-8")
    plot(summary, out_dir / "report.png", title)
    return summary
