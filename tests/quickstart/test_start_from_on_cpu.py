"""`verl-search study --start-from`: a new study folder begins with a finished one's stages before GRPO.

The source folder here is written by hand with the real stages' fingerprints (`Quickstart.stages`); the stages
themselves (SFT, evaluations) do not run: what is tested is which files and records come across, that the
pipeline then skips exactly the copied stages, and what is refused. A real repeat of a kept study took its
GRPO and evaluation only (docs/learning-run.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from verl_search.quickstart.options import StudyOptions
from verl_search.quickstart.pipeline import Quickstart
from verl_search.quickstart.stages import StageRecord, fingerprint, needs_run, write_record
from verl_search.quickstart.reuse import start_from

FILES = {"index/manifest.json": "{}", "data/train.parquet": "train", "data/test.parquet": "test",
         "cold_start/hf/model.safetensors": "weights", "cold_start/hf/config.json": "{}",
         "cold_start/ckpt/global_step_2/optim.pt": "optimizer", "cold_start/cold_start.json": "[]",
         "eval/untrained/trajectories.jsonl": "{}\n", "eval/cold_start/trajectories.jsonl": "{}\n",
         "eval/grpo/trajectories.jsonl": "{}\n", "grpo/hf/model.safetensors": "grpo weights"}


def options(out, **changes) -> StudyOptions:
    return StudyOptions(**{"out": str(out), "engine": "transformers", "dtype": "float32", "grpo_steps": 1,
                           "control": True, **changes})


def finished_study(folder, **changes) -> StudyOptions:
    """A study folder as a finished run leaves it: every stage recorded done with its real fingerprint."""
    study = options(folder, **changes)
    for name, text in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    stages = Quickstart(study).stages()
    by_name = {stage.name: stage for stage in stages}
    for stage in stages:
        write_record(folder / "stages", stage.name, StageRecord(fingerprint(stage, by_name, study), "done", 12.5, 1))
    return study


def test_the_stages_before_grpo_come_across_and_only_grpo_and_later_run(tmp_path):
    source, out = tmp_path / "study", tmp_path / "repeat"
    finished_study(source)
    repeat = dataclasses.replace(options(out), start_from=str(source))
    stages = Quickstart(repeat).stages()
    assert start_from(source, out, stages, repeat) == ["index", "data", "cold_start"]
    by_name = {stage.name: stage for stage in stages}
    pending = [s.name for s in stages if needs_run(out / "stages", s.name, fingerprint(s, by_name, repeat))]
    assert pending == ["grpo", "grpo_control", "evaluate"]
    assert (out / "data" / "train.parquet").read_text() == "train"
    assert (out / "eval" / "cold_start" / "trajectories.jsonl").is_file()
    assert (out / "eval" / "untrained" / "trajectories.jsonl").is_file()
    # GRPO's outputs and the cold start's optimizer state stay behind
    assert not (out / "grpo").exists() and not (out / "eval" / "grpo").exists()
    assert not (out / "cold_start" / "ckpt").exists()
    # weights are hard links; the files later stages rewrite are copies, so the source never changes under them
    weights = out / "cold_start" / "hf" / "model.safetensors"
    assert weights.stat().st_ino == (source / "cold_start" / "hf" / "model.safetensors").stat().st_ino
    (out / "data" / "train.parquet").write_text("rewritten")
    assert (source / "data" / "train.parquet").read_text() == "train"
    assert json.loads((out / "stages" / "cold_start.json").read_text())["seconds"] == 12.5


def test_a_rerun_resumes_and_copies_nothing(tmp_path):
    source, out = tmp_path / "study", tmp_path / "repeat"
    finished_study(source)
    repeat = dataclasses.replace(options(out), start_from=str(source))
    start_from(source, out, Quickstart(repeat).stages(), repeat)
    (out / "data" / "train.parquet").write_text("the repeat's")
    assert start_from(source, out, Quickstart(repeat).stages(), repeat) == []
    assert (out / "data" / "train.parquet").read_text() == "the repeat's"


def test_a_copy_interrupted_before_its_records_is_made_again(tmp_path):
    source, out = tmp_path / "study", tmp_path / "repeat"
    finished_study(source)
    repeat = dataclasses.replace(options(out), start_from=str(source))
    start_from(source, out, Quickstart(repeat).stages(), repeat)
    for record in (out / "stages").glob("*.json"):  # as if stopped before the records were written
        record.unlink()
    (out / "data" / "test.parquet").write_text("half writ")
    assert start_from(source, out, Quickstart(repeat).stages(), repeat) == ["index", "data", "cold_start"]
    assert (out / "data" / "test.parquet").read_text() == "test"
    assert (out / "cold_start" / "hf" / "model.safetensors").read_text() == "weights"


def test_other_options_before_grpo_are_refused_by_name(tmp_path):
    source, out = tmp_path / "study", tmp_path / "repeat"
    finished_study(source)
    repeat = dataclasses.replace(options(out, sft_examples=96), start_from=str(source))
    with pytest.raises(ValueError, match=r"'cold_start' ran with other options \(.*sft_examples: 32 then, 96 now"):
        start_from(source, out, Quickstart(repeat).stages(), repeat)
    assert not out.exists()


def test_grpo_s_own_options_may_change(tmp_path):
    source, out = tmp_path / "study", tmp_path / "repeat"
    finished_study(source)
    repeat = dataclasses.replace(options(out, grpo_steps=3, grpo_lr=1e-5), start_from=str(source))
    assert start_from(source, out, Quickstart(repeat).stages(), repeat) == ["index", "data", "cold_start"]


def test_an_unfinished_source_stage_is_refused(tmp_path):
    source, out = tmp_path / "study", tmp_path / "repeat"
    study = finished_study(source)
    stages = Quickstart(study).stages()
    cold = next(stage for stage in stages if stage.name == "cold_start")
    write_record(source / "stages", "cold_start",
                 StageRecord(fingerprint(cold, {s.name: s for s in stages}, study), "started"))
    repeat = dataclasses.replace(options(out), start_from=str(source))
    with pytest.raises(ValueError, match="'cold_start' did not finish"):
        start_from(source, out, Quickstart(repeat).stages(), repeat)


def test_evaluations_made_with_other_evaluation_options_run_again(tmp_path):
    source, out = tmp_path / "study", tmp_path / "repeat"
    finished_study(source)
    repeat = dataclasses.replace(options(out, batch_size=17), start_from=str(source))  # the evaluate stage's alone
    assert start_from(source, out, Quickstart(repeat).stages(), repeat) == ["index", "data", "cold_start"]
    assert not (out / "eval" / "cold_start").exists()


def test_a_folder_without_stages_and_out_itself_are_refused(tmp_path):
    repeat = dataclasses.replace(options(tmp_path / "repeat"), start_from=str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="no stages/ folder"):
        start_from(tmp_path / "nothing", tmp_path / "repeat", Quickstart(repeat).stages(), repeat)
    with pytest.raises(ValueError, match="--start-from .* is --out itself"):
        options(tmp_path, start_from=str(tmp_path))
