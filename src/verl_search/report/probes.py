"""The report's probe section: the frontier probe set's sampled reward before and after GRPO (and its control),
paired over the questions, and the same split into the questions GRPO trained on and the others.

A gain on the probe set is a gain on training questions. GRPO trains on some of them (the questions of its
steps' kept groups: the prompts of its rollout dumps, `grpo/rollouts/STEP.jsonl`); the others it never saw. A
gain that sits on the trained questions is memorisation until the untrained ones move too, so the report shows
both, each paired over its own questions (`verl_search.quickstart.frontier`).
"""

from __future__ import annotations

from pathlib import Path

from verl_search.report.compare import paired_bootstrap

#: the control run's name (`verl-search study --control`): GRPO on scores shuffled within each step; its
#: folder, evaluation and probe are named after it, and the report compares it with GRPO's start model
CONTROL = "grpo_control"


def probe_comparison(before: list[dict], after: list[dict], samples: int, seed: int) -> dict:
    """The probe set's sampled reward, EM and F1 per question, before vs after GRPO, paired over the questions
    (`paired_bootstrap` of the per-question means, `verl_search.report.evaluation.by_question`;
    `verl_search.quickstart.frontier`).

    Raises:
        ValueError: the two evaluations share no question.
    """
    from verl_search.report.evaluation import by_question

    a, b = by_question(before)["questions"], by_question(after)["questions"]
    ids = sorted(a.keys() & b.keys())
    if not ids:
        raise ValueError("the probe evaluations share no question")
    result = {}
    for key in ("score", "em", "f1"):
        result[key] = paired_bootstrap([a[i][key] for i in ids], [b[i][key] for i in ids], samples, seed)
        result[key].update(before=sum(a[i][key] for i in ids) / len(ids), after=sum(b[i][key] for i in ids) / len(ids))
    return result


def probe_table(comparison: dict) -> str:
    """Markdown: the probe set's sampled reward, EM and F1 before and after GRPO, with the paired difference."""
    lines = ["| per question, mean over its samples | before GRPO | after GRPO | difference [95% bootstrap CI] | "
             "better / worse | sign test p |", "| --- | ---: | ---: | --- | --- | ---: |"]
    for key, label in (("score", "eval score"), ("em", "EM"), ("f1", "F1")):
        c = comparison[key]
        lines.append(f"| {label} | {c['before']:.3f} | {c['after']:.3f} | {c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, "
                     f"{c['ci95'][1]:+.3f}] | {c['better']} / {c['worse']} | {c['sign_p']:.3f} |")
    return "\n".join(lines) + "\n"


def trained_prompts(rollouts: dict[int, list[dict]]) -> set[str]:
    """The prompts GRPO trained on: the `input` of every dumped response (verl dumps the trained batch, after
    group filtering)."""
    return {str(row["input"]) for rows in rollouts.values() for row in rows if "input" in row}


def trained_split(before: list[dict], after: list[dict], prompts: set[str], samples: int, seed: int) -> dict:
    """`probe_comparison` over the probe questions GRPO trained on (the question text, stripped, occurs in a
    trained prompt, `trained_prompts`) and over the others.

    Returns `{"trained": comparison or None, "untrained": comparison or None}` (None: no such question).
    """
    from verl_search.report.records import question_id

    text = {question_id(r["id"]): (r.get("question") or "").strip() for r in before}
    trained = {qid for qid, question in text.items() if question and any(question in p for p in prompts)}
    split = {}
    for part, keep in (("trained", lambda qid: qid in trained), ("untrained", lambda qid: qid not in trained)):
        a = [r for r in before if keep(question_id(r["id"]))]
        b = [r for r in after if keep(question_id(r["id"]))]
        try:
            split[part] = probe_comparison(a, b, samples, seed)
        except ValueError:  # no question of this part in both evaluations
            split[part] = None
    return split


def split_table(splits: dict[str, dict]) -> str:
    """Markdown: per run (`splits`: run name -> `trained_split`) and part, the probe questions' count and EM and
    F1 before -> after GRPO with the paired difference."""
    lines = ["| run | probe questions | n | EM before -> after | EM difference [95% CI] | F1 before -> after | "
             "F1 difference [95% CI] |", "| --- | --- | ---: | --- | --- | --- | --- |"]
    for run, split in splits.items():
        for part, label in (("trained", "trained by GRPO"), ("untrained", "not trained")):
            c = split.get(part)
            if not c:
                lines.append(f"| {run} | {label} | 0 | - | - | - | - |")
                continue
            cells = [f"{c[k]['before']:.3f} -> {c[k]['after']:.3f} | {c[k]['mean_diff']:+.3f} [{c[k]['ci95'][0]:+.3f}, "
                     f"{c[k]['ci95'][1]:+.3f}]" for k in ("em", "f1")]
            lines.append(f"| {run} | {label} | {c['em']['n']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def load_probes(out: Path) -> dict[str, list[dict]]:
    """The probe evaluations' records of run folder `out` (`eval/probe_{cold_start,grpo,grpo_control}/
    trajectories.jsonl`; those not run are left out)."""
    from verl_search.report.records import read_trajectories

    paths = {name: Path(out) / "eval" / f"probe_{name}" / "trajectories.jsonl"
             for name in ("cold_start", "grpo", CONTROL)}
    return {name: list(read_trajectories(path).values()) for name, path in paths.items() if path.is_file()}
