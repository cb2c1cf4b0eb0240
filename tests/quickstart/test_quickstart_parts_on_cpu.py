"""The quickstart's pure parts: the report tables and curves, the stage resume
logic, the options shared by training and evaluation, the split it evaluates on."""

from __future__ import annotations

import json

import pytest

from verl_search.quickstart.options import QuickstartOptions, StudyOptions, for_model, protocol_options, response_length
from verl_search.quickstart.stages import Stage, StageRecord, needs_run, read_record, run_stages, write_record
from verl_search.report.quickstart import (
    comparisons_table,
    curve_keys,
    models_table,
    plot_curves,
    write_report,
)


# --- report ----------------------------------------------------------------------------------------

def record(qid, source, em, searches=1, answered=True):
    return {"id": qid, "data_source": source, "question": f"Who is {qid}?", "golden_answers": [qid],
            "prediction": qid if em else "", "em": em, "f1": em, "cover_em": em, "score": em,
            "num_searches": searches, "answered": answered, "failed_searches": 0, "generated_tokens": 10}


def test_models_table_has_every_model_and_source_with_intervals():
    from verl_search.report.evaluation import summarize

    rows = [record("a", "nq", 1.0), record("b", "hotpotqa", 0.0, searches=0, answered=False)]
    table = models_table({"untrained": summarize(rows), "grpo": summarize(rows)})
    lines = table.splitlines()
    assert len(lines) == 2 + 2 * 3  # header, rule, (all + 2 sources) per model
    assert lines[2].startswith("| untrained | all | 2 | 0.500 [")
    assert "| grpo | nq | 1 | 1.000 [" in table and "| 0.50 | 0.50 | 0 |" in lines[2]


def test_comparisons_table_signs_the_difference():
    text = comparisons_table({"a -> b: em": {"n": 3, "mean_diff": -0.25, "ci95": [-0.5, 0.0], "better": 0, "worse": 1}})
    assert "| a -> b: em | 3 | -0.250 [-0.500, +0.000] | 0 | 1 |" in text


def test_curve_keys_take_reward_and_every_step_search_metric_but_not_validation():
    steps = {1: {"critic/score/mean": 0.1, "search/num_searches/mean": 1.0, "search/failed_share": 0.0,
                 "search/num_searches/max": 2, "val-aux/mini/num_searches/mean": 1.0, "timing_s/gen": 3.0}}
    assert curve_keys(steps) == ["critic/score/mean", "search/failed_share", "search/num_searches/mean"]


def test_plot_curves_writes_a_png_only_with_something_to_draw(tmp_path):
    assert plot_curves({1: {"timing_s/gen": 1.0}}, tmp_path / "none.png", "t") == []
    assert not (tmp_path / "none.png").exists()
    drawn = plot_curves({1: {"critic/score/mean": 0.1}, 2: {"critic/score/mean": 0.3}}, tmp_path / "c.png", "t")
    assert drawn == ["critic/score/mean"] and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_write_report_compares_each_model_with_the_one_before_and_the_first(tmp_path):
    base = [record(str(i), "nq" if i % 2 else "2wiki", 0.0) for i in range(10)]
    better = [dict(r, em=1.0, score=1.0, f1=1.0) if int(r["id"]) < 6 else r for r in base]
    report = write_report(tmp_path, {"untrained": base, "cold_start": base, "grpo": better},
                          {"index": {"seconds": 1.0, "cpu_seconds": 0.5, "load": [[1.0, 2.0]]},
                           "grpo": {"seconds": 2.0, "cpu_seconds": 3.0, "load": [[2.0, 2.5], [0.5, 1.0]]}},
                          {1: {"critic/score/mean": 0.5}}, {"title": "t"}, samples=500)
    assert set(report["comparisons"]) == {f"{a} -> {b}: {k}" for a, b in
                                          [("untrained", "cold_start"), ("cold_start", "grpo"), ("untrained", "grpo")]
                                          for k in ("em", "f1", "score")}
    assert report["comparisons"]["cold_start -> grpo: em"]["mean_diff"] == pytest.approx(0.6)
    assert list(json.loads((tmp_path / "report.json").read_text())["stages"]) == ["index", "grpo"]
    text = (tmp_path / "report.md").read_text()
    assert "| grpo | 2 | 3 | 2.0 -> 2.5, 0.5 -> 1.0 |" in text and "| all | 3 | 4 | |" in text
    assert "| all | 3 |" in text and "![curves](curves.png)" in text and (tmp_path / "curves.png").is_file()
    # every model by question shape beside the baselines, and the sign test of each comparison
    assert report["by_shape"]["grpo"]["open"] == {"n": 10, "em": 0.6, "f1": 0.6}
    assert report["by_shape"]["last option"]["all"]["em"] == 0.0 and "| baseline: first option |" in text
    assert report["comparisons"]["cold_start -> grpo: em"]["sign_p"] == pytest.approx(2 / 2 ** 6)


# --- stages and resume -----------------------------------------------------------------------------

def test_a_finished_stage_is_skipped_and_an_unfinished_one_rerun(tmp_path):
    options = QuickstartOptions(out=str(tmp_path), grpo_steps=3)
    calls = []
    stages = [Stage("a", ("seed",), (), lambda: calls.append("a")),
              Stage("b", ("grpo_steps",), ("a",), lambda: calls.append("b"))]
    first = run_stages(stages, options)
    assert calls == ["a", "b"] and set(first) == {"a", "b"}
    assert first["a"]["cpu_seconds"] >= 0 and len(first["a"]["load"]) == 1
    run_stages(stages, options)
    assert calls == ["a", "b"]  # nothing redone
    record_b = read_record(tmp_path / "stages", "b")
    record_b.status = "started"  # as a run killed during b leaves it
    write_record(tmp_path / "stages", "b", record_b)
    run_stages(stages, options)
    assert calls == ["a", "b", "b"] and read_record(tmp_path / "stages", "b").attempts == 2


def test_a_failed_stage_keeps_its_time_and_stays_unfinished(tmp_path):
    options = QuickstartOptions(out=str(tmp_path))

    def fail():
        raise RuntimeError("trainer died")

    with pytest.raises(RuntimeError, match="trainer died"):
        run_stages([Stage("a", (), (), fail)], options)
    record_a = read_record(tmp_path / "stages", "a")
    assert record_a.status == "started" and record_a.seconds >= 0 and record_a.attempts == 1


def _train_into(ckpt, fail=False):
    def run():  # a trainer's step: a checkpoint written, then the stage either finishes or dies
        (ckpt / "global_step_1").mkdir(parents=True, exist_ok=True)
        (ckpt / "global_step_1" / "optim.pt").write_bytes(b"state")
        if fail:
            raise RuntimeError("trainer died")
    return run


@pytest.mark.parametrize("keep", [False, True])
def test_a_done_stage_s_checkpoint_is_removed_unless_kept(tmp_path, keep):
    options = QuickstartOptions(out=str(tmp_path), keep_checkpoints=keep)
    ckpt = tmp_path / "grpo" / "ckpt"
    with pytest.raises(RuntimeError, match="trainer died"):
        run_stages([Stage("grpo", (), (), _train_into(ckpt, fail=True), ckpt)], options)
    assert (ckpt / "global_step_1" / "optim.pt").is_file()  # an unfinished stage resumes from it
    run_stages([Stage("grpo", (), (), _train_into(ckpt), ckpt)], options)
    assert read_record(tmp_path / "stages", "grpo").status == "done"
    assert ckpt.is_dir() == keep


def test_other_options_are_refused_naming_what_changed_even_upstream(tmp_path):
    options = QuickstartOptions(out=str(tmp_path), test_questions=10)
    stages = [Stage("data", ("test_questions",), (), lambda: None),
              Stage("eval", ("max_turns",), ("data",), lambda: None)]
    run_stages(stages, options)
    changed = QuickstartOptions(out=str(tmp_path), test_questions=20)
    with pytest.raises(ValueError, match=r"test_questions: 10 then, 20 now.*another --out"):
        run_stages(stages, changed)
    # the dependent stage is refused too: its input changed
    from verl_search.quickstart.stages import fingerprint

    by_name = {s.name: s for s in stages}
    with pytest.raises(ValueError, match=r"needs\.data\.options\.test_questions"):
        needs_run(tmp_path / "stages", "eval", fingerprint(stages[1], by_name, changed))


def test_a_stage_recorded_before_dtype_existed_ran_in_float32(tmp_path):
    """A run folder made before `--dtype` resumes with `--dtype float32` and is refused, by name, with bfloat16."""
    from verl_search.quickstart.stages import fingerprint

    stages = [Stage("data", ("test_questions",), (), lambda: None),
              Stage("cold_start", ("sft_examples", "dtype"), ("data",), lambda: None)]
    by_name = {s.name: s for s in stages}
    old = {"options": {"sft_examples": 32}, "needs": {"data": {"options": {"test_questions": 102}, "needs": {}}}}
    write_record(tmp_path / "stages", "cold_start", StageRecord(old, status="done"))
    float32 = fingerprint(stages[1], by_name, StudyOptions(out=str(tmp_path), dtype="float32"))
    assert needs_run(tmp_path / "stages", "cold_start", float32) is False
    bfloat16 = fingerprint(stages[1], by_name, StudyOptions(out=str(tmp_path), dtype="bfloat16"))
    with pytest.raises(ValueError, match=r"options\.dtype: 'float32' then, 'bfloat16' now"):
        needs_run(tmp_path / "stages", "cold_start", bfloat16)


def test_never_started_stage_needs_a_run(tmp_path):
    assert needs_run(tmp_path, "x", {"options": {}}) is True
    write_record(tmp_path, "x", StageRecord({"options": {}}, status="done"))
    assert needs_run(tmp_path, "x", {"options": {}}) is False


# --- options shared by training and evaluation ---------------------------------------------------

def test_training_and_every_evaluation_read_one_protocol(tmp_path, tiny_qwen):
    from verl_search.quickstart.grpo import grpo_overrides

    options = StudyOptions(max_turns=3, topk=4, max_tokens_per_turn=50, max_obs_tokens=70, temperature=0.0)
    protocol = protocol_options(options, tmp_path / "index")
    assert protocol.response_length == response_length(options) == 3 * (50 + 70) + 50
    untrained = for_model(protocol, "smollm2", tmp_path / "t.parquet", tmp_path / "e1")
    trained = for_model(protocol, str(tmp_path / "hf"), tmp_path / "t.parquet", tmp_path / "e2")
    keys = ("max_turns", "topk", "max_tokens_per_turn", "max_obs_tokens", "temperature", "response_length")
    assert [getattr(untrained, k) for k in keys] == [getattr(trained, k) for k in keys] == [3, 4, 50, 70, 0.0, 410]
    overrides = grpo_overrides(protocol, model=str(tiny_qwen), train_file=tmp_path / "a", val_file=tmp_path / "b",
                               out=tmp_path, steps=2, prompts_per_step=4, group_size=4, lr=1e-5, kl=False)
    assert "actor_rollout_ref.rollout.response_length=410" in overrides
    assert "actor_rollout_ref.rollout.val_kwargs.temperature=0.0" in overrides
    import yaml

    loops = yaml.safe_load((tmp_path / "agent_loops.yaml").read_text())
    assert {k: loops[0][k] for k in ("max_turns", "topk", "max_tokens_per_turn", "max_obs_tokens")} == \
        {"max_turns": 3, "topk": 4, "max_tokens_per_turn": 50, "max_obs_tokens": 70}
    assert loops[0]["retrieval_service_url"].startswith("${oc.env:VERL_SEARCH_URL")


@pytest.mark.parametrize("engine, rollout", [("vllm", "vllm"), ("transformers", "verl_search_cpu")])
def test_every_evaluation_and_grpo_roll_out_on_one_engine(tmp_path, tiny_qwen, engine, rollout):
    from verl_search.quickstart.grpo import grpo_overrides

    protocol = protocol_options(QuickstartOptions(), tmp_path / "index", engine)
    assert for_model(protocol, "m", tmp_path / "t.parquet", tmp_path / "e").engine == engine
    overrides = grpo_overrides(protocol, model=str(tiny_qwen), train_file=tmp_path / "a", val_file=tmp_path / "b",
                               out=tmp_path, steps=1, prompts_per_step=2, group_size=2, lr=1e-5, kl=False)
    assert f"actor_rollout_ref.rollout.name={rollout}" in overrides


@pytest.mark.parametrize("reward, expected", [
    ("em", {"structure_format_score": 0.2, "final_format_score": 0.1}),
    ("f1", {"answer_score": "f1", "structure_format_score": 0.1}),
])
def test_grpo_trains_on_the_chosen_reward_with_group_filtering(tmp_path, tiny_qwen, reward, expected):
    """The overrides compose on the shipped recipe into verl's config: the reward's weights reach
    `compute_score`, and DAPO's filter is on with the step's cap (training at it) and `INFLIGHT_GEN_BATCHES`
    generation batches in flight (off with `--no-filter-groups`); the layers' activations are kept, not recomputed."""
    from verl_search.quickstart.grpo import INFLIGHT_GEN_BATCHES, grpo_overrides, shipped_recipe
    from verl_search.rewards import compute_score
    from verl_search.training.names import TRAIN_AT_LIMIT_KWARG
    from verl_search.verl_config.compose import compose_verl_config

    protocol = protocol_options(QuickstartOptions(), tmp_path / "index")
    common = dict(model=str(tiny_qwen), train_file=tmp_path / "a", val_file=tmp_path / "b", out=tmp_path, steps=1,
                  prompts_per_step=2, group_size=8, lr=1e-5, kl=False, reward=reward)
    config = compose_verl_config(grpo_overrides(protocol, **common, max_gen_batches=6), recipe=shipped_recipe())
    kwargs = dict(config.reward.custom_reward_function.reward_kwargs)
    assert kwargs == expected
    well_formed_wrong = "<think>x</think><answer> Rome Italy </answer>"
    assert compute_score("nq", well_formed_wrong, ["Rome"], {"protocol": "search_r1"}, **kwargs)["score"] == \
        pytest.approx({"em": 0.2, "f1": 2 / 3}[reward])
    assert (config.algorithm.filter_groups.enable, config.algorithm.filter_groups.metric) == (True, "reward")
    assert config.algorithm.filter_groups.max_num_gen_batches == 6
    assert config.algorithm.filter_groups.max_inflight_gen_batches == INFLIGHT_GEN_BATCHES
    assert config.trainer.v1.sampler.sampler_kwargs[TRAIN_AT_LIMIT_KWARG] is True  # at the cap: train, not stop
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing is False  # verl's default True: GPU memory
    unfiltered = compose_verl_config(grpo_overrides(protocol, **common), recipe=shipped_recipe())
    assert not unfiltered.algorithm.filter_groups.enable
    assert not unfiltered.trainer.v1.sampler.sampler_kwargs  # the control is off unless asked for
    control = compose_verl_config(grpo_overrides(protocol, **common, permuted_reward=True, seed=3),
                                  recipe=shipped_recipe())
    assert dict(control.trainer.v1.sampler.sampler_kwargs) == {"permute_scores": True, "permute_seed": 3}
    with pytest.raises(ValueError, match="reward='acc'"):
        grpo_overrides(protocol, **{**common, "reward": "acc"})


@pytest.mark.parametrize("dtype, short", [("float32", "fp32"), ("bfloat16", "bf16")])
def test_the_dtype_reaches_both_trainers_and_every_vllm_rollout(tmp_path, tiny_qwen, dtype, short):
    """`--dtype` composes into verl's config: the GRPO actor's FSDP mixed precision (gradients reduced in fp32) and
    its vLLM rollout's dtype, the SFT trainer's mixed precision, and each evaluation's vLLM replica; the
    transformers engine's rollouts stay float32."""
    from verl_search.eval.verl_run import vllm_overrides
    from verl_search.quickstart.grpo import grpo_overrides, shipped_recipe
    from verl_search.training.cold_start import sft_command
    from verl_search.verl_config.compose import compose_verl_config

    options = StudyOptions(dtype=dtype)
    protocol = protocol_options(options, tmp_path / "index", "vllm")
    assert protocol.dtype == dtype
    config = compose_verl_config(grpo_overrides(protocol, model=str(tiny_qwen), train_file=tmp_path / "a",
                                                val_file=tmp_path / "b", out=tmp_path, steps=1, prompts_per_step=2,
                                                group_size=2, lr=1e-5, kl=False, dtype=dtype), recipe=shipped_recipe())
    precision = config.actor_rollout_ref.actor.fsdp_config.mixed_precision
    assert (precision.param_dtype, precision.reduce_dtype, precision.buffer_dtype) == (short, "fp32", "fp32")
    assert config.actor_rollout_ref.rollout.dtype == dtype
    evaluation = for_model(protocol, str(tiny_qwen), tmp_path / "t.parquet", tmp_path / "e")
    assert f"actor_rollout_ref.rollout.dtype={dtype}" in vllm_overrides(evaluation)
    sft = sft_command(str(tiny_qwen), tmp_path / "t.parquet", tmp_path / "ckpt", steps=1, batch_size=1, lr=1e-4,
                      max_length=64, dtype=dtype)
    assert f"++engine.mixed_precision={{param_dtype:{short},reduce_dtype:fp32,buffer_dtype:fp32}}" in sft
    assert protocol_options(options, tmp_path / "index", "transformers").dtype == "float32"


def test_auto_dtype_is_resolved_before_any_stage_records_it(tmp_path, monkeypatch):
    """A run folder records the dtype that ran, not `auto`: moved to a CPU without native bf16, its trained stages
    are refused by name instead of being taken as the same run."""
    from verl_search.cpu import precision
    from verl_search.quickstart.pipeline import Quickstart
    from verl_search.quickstart.stages import fingerprint

    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    monkeypatch.setattr("verl_search.quickstart.pipeline.in_child", lambda function, *args: function(*args))
    run = Quickstart(QuickstartOptions(out=str(tmp_path), engine="transformers"))
    assert run.options.dtype == "bfloat16"
    stages = {stage.name: stage for stage in run.stages()}
    for name in ("cold_start", "grpo", "evaluate"):
        assert fingerprint(stages[name], stages, run.options)["options"]["dtype"] == "bfloat16", name
    assert "dtype" not in fingerprint(stages["data"], stages, run.options)["options"]


def test_the_weight_sync_bucket_holds_the_largest_tensor(tmp_path):
    """verl refuses a tensor larger than its sync bucket; 2,048 MB (its default) would hold a small model whole."""
    import json

    from verl_search.quickstart.grpo import weight_bucket_megabytes

    def bucket(**config):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return weight_bucket_megabytes(folder)

    assert bucket(vocab_size=49152, hidden_size=576, intermediate_size=1536) == 128  # SmolLM2-135M: 113 MB embedding
    assert bucket(vocab_size=151936, hidden_size=896, intermediate_size=4864) == 576  # Qwen2.5-0.5B: 519 MiB
    assert bucket(vocab_size=1000, hidden_size=64) == 128
    with pytest.raises(FileNotFoundError):
        weight_bucket_megabytes(tmp_path / "missing")


def test_auto_engine_is_evals_choice(tmp_path):
    from verl_search.cpu.engine import choose_engine
    from verl_search.quickstart.pipeline import Quickstart

    assert Quickstart(QuickstartOptions(out=str(tmp_path))).engine == choose_engine("auto") in ("vllm", "transformers")
    assert Quickstart(QuickstartOptions(out=str(tmp_path), engine="transformers")).engine == "transformers"


def test_the_shipped_recipe_is_the_example_recipe():
    from verl_search.quickstart.grpo import shipped_recipe
    from tests.conftest import REPO

    assert shipped_recipe().read_bytes() == (REPO / "examples" / "grpo_qwen2.5-3b-base_search_r1" /
                                             "config.yaml").read_bytes()


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="--test-questions=0"):
        QuickstartOptions(test_questions=0)
    with pytest.raises(ValueError, match="--group-size=1"):
        QuickstartOptions(group_size=1)


def test_the_test_split_covers_every_source_and_never_meets_training():
    from verl_search.quickstart.data import split_rows

    test = split_rows("test", 102)
    train = split_rows("train")
    sources = {row["data_source"] for row in test}
    assert sources == {"2wiki", "hotpotqa", "musique"} and len(test) >= 100
    assert not {r["extra_info"]["id"] for r in test} & {r["extra_info"]["id"] for r in train}
    assert [r["extra_info"]["index"] for r in test] == list(range(len(test)))
    assert split_rows("test", 102) == test  # fixed


def test_a_source_short_of_its_share_is_named(caplog):
    from verl_search.quickstart.data import split_rows

    rows = split_rows("test", 150)  # 50 per source; the test split holds 40 hotpotqa and 40 musique questions
    counts = {source: sum(r["data_source"] == source for r in rows) for source in ("2wiki", "hotpotqa", "musique")}
    assert counts == {"2wiki": 50, "hotpotqa": 40, "musique": 40}
    named = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(named) == 2 and "40 hotpotqa questions" in named[0] and "40 musique questions" in named[1], named


def test_grpo_agent_loop_yaml_sets_every_shipped_loops_limits(tmp_path):
    """GRPO's copy of the shipped agent-loop YAML: every entry (the baselines' too) gets the run's top-k and token
    limits, each loop with a search cap gets `--max-turns` under its own key, and the URL stays `$VERL_SEARCH_URL`."""
    import yaml

    from verl_search.agent_protocol.registry import search_cap_keys
    from verl_search.quickstart.grpo import URL_INTERPOLATION, agent_loop_yaml
    from verl_search.quickstart.options import protocol_options
    from verl_search.verl_config.shipped import config_path

    protocol = protocol_options(QuickstartOptions(out=str(tmp_path), max_turns=3, topk=4), tmp_path / "index")
    path = agent_loop_yaml(protocol, tmp_path / "agent_loops.yaml")
    entries = {e["name"]: e for e in yaml.safe_load(path.read_text())}
    assert set(entries) == {e["name"] for e in yaml.safe_load(open(config_path("agent-loop")))}
    caps = search_cap_keys()
    assert {"search_r1_agent", "research_agent", "ircot_agent"} <= set(caps)
    for name, entry in entries.items():
        assert (entry["topk"], entry["max_obs_tokens"]) == (4, protocol.max_obs_tokens)
        assert name not in caps or entry[caps[name]] == 3
        assert entry["retrieval_service_url"] == URL_INTERPOLATION


def test_check_config_problems_stop_a_grpo_trainer_already_started(tmp_path, bm25_index, monkeypatch):
    """`run_grpo` starts the trainer while check-config runs; problems found then stop it at once. Stand-ins (the
    verdict is the point, not verl): check-config is a function that finds a problem after 3 s, the trainer a
    real child process that would sleep 10 minutes; the retrieval server is the real one on a real index."""
    import sys
    import time

    from verl_search.quickstart import grpo
    from verl_search.training import launch

    def slow_check(recipe, overrides):
        time.sleep(3)
        return ["data.train_batch_size: 0 is not a batch size"]

    monkeypatch.setattr(launch, "check_in_child", slow_check)
    monkeypatch.setattr(launch, "main_ppo_command",
                        lambda recipe, overrides: [sys.executable, "-c", "import time; time.sleep(600)"])
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="fails check-config: data.train_batch_size: 0 is not a batch size"):
        grpo.run_grpo(grpo.shipped_recipe(), bm25_index, [], tmp_path, steps=1)
    assert time.monotonic() - started < 60
    assert (tmp_path / "train.log").read_text().startswith("$ " + sys.executable)  # the trainer had started
