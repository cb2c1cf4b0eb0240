"""Training questions at the policy's frontier, and the probe set that measures learning on them.

GRPO learns only from groups whose rewards differ. For a question the start model never answers (or always
answers), all of a group's responses score alike and the group carries no signal; group filtering then drops
it after paying for its generation. The frontier stage measures, before GRPO, the start model's sampled
success on `--frontier-questions` training questions (`--frontier-samples` rollouts each at the recipe's
rollout temperature, `verl-search eval --samples`), and GRPO trains on the questions answered in some but not
all samples (exactly, for the EM reward; at least partly, by token F1, for an F1 reward): a difficulty filter
(as in DAPO and ReSearch-style curricula), whose cost is that evaluation.

The same questions are the **probe set**: the start model and the GRPO model are each measured on them again
with fresh samples (`probe_cold_start`, `probe_grpo`), and the report compares their sampled reward per
question, paired. Fresh samples, not the frontier stage's own: questions picked because their first samples
were mixed regress toward their true rate when sampled again, and the paired comparison must not mistake that
for learning (or forgetting).

With `--balance-positions`, GRPO trains on the frontier rows with as many two-option questions ("..., X or Y?")
whose gold is the first-named option as whose gold is the last (`balance_gold_positions`, by
`report.baselines.gold_position`; the probe set stays every frontier question): where one position holds most
golds, "always name that position" is what the reward pays most often, and GRPO learns that habit instead of the
task (results/learning_run_control/README.md).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

FRONTIER_TEMPERATURE = 1.0
"""Sampling temperature of the frontier and probe evaluations: the shipped GRPO recipe's rollout temperature."""


def write_candidates(train_file: Path, out_file: Path, count: int, seed: int) -> int:
    """`count` rows of `train_file` (a random sample fixed by `seed`, in file order) written to `out_file`;
    returns how many (fewer when the file has fewer rows)."""
    import pandas as pd

    rows = pd.read_parquet(train_file)
    keep = sorted(random.Random(f"frontier:{seed}").sample(range(len(rows)), min(count, len(rows))))
    rows.iloc[keep].to_parquet(out_file, index=False)
    return len(keep)


def sampled_success(eval_folder: Path) -> dict:
    """The `by_question` part of an evaluation's `report.json` (`verl_search.report.evaluation.by_question`).

    Raises:
        FileNotFoundError: the folder has no report with `by_question` (not an evaluation with `--samples`).
    """
    report = Path(eval_folder) / "report.json"
    by_question = json.loads(report.read_text()).get("by_question") if report.is_file() else None
    if by_question is None:
        raise FileNotFoundError(f"{report} has no by_question: not an evaluation with --samples above 1")
    return by_question


FRONTIER_MEASURES = ("em", "f1")
"""What a frontier question is answered by in some but not all samples: `em` (exact match, the EM reward's
signal) or `f1` (token F1: the F1 reward also pays a partly right answer, so its groups carry signal on
questions never answered exactly)."""


def frontier_ids(by_question: dict, measure: str = "em") -> list[str]:
    """Ids of the questions whose `measure` (a `FRONTIER_MEASURES` key), averaged over their samples
    (`sampled_success`), lies strictly between 0 and 1: with `em`, answered exactly in some but not all samples;
    with `f1`, also those answered partly in some samples ("Los Angeles" for "Los Angeles County").

    Raises:
        ValueError: `measure` is not one of `FRONTIER_MEASURES`.
    """
    if measure not in FRONTIER_MEASURES:
        raise ValueError(f"measure={measure!r}: use one of {', '.join(FRONTIER_MEASURES)}")
    return [qid for qid, q in by_question["questions"].items() if 0 < q[measure] < 1]


def write_frontier(candidates_file: Path, eval_folder: Path, out_file: Path, minimum: int,
                   measure: str = "em") -> dict:
    """The candidate rows at the frontier (`frontier_ids(..., measure)` of the evaluation in `eval_folder`)
    written to `out_file`.

    Returns:
        `{"candidates", "never", "sometimes", "always", "measure", "frontier"}`: question counts of the frontier
        evaluation (never / sometimes / always by exact match), the measure and how many rows were written.

    Raises:
        ValueError: fewer than `minimum` (one GRPO step's questions) at the frontier (the message says what to
            change), or `measure` unknown.
        FileNotFoundError: as `sampled_success`.
    """
    import pandas as pd

    from verl_search.eval.rows import row_id

    by_question = sampled_success(eval_folder)
    wanted = set(frontier_ids(by_question, measure))
    rows = pd.read_parquet(candidates_file)
    keep = [i for i, row in enumerate(rows.to_dict("records")) if row_id(row) in wanted]
    summary = {"candidates": len(rows), **{k: by_question[k] for k in ("never", "sometimes", "always")},
               "measure": measure, "frontier": len(keep)}
    if len(keep) < minimum:
        raise ValueError(f"{len(keep)} of {len(rows)} training questions are at the start model's frontier ({summary}); "
                         f"a GRPO step needs {minimum}: raise --frontier-questions or --frontier-samples, or pass "
                         "--frontier-questions 0 to train on every question")
    rows.iloc[keep].to_parquet(out_file, index=False)
    return summary


def balance_gold_positions(frontier_file: Path, out_file: Path, seed: int, minimum: int) -> dict:
    """GRPO's training rows: the frontier's, with the two-option questions cut to as many whose gold is the
    first-named option as whose gold is the last (a random choice of the larger side's, fixed by `seed`; file
    order kept); every other row kept. Written to `out_file`.

    Returns:
        `{"rows", "first", "last", "dropped"}`: rows written, two-option rows of each position before the cut,
        rows dropped.

    Raises:
        ValueError: fewer than `minimum` rows (one GRPO step's questions) are left; the message says what to change.
    """
    import pandas as pd

    from verl_search.report.baselines import gold_position

    rows = pd.read_parquet(frontier_file)
    positions = [gold_position(row["extra_info"]["question"], list(row["reward_model"]["ground_truth"]["target"]))
                 for row in rows.to_dict("records")]
    sides = {side: [i for i, position in enumerate(positions) if position == side] for side in ("first", "last")}
    keep_each = min(len(sides["first"]), len(sides["last"]))
    larger = max(sides.values(), key=len)
    dropped = set(random.Random(f"balance:{seed}").sample(larger, len(larger) - keep_each))
    keep = [i for i in range(len(rows)) if i not in dropped]
    summary = {"rows": len(keep), "first": len(sides["first"]), "last": len(sides["last"]), "dropped": len(dropped)}
    if len(keep) < minimum:
        raise ValueError(f"{len(keep)} frontier questions are left after balancing the gold's position ({summary}); "
                         f"a GRPO step needs {minimum}: raise --frontier-questions, or leave out --balance-positions")
    rows.iloc[keep].to_parquet(out_file, index=False)
    return summary
