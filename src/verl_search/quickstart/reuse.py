"""`--start-from`: a new study folder that starts from a finished one's stages before GRPO.

GRPO's sampled rollouts make each run one draw (docs/learning-run.md); judging a setting takes several runs from
one cold start (`verl-search repeats`). `start_from` copies into a new `--out` what the stages before GRPO wrote
(`index/`, `data/`, `cold_start/` without its trainer checkpoint, and with `--frontier-questions` the frontier's
`eval/frontier/`) with their `stages/NAME.json` records, and the untrained and cold-start models' evaluations
(`eval/untrained/`, `eval/cold_start/`, `eval/probe_cold_start/`) where the source's `evaluate` stage ran with the
options the new one has. `run_stages` then skips the copied stages, GRPO (and `--control`'s run) train from the
copied cold start, and the `evaluate` stage finds the copied evaluations complete (`eval.harness` skips questions
already in a `trajectories.jsonl`). Model weights (`*.safetensors`) are hard links where the file system allows
(nothing rewrites them once their stage is done), every other file a copy, so the new folder's stages never write
into the source's files. The copied records keep the source's seconds.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from verl_search.quickstart.options import StudyOptions
from verl_search.quickstart.stages import Stage, fingerprint, fingerprint_differences, read_record, with_legacy_options

logger = logging.getLogger(__name__)

REUSED_STAGES = {"index": ("index",), "data": ("data",), "cold_start": ("cold_start",),
                 "frontier": ("eval/frontier",)}
"""Stage -> the folders under `--out` it wrote (the frontier's parquet files are in `data/`)."""

REUSED_EVALUATIONS = ("eval/untrained", "eval/cold_start", "eval/probe_cold_start")
"""The `evaluate` stage's folders of the models before GRPO, copied where its options match."""

SKIPPED = ("ckpt",)
"""Folders never copied: a trainer's checkpoint, read only by an unfinished attempt of its stage."""


def _copy_file(source: str, target: str) -> None:
    if os.path.lexists(target):  # from an interrupted copy: made again (a link already made is kept)
        if os.path.samefile(source, target):
            return
        os.remove(target)
    if source.endswith(".safetensors"):
        try:
            os.link(source, target)
            return
        except OSError:  # another file system, or links not allowed: copy
            pass
    shutil.copy2(source, target)


def _copy_tree(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, copy_function=_copy_file, ignore=shutil.ignore_patterns(*SKIPPED),
                        dirs_exist_ok=True)


def _same_evaluation_options(source: Path, by_name: dict[str, Stage], options: StudyOptions) -> bool:
    """Whether `source`'s `evaluate` stage ran with the options (not the inputs) the new one's has: then its
    evaluations of the models before GRPO are what the new stage would make."""
    record = read_record(source / "stages", "evaluate")
    if "evaluate" not in by_name or record is None:
        return False
    wanted = fingerprint(by_name["evaluate"], by_name, options)
    return with_legacy_options(record.fingerprint, wanted)["options"] == wanted["options"]


def start_from(source: Path, out: Path, stages: list[Stage], options: StudyOptions) -> list[str]:
    """Copy into `out` the stages of `stages` before GRPO (`REUSED_STAGES`) as the study folder `source` ran them,
    and its evaluations of the models before GRPO (`REUSED_EVALUATIONS`) where its `evaluate` stage had the
    options `options` give it; return the names of the stages copied. Nothing is copied when `out` already holds
    a stage record (a rerun resumes; the records are written last, so an interrupted copy is made again).

    Args:
        source: a study folder (`--out` of a finished `verl-search study`).
        out: the new study folder.
        stages: the new run's stages (`Quickstart.stages`), whose fingerprints the source's records must match.
        options: the new run's `StudyOptions`.

    Raises:
        FileNotFoundError: `source` holds no `stages/` folder.
        ValueError: a stage to reuse did not finish in `source`, or ran there with other options (the message names
            the options that differ).
    """
    source, out = Path(source).resolve(), Path(out).resolve()
    if any((out / "stages").glob("*.json")):
        logger.info("%s holds a started run: resuming it, --start-from copies nothing", out)
        return []
    if not (source / "stages").is_dir():
        raise FileNotFoundError(f"--start-from {source}: no stages/ folder there; pass the --out folder of a "
                                f"verl-search study or quickstart run")
    by_name = {stage.name: stage for stage in stages}
    reused = [stage for stage in stages if stage.name in REUSED_STAGES]
    for stage in reused:
        record, wanted = read_record(source / "stages", stage.name), fingerprint(stage, by_name, options)
        if record is None or record.status != "done":
            raise ValueError(f"--start-from {source}: its stage {stage.name!r} did not finish; rerun that study's "
                             f"command to finish it first")
        recorded = with_legacy_options(record.fingerprint, wanted)
        if recorded != wanted:
            raise ValueError(f"--start-from {source}: its stage {stage.name!r} ran with other options "
                             f"({'; '.join(fingerprint_differences(recorded, wanted))}): pass the options it ran with")
    for stage in reused:
        for folder in REUSED_STAGES[stage.name]:
            _copy_tree(source / folder, out / folder)
    if _same_evaluation_options(source, by_name, options):
        for folder in REUSED_EVALUATIONS:
            _copy_tree(source / folder, out / folder)
    else:
        logger.info("--start-from %s: its evaluations ran with other options (or not at all); they run again", source)
    (out / "stages").mkdir(parents=True, exist_ok=True)
    for stage in reused:  # last: a copy interrupted before here is made again by a rerun
        shutil.copy2(source / "stages" / f"{stage.name}.json", out / "stages" / f"{stage.name}.json")
    names = [stage.name for stage in reused]
    logger.info("--start-from %s: copied the stages %s into %s", source, ", ".join(names), out)
    return names
