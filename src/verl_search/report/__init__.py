"""The reporting layer: what `verl-search eval`, the quickstart and `verl-search study` write and print, built from
the records the stages hand over (evaluation records, GRPO rollouts and logged steps, stage timings). Knows no verl
and runs no model.

* `records`: the `trajectories.jsonl` records read by id, the ids of sampled records;
* `evaluation`: one evaluation's summary (EM / F1 / cover-EM with intervals per data source, by question, pass@k),
  `report.json`, `report.md`, `report.png`;
* `compare`: paired bootstrap and sign test of two evaluations of the same questions;
* `baselines`: baselines that know nothing (answer position, most frequent answer, top passage title) and the
  "gold visible" ceiling, by question shape;
* `observations`: what a model saw (gold visible or not) and how it searched, the conditional metrics;
* `pass_at_k`: pass@k by the unbiased estimator;
* `grpo_signal`: the learning signal of each GRPO step (answer against format-only variance, groups generated per
  trained group), the measure GRPO's reward pays and the group filter's metric;
* `probes`: the frontier probe set, split into questions GRPO trained on and the others;
* `quickstart`: the quickstart's and a study's `report.md` / `report.json` / `curves.png`, and `rerender_report`
  (`python -m verl_search.report.quickstart RUN_FOLDER`).
"""
