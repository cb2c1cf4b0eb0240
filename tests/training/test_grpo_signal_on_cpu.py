"""The report's "Why GRPO moved / did not move" section (`verl_search.report.grpo_signal`): the
groups, zero-advantage groups, responses and loss tokens with a non-zero advantage per GRPO step,
on hand-written rows and on a default run's kept files (`tests/assets/runs/quickstart_run/`: the files of the
quickstart run kept before the current `results/quickstart_run/` that the report reads: verl's metrics file and
rollout dump of a real run, the evaluations' records), and the report re-rendered from those files without
training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import SHARED
from verl_search.report.grpo_signal import (
    explain,
    group_id,
    model_text,
    read_rollouts,
    rollout_signal,
    section,
    signal_table,
    step_signals,
)
from verl_search.training.progress import logged_steps
from verl_search.report.quickstart import rerender_report

#: the default run's kept files, unpacked from tests/assets/runs/quickstart_run/ (tests/assets/README.md)
RUN = SHARED / "runs" / "quickstart_run"
OBS = "<information>Doc 1(Title: x) many words of a passage</information>"


def response(group: str, session: int, score: float, answer: str = "a") -> dict:
    return {"input": f"question {group}", "uid": f"{group}_{session}_0", "score": score,
            "output": f"<search> q </search>\n\n{OBS}\n\n<answer> {answer} </answer>"}


def words(text: str) -> int:
    return len(text.split())


def copy_of_the_run(folder: Path) -> Path:
    """A copy of the kept run in `folder`, with the `data/train.parquet` its report reads (the most frequent
    training answer) written again by the quickstart's data stage: every mini-wiki:train question, the file the
    run wrote (the kept files leave out parquet copies)."""
    from verl_search.quickstart.data import write_split

    shutil.copytree(RUN, folder)
    write_split(folder / "data" / "train.parquet", folder / "data" / "test.parquet", 102, 0)
    return folder


def test_group_is_the_uid_before_verls_session_suffix_or_the_prompt():
    assert group_id({"uid": "5da25db8-4720-463c_3_0", "input": "q"}) == "5da25db8-4720-463c"
    assert group_id({"uid": "plain-uid", "input": "q"}) == "plain-uid"  # the legacy trainer's uid: itself
    assert group_id({"input": "the prompt"}) == "the prompt"


def test_observations_are_not_loss_text():
    assert model_text(f"<search> q </search>{OBS}<answer> a </answer>") == "<search> q </search><answer> a </answer>"


def test_only_groups_whose_rewards_differ_carry_an_advantage():
    rows = ([response("g1", i, 1.0 if i == 0 else 0.2, answer=str(i)) for i in range(4)]  # one right of four
            + [response("g2", i, 0.2) for i in range(4)]  # all wrong, all well formed: zero variance
            + [response("g3", i, r) for i, r in enumerate([0.0, 0.2, 0.4])])  # the middle one sits at the mean
    s = rollout_signal(rows, words)
    assert (s["responses"], s["groups"], s["group_size"]) == (11, 3, [3, 4])
    assert s["zero_variance_groups"] == 1 and s["responses_with_advantage"] == 4 + 2
    per_response = words(model_text(rows[0]["output"]))
    assert per_response == 6 and s["loss_tokens"] == 11 * per_response and s["tokens_with_advantage"] == 6 * per_response
    # population variances: g1 0.12, g2 0, g3 0.0267
    assert s["within_group_variance"] == pytest.approx((0.12 + 0 + 0.08 / 3) / 3)
    assert s["distinct_answers"] == pytest.approx((4 + 1 + 1) / 3)
    assert rollout_signal(rows)["tokens_with_advantage"] is None


def test_bad_rows_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="none"):
        rollout_signal([])
    with pytest.raises(ValueError, match="no 'score'"):
        rollout_signal([{"input": "q", "output": ""}])


def test_the_exported_runs_rollouts_agree_with_its_logged_advantages():
    steps, rollouts = logged_steps(RUN / "grpo" / "metrics.jsonl"), read_rollouts(RUN / "grpo" / "rollouts")
    assert rollouts, "the kept run holds every GRPO step's rollouts"
    for step, rows in rollouts.items():
        s = rollout_signal(rows)
        logged = steps[step]
        all_zero = logged["critic/advantages/min"] == 0 == logged["critic/advantages/max"]
        assert (s["zero_variance_groups"] == s["groups"]) == all_zero
        assert s["reward_mean"] == pytest.approx(logged["critic/score/mean"], abs=1e-6)
        assert sum(r["score"] >= 1.0 for r in rows) / len(rows) == pytest.approx(logged["search/em/mean"])


def test_the_section_names_the_verdict_the_zero_variance_groups_and_the_missing_kl():
    rows = [response("g1", i, 0.2) for i in range(4)]
    steps = {1: {"critic/score/mean": 0.25, "critic/advantages/min": -0.5, "critic/advantages/max": 1.5,
                 "actor/entropy": 0.17, "actor/ppo_kl": 0.0, "actor/lr": 2e-5, "actor/grad_norm": 0.3,
                 "search/em/mean": 0.0625},
             2: {"critic/score/mean": 0.2, "critic/advantages/min": 0.0, "critic/advantages/max": 0.0,
                 "actor/entropy": 0.13, "actor/ppo_kl": 0.0, "actor/lr": 2e-5, "actor/grad_norm": 0.001,
                 "search/em/mean": 0.0}}
    signals = step_signals(steps, {2: rows}, words)
    assert signals[0]["rollouts"] is None and signals[1]["rollouts"]["zero_variance_groups"] == 1
    flat = {"n": 102, "mean_diff": 0.0, "ci95": [0.0, 0.0], "better": 0, "worse": 0}
    text = section(signals, flat)
    assert text.startswith("## Why GRPO did not move") and "1 of 1 groups had all rewards equal" in text
    assert "Step 2: every advantage 0" in text and "No KL loss was logged" in text and "0.170 -> 0.130" in text
    assert "probability 0.12" in text  # 1 - (1 - 0.03125)^4
    assert section(signals, dict(flat, mean_diff=0.1, ci95=[0.05, 0.15])).startswith("## Why GRPO moved")
    steps[2]["actor/kl_loss"] = 0.002
    assert any("KL loss to the reference" in line for line in explain(step_signals(steps, {}), None))
    table = signal_table(signals).splitlines()
    assert len(table) == 4 and "| 2 | 4 / 1 | 0.200 ± 0.000 |" in table[3] and "0 of 24" in table[3]


def test_the_exported_run_rerenders_with_the_section_and_the_same_numbers(tmp_path):
    out = copy_of_the_run(tmp_path / "run")
    old = (out / "report.md").read_text()
    report = rerender_report(out, words)
    text = (out / "report.md").read_text()
    assert text.startswith(old.split("## By question shape")[0])  # the models and comparisons are unchanged
    assert old[old.index("## Stage timings"):old.index("## Why GRPO")] in text  # so are the timings and curves
    # the kept default run filtered out the groups without signal: none of the trained ones had equal rewards
    assert "## Why GRPO did not move" in text and "0 of 4 groups had all rewards equal" in text
    assert "37 groups had all rewards equal and were replaced by fresh questions, of 41 generated" in text
    assert [s["step"] for s in report["grpo_signal"]] == [1, 2]
    assert json.loads((out / "report.json").read_text())["grpo_signal"][1]["rollouts"]["responses_with_advantage"] == 16
    with pytest.raises(FileNotFoundError, match="report.json"):
        rerender_report(tmp_path / "nothing")


def test_the_quickstarts_own_report_stage_writes_the_section(tmp_path):
    from verl_search.quickstart.options import StudyOptions
    from verl_search.quickstart.pipeline import Quickstart

    out = copy_of_the_run(tmp_path / "run")
    timings = json.loads((RUN / "report.json").read_text())["stages"]
    report = Quickstart(StudyOptions(out=str(out), engine="transformers", bootstrap_samples=200)).report(timings)
    assert report["grpo_signal"][1]["rollouts"]["zero_variance_groups"] == 0
    assert "## Why GRPO did not move" in (out / "report.md").read_text()
