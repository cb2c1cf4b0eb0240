"""The quickstart report's metrics that cannot mislead (issue 50, item 3; issue 49's generation per trained group):
answer-score against format-only variance of the trained groups, recomputed from the rollouts, with "Every trained
group carried signal" only where it holds; the groups generated per trained group; the title baseline and the
"gold visible" ceiling; EM / F1 with the gold visible or not, searches and queries per model; the probe gains
split into trained and untrained questions; and the answer-only group filter (`--filter-metric answer`) as verl's
DAPO filter applies it. On hand-written rows and on the default run's kept files (`tests/assets/runs/
quickstart_run/`), re-rendered without training."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import SHARED
from verl_search.report.baselines import by_shape, searcher, shape_table
from verl_search.report.observations import conditional_metrics, conditional_table, passage_title, top_title
from verl_search.report.probes import split_table, trained_prompts, trained_split
from verl_search.report.quickstart import load_records, rerender_report, write_report
from verl_search.report.grpo_signal import explain, read_rollouts, rollout_signal, section, step_signals
from verl_search.training.progress import logged_steps

RUN = SHARED / "runs" / "quickstart_run"
WELL_FORMED = "<think> x </think>\n<search> q </search>\n\n<information>Doc 1(Title: \"T\") t</information>\n\n" \
              "<think> y </think>\n<answer> {} </answer>"
MALFORMED = "<answer> {} </answer> trailing words after the answer"


def response(group: str, session: int, answer: str, gold: str = "Paris", malformed: bool = False) -> dict:
    """A dumped response scored as the quickstart's EM reward scores it (1, 0.2 well formed, 0.1 malformed)."""
    from verl_search.quickstart.grpo import REWARD_WEIGHTS
    from verl_search.rewards import compute_score

    output = (MALFORMED if malformed else WELL_FORMED).format(answer)
    score = compute_score("", output, {"target": [gold]}, None, **REWARD_WEIGHTS["em"])["score"]
    return {"input": f"prompt of {group}", "uid": f"{group}_{session}_0", "output": output, "gts": {"target": [gold]},
            "score": score}


def groups(answer: bool = True, zero: bool = True, format_only: bool = True) -> list[dict]:
    rows = []
    if answer:  # one right of four: the answer scores differ
        rows += [response("answer", i, "Paris" if i == 0 else "Rome") for i in range(4)]
    if zero:  # all wrong, all well formed: rewards all 0.2
        rows += [response("zero", i, "Rome") for i in range(4)]
    if format_only:  # all wrong, one malformed: rewards differ (0.1 vs 0.2), answer scores do not
        rows += [response("format", i, "Rome", malformed=i == 0) for i in range(4)]
    return rows


def test_trained_groups_split_into_answer_signal_format_credit_and_none():
    s = rollout_signal(groups())
    assert (s["groups"], s["zero_variance_groups"], s["answer_groups"], s["format_only_groups"]) == (3, 1, 1, 1)
    assert s["em_groups"] == 1 and s["answer"] == "em"
    steps = {1: {"search/groups/generated": 8.0, "training/filter_groups/evicted_samples": 5.0}}
    text = "\n".join(explain(step_signals(steps, {1: groups()})))
    assert "Every trained group carried signal" not in text
    assert "Of the 3 trained groups in the kept rollouts (step 1), 1 differed in their answer scores (EM), 1 only by " \
           "format credit" in text and "and 1 not at all." in text
    assert "Groups generated per trained group: 2.7 by step" in text  # 8 generated, 3 trained
    # rows without `gts` (an older dump): no answer counts, no claim either way
    bare = [{k: v for k, v in row.items() if k != "gts"} for row in groups()]
    assert rollout_signal(bare)["answer_groups"] is None
    assert "answer scores" not in "\n".join(explain(step_signals({}, {1: bare})))
    with pytest.raises(ValueError, match="answer='acc'"):
        rollout_signal(groups(), answer="acc")


def test_every_trained_group_carried_signal_only_when_every_kept_group_did():
    steps = {1: {"search/groups/generated": 4.0, "training/filter_groups/evicted_samples": 3.0},
             2: {"search/groups/generated": 6.0, "training/filter_groups/evicted_samples": 4.0}}
    both = {1: groups(zero=False, format_only=False), 2: groups(zero=False, format_only=False)}
    text = section(step_signals(steps, both))
    assert "Every trained group carried signal: in all 2 trained groups (step 1, 2) the answer scores (EM" in text
    assert "Groups generated per trained group: 4.0, 6.0 by step (most 6.0, step 2)." in text
    assert "| 4.00 |" in text and "| 1 / 0 |" in text  # the per-step columns
    # a step without kept rollouts: not claimed for it; its trained groups come from the logged counts (6 - 4)
    signals = step_signals(steps, {1: both[1]})
    text = section(signals)
    assert "Every trained group carried signal" not in text and "step 2 kept no rollouts to count" in text
    assert [s["generated_per_trained"] for s in signals] == [4.0, 3.0]
    # the answer-only filter names what it compared
    assert "groups had all answer scores (`acc`) equal" in section(step_signals(steps, both), None, "acc")


def test_a_step_that_trained_groups_without_signal_at_the_limit_says_so():
    steps = {1: {"search/groups/generated": 4.0, "training/filter_groups/evicted_samples": 2.0},
             2: {"search/groups/generated": 8.0, "training/filter_groups/evicted_samples": 6.0,
                 "search/groups/trained_without_signal": 1.0}}
    text = section(step_signals(steps, {}))
    assert "(`--max-gen-batches`), the step trained on the groups it had: step 2: 1 group(s) without signal" in text
    assert "step 1:" not in text.split("--max-gen-batches")[1]
    assert "--max-gen-batches" not in section(step_signals({1: steps[1]}, {}))


def test_the_kept_runs_rollouts_hold_one_format_only_group_and_16_groups_generated_per_trained_one():
    from verl_search.quickstart.grpo import REWARD_WEIGHTS
    from verl_search.rewards import compute_score

    rollouts = read_rollouts(RUN / "grpo" / "rollouts")
    for rows in rollouts.values():  # the recomputation reads what verl scored
        for row in rows:
            assert compute_score("", row["output"], row["gts"], None, **REWARD_WEIGHTS["em"])["score"] == \
                pytest.approx(row["score"], abs=1e-6)
    signals = step_signals(logged_steps(RUN / "grpo" / "metrics.jsonl"), rollouts)
    assert [(s["rollouts"]["answer_groups"], s["rollouts"]["format_only_groups"]) for s in signals] == [(2, 0), (1, 1)]
    assert [s["generated_per_trained"] for s in signals] == [4.0, 16.5]


def record(qid: str, golds: list[str], prediction: str, observations: list[tuple[str, str]], question: str = "") -> dict:
    """An evaluation record with one search turn per (query, observation) and an answering turn."""
    from verl_search.rewards.qa import exact_match, f1_score

    turns = [{"generated": f"<search> {q} </search>", "queries": [q], "observation": o} for q, o in observations]
    turns.append({"generated": f"<answer> {prediction} </answer>", "queries": []})
    return {"id": qid, "data_source": "nq", "question": question or f"Who is {qid}?", "golden_answers": golds,
            "prediction": prediction, "em": exact_match(prediction, golds), "f1": f1_score(prediction, golds),
            "cover_em": 0.0, "score": 0.0, "num_searches": len(observations), "answered": True, "failed_searches": 0,
            "generated_tokens": 10, "turns": turns}


def info(title: str, text: str) -> str:
    return f"\n\n<information>Doc 1(Title: \"{title}\") {text}\nDoc 2(Title: \"Other\") more ...(truncated)</information>\n\n"


def hand_written() -> list[dict]:
    return [
        record("a", ["Paris"], "Paris", [("Who is a?", info("Paris", "Paris is a city."))]),  # visible, right
        record("b", ["Lyon"], "Rome", [("Who is b?", info("France", "Lyon is a city."))]),  # visible, wrong
        record("c", ["Nice"], "Nice", [("Who is c?", info("Nice", "A city."))]),  # the title shows it: visible
        record("d", ["Ann"], "Anne", [("where is d", info("Anne", "Anne was queen.")),  # not visible: "Ann" in "Anne"
                                      ("d again", info("Doc", "nothing"))]),
        record("e", ["1"], "x", [("Who is e?", info("Doc", "No number here."))]),  # "1" only in the frame: "Doc 1("
        record("f", ["Oslo"], "", []),  # no search
    ]


def test_conditional_metrics_split_by_what_the_model_saw():
    m = conditional_metrics(hand_written())
    assert m["n"] == 6 and m["gold_visible"] == pytest.approx(3 / 6)
    assert (m["visible"]["n"], m["visible"]["em"]) == (3, pytest.approx(2 / 3))
    assert (m["not_visible"]["n"], m["not_visible"]["em"]) == (3, 0.0)
    assert m["searches_per_question"] == pytest.approx(6 / 6) and m["second_search"] == pytest.approx(1 / 6)
    assert (m["queries"], m["queries_differ"]) == (6, pytest.approx(2 / 6))  # "where is d", "d again"
    # the title of the first search's top passage: Paris (right), France, Nice (right), Anne, Doc; none for f
    assert [top_title(r) for r in hand_written()] == ["Paris", "France", "Nice", "Anne", "Doc", None]
    assert (m["top_title"]["n"], m["top_title"]["em"]) == (5, pytest.approx(2 / 6))
    assert passage_title('Doc 1(Title: "Jaws (film)", id: 7) text') == "Jaws (film)"
    # the IRCoT baseline's observation, as its protocol renders passages
    from verl_search.agent_protocol.ircot import format_passages

    assert passage_title(format_passages([{"contents": '"Jaws (film)"\nJaws is a 1975 film.'}])) == "Jaws (film)"
    table = conditional_table({"model": m})
    assert "| model | 0.500 | 0.667 / 0.667 (3) | 0.000 / 0.000 (3) | 1.00 | 0.33 of 6 | 0.17 | 0.333 / 0.333 |" in table
    with pytest.raises(ValueError, match="got none"):
        conditional_metrics([])


def test_the_shape_table_adds_the_top_title_baseline_and_the_gold_visible_ceiling():
    models = {"untrained": [dict(r, turns=[]) for r in hand_written()], "cold_start": hand_written()}
    assert searcher(models) == "cold_start" and searcher({"untrained": models["untrained"]}) is None
    searched_once = [dict(r, turns=r["turns"] if r["id"] == "a" else []) for r in hand_written()]
    assert searcher({"untrained": searched_once, "cold_start": hand_written(), "grpo": hand_written()}) == \
        "cold_start"  # GRPO's start, past an untrained model that searched once
    rows = by_shape(models, None, searcher(models))
    assert rows["top passage title"]["all"] == {"n": 6, "em": pytest.approx(2 / 6), "f1": pytest.approx(2 / 6)}
    assert rows["gold visible"]["all"] == {"n": 6, "share": 0.5} and rows["gold visible"]["kind"] == "ceiling"
    table = shape_table(rows)
    assert "| baseline: top passage title (cold_start's first search) |" in table
    assert "| ceiling: gold visible (cold_start's observations) |" in table and "0.500 of questions |" in table
    assert "top passage title" not in by_shape(models)  # no searcher named: the rows as before


def test_grpo_is_compared_with_its_control_and_on_the_questions_whose_gold_the_start_saw(tmp_path):
    start = hand_written()  # gold visible for a, b, c (a and c right); d, e, f not
    grpo = [dict(r, em=1.0, f1=1.0, score=1.0) if r["id"] in ("b", "d") else r for r in hand_written()]
    control = [dict(r, em=0.0, f1=0.0, score=0.0) if r["id"] == "a" else r for r in hand_written()]
    # GRPO's own observations show nothing: the subset is fixed by the start model's, not the compared models'
    grpo = [dict(r, turns=[]) for r in grpo]
    report = write_report(tmp_path, {"cold_start": start, "grpo": grpo, "grpo_control": control}, {}, {},
                          {"title": "t"}, samples=200)
    whole = report["comparisons"]["grpo_control -> grpo: f1"]
    assert (whole["n"], whole["mean_diff"]) == (6, pytest.approx(3 / 6))  # a, b, d
    subset = report["seen_subset"]
    assert (subset["model"], subset["n"]) == ("cold_start", 3)
    assert subset["comparisons"]["cold_start -> grpo: f1"]["mean_diff"] == pytest.approx(1 / 3)  # b only; d unseen
    assert subset["comparisons"]["grpo_control -> grpo: f1"]["mean_diff"] == pytest.approx(2 / 3)  # a and b
    assert subset["comparisons"]["cold_start -> grpo_control: em"]["mean_diff"] == pytest.approx(-1 / 3)
    text = (tmp_path / "report.md").read_text()
    assert "On the fixed subset of 3 questions whose gold answer is visible in cold_start's own observations" in text
    assert "| grpo_control -> grpo: f1 | 3 | +0.667 [" in text
    unseen = [dict(r, turns=[]) for r in hand_written()]
    empty = write_report(tmp_path, {"cold_start": unseen, "grpo": grpo}, {}, {}, {"title": "t"}, samples=200)
    assert empty["seen_subset"] == {"model": "cold_start", "n": 0, "comparisons": {}}
    assert write_report(tmp_path, {"grpo": grpo}, {}, {}, {"title": "t"}, samples=200)["seen_subset"] is None


def probe_records(qid: str, question: str, ems: list[float]) -> list[dict]:
    return [{"id": f"{qid}#{k}", "question": question, "em": em, "f1": em, "score": em} for k, em in enumerate(ems)]


def test_probe_gains_split_into_the_questions_grpo_trained_on_and_the_others(tmp_path):
    before = [*probe_records("q1", "Who is q1?", [0, 0]), *probe_records("q2", "Who is q2?", [0, 1]),
              *probe_records("q3", "Who is q3?", [1, 0])]
    after = [*probe_records("q1", "Who is q1?", [1, 1]), *probe_records("q2", "Who is q2?", [1, 1]),
             *probe_records("q3", "Who is q3?", [0, 0])]
    prompts = trained_prompts({1: [{"input": "system ... Question: Who is q1?\nassistant"},
                                   {"input": "system ... Question: Who is q2?\nassistant"}]})
    split = trained_split(before, after, prompts, 200, 0)
    assert (split["trained"]["em"]["n"], split["trained"]["em"]["mean_diff"]) == (2, pytest.approx(0.75))
    assert (split["untrained"]["em"]["n"], split["untrained"]["em"]["mean_diff"]) == (1, pytest.approx(-0.5))
    assert trained_split(before, after, set(), 200, 0)["trained"] is None
    table = split_table({"grpo": split})
    assert "| grpo | trained by GRPO | 2 | 0.250 -> 1.000 | +0.750 [" in table and "| grpo | not trained | 1 |" in table
    # in the report, with the trained questions read from the runs' rollouts (the control's from its folder)
    (tmp_path / "grpo_control" / "rollouts").mkdir(parents=True)
    (tmp_path / "grpo_control" / "rollouts" / "1.jsonl").write_text(
        json.dumps({"input": "Question: Who is q3?", "score": 0.0}) + "\n")
    records = {"cold_start": hand_written(), "grpo": hand_written()}
    report = write_report(tmp_path, records, {}, {}, {"title": "t"}, samples=200,
                          rollouts={1: [{"input": "Question: Who is q1?", "score": 1.0}]},
                          probes={"cold_start": before, "grpo": after, "grpo_control": before})
    assert report["probe_split"]["grpo"]["trained"]["em"]["n"] == 1
    assert report["probe_split"]["grpo_control"]["trained"]["em"]["n"] == 1  # q3
    text = (tmp_path / "report.md").read_text()
    assert "Split by whether the run trained on the question" in text and "| grpo_control | trained by GRPO | 1 |" in text


def test_the_kept_run_rerenders_with_every_new_section(tmp_path):
    out = tmp_path / "run"
    shutil.copytree(RUN, out)
    old = json.loads((out / "report.json").read_text())
    old["meta"]["options"]["bootstrap_samples"] = 200  # the models' numbers do not depend on it
    (out / "report.json").write_text(json.dumps(old))
    (out / "cold_start").mkdir(exist_ok=True)
    (out / "cold_start" / "cold_start.json").write_text(json.dumps({  # as the cold start now writes it
        "examples": 32, "gold_visible": 32, "max_obs_tokens": 160,
        "selection": {"rows": 1238, "candidates": 125, "in_top_k": 48, "visible": 32}}))
    report = rerender_report(out)
    text = (out / "report.md").read_text()
    assert report["models"] == old["models"]  # the models' numbers are the run's
    assert "Cold start: 32 of 32 trajectories (100%) show the gold answer" in text and "125 candidate" in text
    conditional = report["conditional"]
    assert [round(conditional[m]["gold_visible"] * 102) for m in ("untrained", "cold_start", "grpo")] == [0, 23, 24]
    assert "| cold_start | 0.225 | 0.261 / 0.330 (23) | 0.038 / 0.080 (79) | 0.98 | 0.07 of 100 | 0.00 |" in text
    assert report["by_shape"]["top passage title"]["all"]["em"] == pytest.approx(4 / 102)
    assert "| ceiling: gold visible (cold_start's observations) |" in text
    assert "Every trained group carried signal" not in text  # step 2 trained a format-only group
    assert "3 differed in their answer scores (EM), 1 only by format credit" in text
    assert report["generated_per_trained"] == {"1": 4.0, "2": 16.5}
    assert "Groups generated per trained group: 4.0, 16.5 by step (most 16.5, step 2)." in text
    assert report["probe_split"] == {} and "Split by whether" not in text  # no probe set in the default run
    assert list(load_records(out)) == ["untrained", "cold_start", "grpo"]


@pytest.mark.parametrize("reward, key", [("em", "acc"), ("f1", "f1")])
def test_the_answer_filter_drops_groups_that_differ_only_by_format_credit(tmp_path, monkeypatch, reward, key):
    """`--filter-metric answer` composes into verl's `algorithm.filter_groups.metric` naming the reward's answer
    score; verl's own DAPO classification (its replay buffer's `_dapo_filtered_keys`, on the reward's extra outputs
    as its reward loop stores them) then drops the format-only group and keeps the one whose answers differ, where
    the `reward` metric keeps both."""
    import torch
    import transfer_queue
    from verl.trainer.ppo.v1 import PPOTrainerSync

    from verl_search.quickstart.grpo import REWARD_WEIGHTS, grpo_overrides, shipped_recipe
    from verl_search.report.grpo_signal import filter_metric_key
    from verl_search.quickstart.options import StudyOptions, protocol_options
    from verl_search.rewards import compute_score
    from verl_search.verl_config.compose import compose_verl_config

    protocol = protocol_options(StudyOptions(), tmp_path / "index")
    (tmp_path / "model").mkdir()  # the overrides read the model's config (its largest tensor); nothing is loaded
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 1000, "hidden_size": 64}))
    common = dict(model=str(tmp_path / "model"), train_file=tmp_path / "a", val_file=tmp_path / "b", out=tmp_path, steps=1,
                  prompts_per_step=2, group_size=4, lr=1e-5, kl=False, reward=reward, max_gen_batches=6)
    rows = groups(zero=False)
    scored = [(row["uid"], compute_score("", row["output"], row["gts"], None, **REWARD_WEIGHTS[reward])) for row in rows]
    stored = {"rm_scores": [torch.tensor([0.0, result["score"]]) for _, result in scored],
              "extra_fields": [{"reward_extra_info": result} for _, result in scored]}
    monkeypatch.setattr(transfer_queue, "kv_batch_get", lambda keys, partition_id, select_fields: {
        field: [stored[field][[uid for uid, _ in scored].index(k)] for k in keys] for field in select_fields})
    filtered = {}
    for metric in ("reward", "answer"):
        config = compose_verl_config(grpo_overrides(protocol, **common, filter_metric=metric), recipe=shipped_recipe())
        assert config.algorithm.filter_groups.metric == filter_metric_key(metric, reward) == \
            ("reward" if metric == "reward" else key)
        trainer = object.__new__(PPOTrainerSync)
        trainer.config, trainer.trainer_mode = config, "sync"
        buffer = trainer._build_replay_buffer()
        buffer.partitions["train"] = {uid: {} for uid, _ in scored}
        buffer.finished_keys["train"] = {uid.split("_")[0] for uid, _ in scored}
        filtered[metric] = buffer._dapo_filtered_keys("train")[0]
    assert filtered == {"reward": set(), "answer": {"format"}}
    # the report names the filter and what it compared
    steps = {1: {"search/groups/generated": 5.0, "training/filter_groups/evicted_samples": 3.0}}
    write_report(tmp_path, {"cold_start": hand_written(), "grpo": hand_written()}, {}, steps,
                 {"options": {"reward": reward, "filter_metric": "answer"}}, samples=200,
                 rollouts={1: groups(zero=False, format_only=False)})
    text = (tmp_path / "report.md").read_text()
    assert "(`--filter-metric answer`)" in text and f"3 groups had all answer scores (`{key}`) equal" in text
    with pytest.raises(ValueError, match="filter_metric='score'"):
        filter_metric_key("score")
    with pytest.raises(ValueError, match="--filter-metric answer"):
        StudyOptions(filter_metric="answer", filter_groups=False)
