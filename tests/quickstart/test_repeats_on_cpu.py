"""`verl-search repeats`: several study runs of one setting against their cold start and their controls.

Synthetic study folders (evaluation records with chosen scores) check the arithmetic and the refusals; the kept
learning runs (results/learning_run*, real evaluations) check that the command recomputes the figures
docs/learning-run.md quotes from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_search.cli import main
from verl_search.report.repeats import load_repeats, runs_per_arm, summarize

RESULTS = Path(__file__).resolve().parents[2] / "results"
SEEN = "<information>Doc 1(Title: \"A\") the answer is gold</information>"


def record(qid: str, f1: float, prediction: str = "p", seen: bool = False) -> dict:
    return {"id": qid, "question": "Who?", "golden_answers": ["gold"], "prediction": prediction, "f1": f1, "em": f1,
            "turns": [{"observation": SEEN if seen else "<information>nothing</information>"}]}


def write(folder: Path, name: str, scores: list[float], **kwargs) -> None:
    path = folder / "eval" / name / "trajectories.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record(f"q{i}", s, seen=i < 2, **kwargs)) + "\n" for i, s in enumerate(scores)))


def test_runs_are_compared_with_the_cold_start_their_own_control_and_the_controls_pooled(tmp_path):
    cold = [0.0, 0.0, 0.0, 0.0]
    write(tmp_path / "a", "cold_start", cold)
    write(tmp_path / "a", "grpo", [1.0, 1.0, 0.0, 0.0])            # +0.5 on all, +1 on the 2 seen
    write(tmp_path / "a", "grpo_control", [0.0, 0.0, 1.0, 0.0])    # +0.25
    write(tmp_path / "b", "grpo", [1.0, 0.0, 0.0, 0.0])            # +0.25
    write(tmp_path / "c", "grpo_control", [0.0, 0.0, 0.0, 0.0])    # 0
    summary = summarize(load_repeats([tmp_path / "a", tmp_path / "b", tmp_path / "c"]), samples=200)
    assert summary["runs"] == ["a", "b"] and summary["controls"] == ["a", "c"]
    assert summary["subsets"] == {"all": 4, "seen": 2, "two_option": 0}
    f1 = summary["comparisons"]["all"]["f1"]
    assert f1["per_run"]["a"]["mean_diff"] == 0.5 and f1["per_run"]["b"]["mean_diff"] == 0.25
    assert list(f1["own_control"]) == ["a"] and f1["own_control"]["a"]["mean_diff"] == 0.25
    assert f1["runs_vs_cold_start"]["over_runs"]["mean"] == pytest.approx(0.375)
    assert f1["runs_vs_controls"]["over_runs"]["mean_diff"] == pytest.approx(0.375 - 0.125)
    assert f1["runs_vs_controls"]["per_question"]["mean_diff"] == pytest.approx(0.25)
    assert summary["comparisons"]["seen"]["f1"]["per_run"]["a"]["mean_diff"] == 1.0


def test_questions_missing_from_an_evaluation_are_named_not_silently_dropped(tmp_path, caplog):
    write(tmp_path / "a", "cold_start", [0.0, 0.0, 0.0])
    write(tmp_path / "a", "grpo", [1.0, 0.0])  # unfinished: 2 of 3 questions
    repeats = load_repeats([tmp_path / "a"])
    assert repeats.ids == ["q0", "q1"]
    assert "1 of the cold start's 3 questions are missing" in caplog.text


def test_runs_per_arm_is_the_two_sample_t_tests():
    # one pooled SD apart: 17 per arm for 80% power at 0.05 (Cohen's tables; pwr.t.test gives 16.7)
    half = 0.5 ** 0.5
    sd, n = runs_per_arm([1 - half, 1 + half], [-half, half])
    assert sd == pytest.approx(1.0) and n == 17
    assert runs_per_arm([0.0, 0.0], [0.0, 0.0]) == (0.0, None)
    with pytest.raises(ValueError, match="both sides"):
        runs_per_arm([1.0, 2.0], [])


def test_runs_from_different_cold_starts_are_refused(tmp_path):
    write(tmp_path / "a", "cold_start", [0.0, 1.0], prediction="x")
    write(tmp_path / "a", "grpo", [0.0, 1.0])
    write(tmp_path / "b", "cold_start", [0.0, 1.0], prediction="y")
    write(tmp_path / "b", "grpo", [0.0, 1.0])
    with pytest.raises(ValueError, match="differs from .* on 2 questions.*--start-from"):
        load_repeats([tmp_path / "a", tmp_path / "b"])
    assert main(["repeats", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    with pytest.raises(FileNotFoundError, match="no such study folder"):
        load_repeats([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no eval/grpo/"):
        load_repeats([tmp_path / "a", tmp_path / "empty"])


def test_the_kept_learning_runs_give_the_documented_figures(tmp_path, capsys):
    repeats = RESULTS / "learning_run_repeats"
    folders = [RESULTS / "learning_run", RESULTS / "learning_run_steps" / "step8",
               *(repeats / f"rep{n}" for n in (1, 2, 3)), *(repeats / f"rep{n}_control" for n in (2, 1, 3))]
    assert main(["repeats", *map(str, folders), "--json", str(tmp_path / "r.json"), "--bootstrap-samples", "200"]) == 0
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["subsets"]["seen"] == 101 and len(summary["runs"]) == 5 and len(summary["controls"]) == 4
    seen = summary["comparisons"]["seen"]["f1"]
    # docs/learning-run.md: +0.032 [-0.043, +0.107] over runs (Welch), about 36 runs per arm; +0.055 over the cold start
    assert round(seen["runs_vs_controls"]["over_runs"]["mean_diff"], 3) == 0.032
    assert [round(x, 3) for x in seen["runs_vs_controls"]["over_runs"]["ci95"]] == [-0.043, 0.107]
    assert seen["runs_vs_controls"]["runs_per_arm"] == 36
    assert round(seen["runs_vs_cold_start"]["over_runs"]["mean"], 3) == 0.055
    assert round(seen["own_control"]["learning_run"]["mean_diff"], 3) == 0.088
    assert "36 runs per arm" in capsys.readouterr().out
