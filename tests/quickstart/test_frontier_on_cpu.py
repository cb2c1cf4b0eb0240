"""The quickstart's frontier: the training questions the start model answers sometimes become GRPO's questions and
the probe set (`verl_search.quickstart.frontier`), the stages that measure them, and the report's paired
comparison. The evaluation they read is `verl-search eval --samples` (its own test: tests/eval)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from verl_search.report.evaluation import by_question
from verl_search.report.grpo_signal import trained_measure
from verl_search.quickstart.frontier import (frontier_ids, sampled_success, write_candidates,
                                             write_frontier)
from verl_search.quickstart.options import StudyOptions
from verl_search.report.quickstart import probe_comparison


def rows(count: int) -> pd.DataFrame:
    return pd.DataFrame([{"data_source": "2wiki", "extra_info": {"id": str(i), "question": f"q{i}?"},
                          "reward_model": {"ground_truth": {"target": ["a"]}}} for i in range(count)])


def evaluation(folder, successes: dict[str, list[float]]):
    """An eval folder whose report holds `by_question` for these samples (question id -> F1 per sample; EM is
    whether it is 1)."""
    records = [{"id": f"2wiki/{qid}#{k}", "em": float(f1 == 1), "f1": float(f1), "score": float(f1 == 1)}
               for qid, f1s in successes.items() for k, f1 in enumerate(f1s)]
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({"by_question": by_question(records)}))


def test_the_frontier_is_the_questions_answered_in_some_samples(tmp_path):
    pd.DataFrame(rows(10)).to_parquet(tmp_path / "train.parquet")
    assert write_candidates(tmp_path / "train.parquet", tmp_path / "candidates.parquet", 6, seed=0) == 6
    candidates = pd.read_parquet(tmp_path / "candidates.parquet")
    ids = [row["id"] for row in candidates["extra_info"]]
    assert len(set(ids)) == 6 and ids == sorted(ids, key=int)  # a sample, kept in file order
    evaluation(tmp_path / "eval", {ids[0]: [0, 0, 0], ids[1]: [1, 0, 0], ids[2]: [1, 1, 1], ids[3]: [0, 1, 1],
                                   ids[4]: [0, 0, 0], ids[5]: [0, 0, 0]})
    assert sorted(frontier_ids(sampled_success(tmp_path / "eval"))) == sorted([f"2wiki/{ids[1]}", f"2wiki/{ids[3]}"])
    summary = write_frontier(tmp_path / "candidates.parquet", tmp_path / "eval", tmp_path / "frontier.parquet", 2)
    assert summary == {"candidates": 6, "never": 3, "sometimes": 2, "always": 1, "measure": "em", "frontier": 2}
    assert [row["id"] for row in pd.read_parquet(tmp_path / "frontier.parquet")["extra_info"]] == [ids[1], ids[3]]
    with pytest.raises(ValueError, match="2 of 6 training questions are at the start model's frontier.*needs 4"):
        write_frontier(tmp_path / "candidates.parquet", tmp_path / "eval", tmp_path / "f.parquet", 4)
    with pytest.raises(FileNotFoundError, match="--samples"):
        sampled_success(tmp_path / "nothing")


def test_an_f1_reward_puts_partly_answered_questions_at_the_frontier(tmp_path):
    pd.DataFrame(rows(5)).to_parquet(tmp_path / "candidates.parquet")
    # 0: never; 1: partly right in one sample (F1 0.5), never exactly; 2: exactly in one; 3: always; 4: always
    # partly right, never exactly (mean F1 0.5: at the F1 frontier though its group may score alike)
    evaluation(tmp_path / "eval", {"0": [0, 0, 0], "1": [0, 0.5, 0], "2": [1, 0, 0], "3": [1, 1, 1],
                                   "4": [0.5, 0.5, 0.5]})
    by_question = sampled_success(tmp_path / "eval")
    assert by_question["questions"]["2wiki/1"]["f1"] == pytest.approx(0.5 / 3)
    assert frontier_ids(by_question, "em") == ["2wiki/2"]
    assert frontier_ids(by_question, "f1") == ["2wiki/1", "2wiki/2", "2wiki/4"]
    summary = write_frontier(tmp_path / "candidates.parquet", tmp_path / "eval", tmp_path / "frontier.parquet", 2,
                             measure="f1")
    assert (summary["measure"], summary["frontier"], summary["sometimes"]) == ("f1", 3, 1)
    assert [row["id"] for row in pd.read_parquet(tmp_path / "frontier.parquet")["extra_info"]] == ["1", "2", "4"]
    with pytest.raises(ValueError, match="measure='cover_em': use one of em, f1"):
        frontier_ids(by_question, "cover_em")
    # what GRPO's reward pays decides the measure: the F1 reward, or ReSearch's (an F1 reward) whatever --reward
    assert [trained_measure(r, p) for r, p in [("em", "search_r1"), ("f1", "search_r1"), ("em", "research")]] == [
        "em", "f1", "f1"]


def test_frontier_stages_measure_the_probe_set_before_and_after(tmp_path):
    from verl_search.quickstart.pipeline import Quickstart

    names = lambda **kw: [s.name for s in Quickstart(StudyOptions(out=str(tmp_path), engine="transformers",  # noqa: E731
                                                                       **kw)).stages()]
    assert names() == ["index", "data", "cold_start", "grpo", "evaluate"]
    assert names(frontier_questions=40) == ["index", "data", "cold_start", "frontier", "grpo", "evaluate"]
    run = Quickstart(StudyOptions(out=str(tmp_path), engine="transformers", frontier_questions=40))
    stages = {s.name: s for s in run.stages()}
    assert "frontier" in stages["grpo"].needs and "frontier_questions" in stages["frontier"].keys
    assert "reward" in stages["frontier"].keys  # the reward decides which questions are at the frontier
    # one stage evaluates every model on the held-out questions and probes the start and GRPO models, by model
    assert set(stages["evaluate"].needs) == {"index", "data", "cold_start", "grpo", "frontier"}
    evaluations = run.evaluations()
    assert [name for name, _ in evaluations] == ["untrained", "cold_start", "probe_cold_start", "grpo", "probe_grpo"]
    by_name = dict(evaluations)
    assert by_name["probe_grpo"].model == by_name["grpo"].model == str(tmp_path / "grpo" / "hf")
    assert (by_name["probe_grpo"].samples, by_name["grpo"].samples) == (8, 1)
    assert by_name["probe_cold_start"].data == [str(tmp_path / "data" / "frontier.parquet")]
    without_sft = Quickstart(StudyOptions(out=str(tmp_path), engine="transformers", frontier_questions=40,
                                               sft_examples=0))
    assert [name for name, _ in without_sft.evaluations()] == ["untrained", "probe_cold_start", "grpo", "probe_grpo"]
    quickstart = Quickstart(StudyOptions(out=str(tmp_path), engine="transformers", frontier_samples=6))
    options = quickstart.sampled("m", tmp_path / "frontier.parquet", "probe_grpo")
    assert (options.samples, options.temperature, options.out) == (6, 1.0, str(tmp_path / "eval" / "probe_grpo"))
    with pytest.raises(ValueError, match="--frontier-samples=1"):
        StudyOptions(frontier_samples=1)


def test_the_probe_comparison_pairs_each_questions_sampled_reward():
    before = [{"id": f"2wiki/{q}#{k}", "score": float(k == 0), "em": float(k == 0), "f1": float(k == 0)}
              for q in range(4) for k in range(4)]
    after = [{"id": f"2wiki/{q}#{k}", "score": float(k < 2 + (q == 0)), "em": float(k < 2), "f1": 0.5 + 0.5 * (k < 2)}
             for q in range(4) for k in range(4)]
    comparison = probe_comparison(before, after, samples=200, seed=0)
    assert comparison["em"]["before"] == 0.25 and comparison["em"]["after"] == 0.5
    assert comparison["score"]["mean_diff"] == pytest.approx((0.5 + 0.25 * 3) / 4)
    assert comparison["score"]["better"] == 4 and comparison["score"]["n"] == 4
    assert (comparison["f1"]["before"], comparison["f1"]["after"]) == (0.25, 0.75)


def test_the_report_has_the_probe_section_when_both_probes_ran(tmp_path):
    from verl_search.report.quickstart import write_report

    record = lambda qid, em: {"id": qid, "data_source": "2wiki", "question": "Who?", "golden_answers": ["a"],  # noqa: E731
                              "prediction": "a" if em else "b", "em": em, "f1": em, "cover_em": em, "score": em,
                              "num_searches": 1, "answered": True, "failed_searches": 0, "generated_tokens": 5}
    models = {"cold_start": [record("2wiki/1", 0.0)], "grpo": [record("2wiki/1", 1.0)]}
    probes = {"cold_start": [record(f"2wiki/1#{k}", float(k == 0)) for k in range(4)],
              "grpo": [record(f"2wiki/1#{k}", float(k < 3)) for k in range(4)]}
    report = write_report(tmp_path, models, {}, {}, {"title": "t"}, samples=100, probes=probes)
    assert report["probe"]["score"]["before"] == 0.25 and report["probe"]["score"]["after"] == 0.75
    text = (tmp_path / "report.md").read_text()
    assert "## Sampled reward on the frontier probe set" in text and "(`--frontier-questions`; by exact match)" in text
    write_report(tmp_path, models, {}, {}, {"title": "t", "options": {"reward": "f1"}}, samples=100, probes=probes)
    assert "by token F1, the measure GRPO's reward pays" in (tmp_path / "report.md").read_text()
    assert write_report(tmp_path, models, {}, {}, {"title": "t"}, samples=100, probes={})["probe"] is None
    assert "--balance-positions" not in (tmp_path / "report.md").read_text()
    write_report(tmp_path, models, {}, {}, {"title": "t", "options": {"balance_positions": True}}, samples=100)
    assert "(`--balance-positions`)" in (tmp_path / "report.md").read_text()


def test_control_is_the_same_grpo_run_on_permuted_scores_in_one_command(tmp_path, monkeypatch, tiny_qwen):
    """`--control`: after GRPO, the same run with permuted scores, evaluated and probed like GRPO. The trainer is
    not started here (`run_grpo` is replaced by a recorder; the training runs are tests/training's): what is
    checked is that both stages hand it the same overrides but for the permutation and the folder."""
    from verl_search.quickstart import grpo as grpo_module
    from verl_search.quickstart.pipeline import Quickstart

    options = StudyOptions(out=str(tmp_path), engine="transformers", frontier_questions=40, control=True)
    stages = {s.name: s for s in Quickstart(options).stages()}
    (tmp_path / "cold_start").mkdir()
    (tmp_path / "cold_start" / "hf").symlink_to(tiny_qwen)  # both runs start from the cold-start model
    assert list(stages)[-3:] == ["grpo", "grpo_control", "evaluate"]
    assert [name for name, _ in Quickstart(options).evaluations()][-4:] == ["grpo", "probe_grpo", "grpo_control",
                                                                            "probe_grpo_control"]
    assert stages["grpo_control"].needs == stages["grpo"].needs
    assert set(stages["grpo_control"].keys) == {*stages["grpo"].keys, "control"}
    calls = {}
    monkeypatch.setattr(grpo_module, "run_grpo", lambda recipe, index, overrides, out, steps: calls.update(
        {out.name: [o.replace(str(out), "RUN") for o in overrides]}))
    stages["grpo"].run()
    stages["grpo_control"].run()
    added = set(calls["grpo_control"]) - set(calls["grpo"])
    assert {o.split("=")[0] for o in added} == {"+trainer.v1.sampler.sampler_kwargs.permute_scores",
                                               "+trainer.v1.sampler.sampler_kwargs.permute_seed"}, added
    assert set(calls["grpo"]) - set(calls["grpo_control"]) == set()
    with pytest.raises(ValueError, match="--control .*--permuted-reward"):
        StudyOptions(control=True, permuted_reward=True)
    with pytest.raises(ValueError, match="--control .*--grpo-steps"):
        StudyOptions(control=True, grpo_steps=0)


def test_the_report_compares_the_control_with_the_start_model(tmp_path):
    from verl_search.report.quickstart import write_report

    record = lambda qid, em: {"id": qid, "data_source": "2wiki", "question": "Who?", "golden_answers": ["a"],  # noqa: E731
                              "prediction": "a" if em else "b", "em": em, "f1": em, "cover_em": em, "score": em,
                              "num_searches": 1, "answered": True, "failed_searches": 0, "generated_tokens": 5}
    models = {"cold_start": [record(f"2wiki/{i}", 0.0) for i in range(4)],
              "grpo": [record(f"2wiki/{i}", float(i < 3)) for i in range(4)],
              "grpo_control": [record(f"2wiki/{i}", float(i < 1)) for i in range(4)]}
    probes = {"cold_start": [record(f"2wiki/1#{k}", float(k == 0)) for k in range(4)],
              "grpo": [record(f"2wiki/1#{k}", float(k < 3)) for k in range(4)],
              "grpo_control": [record(f"2wiki/1#{k}", float(k < 2)) for k in range(4)]}
    report = write_report(tmp_path, models, {}, {}, {"title": "t"}, samples=100, probes=probes)
    pairs = {key.rsplit(":", 1)[0] for key in report["comparisons"]}
    assert pairs == {"cold_start -> grpo", "cold_start -> grpo_control", "grpo_control -> grpo"}, pairs
    assert report["comparisons"]["cold_start -> grpo_control: em"]["mean_diff"] == 0.25
    assert report["comparisons"]["grpo_control -> grpo: em"]["mean_diff"] == 0.5
    assert report["probe"]["score"]["after"] == 0.75 and report["probe_control"]["score"]["after"] == 0.5
    text = (tmp_path / "report.md").read_text()
    assert "| grpo_control | all | 4 |" in text and "The control: the same GRPO run" in text


def test_balancing_keeps_as_many_first_as_last_named_golds_and_every_other_row(tmp_path):
    from verl_search.report.baselines import gold_position
    from verl_search.quickstart.frontier import balance_gold_positions

    questions = [("Which came first, Jaws or Alien?", "Jaws"), ("Who is older, Ann or Bob?", "Ann"),
                 ("Which is longer, the Nile or the Amazon?", "Amazon"), ("Who died first, Cy or Di?", "Di"),
                 ("Which film is older, Up or Cars?", "Cars"), ("Who directed Jaws?", "Steven Spielberg"),
                 ("Is Up a film?", "yes"), ("Which is it, A or B?", "C")]
    frame = pd.DataFrame([{"data_source": "2wiki", "extra_info": {"id": str(i), "question": q},
                           "reward_model": {"ground_truth": {"target": [gold]}}} for i, (q, gold) in enumerate(questions)])
    frame.to_parquet(tmp_path / "frontier.parquet")
    assert [gold_position(q, [g]) for q, g in questions] == ["first", "first", "last", "last", "last", None, None, None]
    summary = balance_gold_positions(tmp_path / "frontier.parquet", tmp_path / "balanced.parquet", seed=0, minimum=2)
    assert summary == {"rows": 7, "first": 2, "last": 3, "dropped": 1}
    kept = pd.read_parquet(tmp_path / "balanced.parquet")
    ids = [row["id"] for row in kept["extra_info"]]
    positions = [gold_position(q, [g]) for q, g in (questions[int(i)] for i in ids)]
    assert positions.count("first") == positions.count("last") == 2 and ids == sorted(ids, key=int)
    assert {"5", "6", "7"} <= set(ids)  # the other shapes, and a gold naming neither option, are all kept
    # the same seed drops the same row; too few rows left is refused, naming the flag
    balance_gold_positions(tmp_path / "frontier.parquet", tmp_path / "again.parquet", seed=0, minimum=2)
    assert list(pd.read_parquet(tmp_path / "again.parquet")["extra_info"]) == list(kept["extra_info"])
    with pytest.raises(ValueError, match="--balance-positions"):
        balance_gold_positions(tmp_path / "frontier.parquet", tmp_path / "none.parquet", seed=0, minimum=8)


def test_balancing_needs_frontier_questions():
    with pytest.raises(ValueError, match="--frontier-questions"):
        StudyOptions(balance_positions=True)
    assert StudyOptions(balance_positions=True, frontier_questions=8).balance_positions
