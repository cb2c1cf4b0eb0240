"""The stages' bookkeeping: `Stage`, its record `stages/NAME.json` (`StageRecord`), the fingerprint that decides
whether a finished stage is skipped (`needs_run`), and `run_stages`, which runs a list of stages in order.

Resume: `stages/NAME.json` records a stage's fingerprint (the options its output depends on, and
its inputs' fingerprints), its status and its seconds. A finished stage with the same fingerprint
is skipped; an unfinished one is run again and resumes where it stopped (an evaluation skips the
questions already in its `trajectories.jsonl`; the SFT and GRPO trainers resume from their last
checkpoint, `trainer.resume_mode=auto`). A stage recorded with another fingerprint is refused
(`ValueError` naming the options that differ): its folder holds another run's output. A trainer's
checkpoint (`ckpt/`, optimizer state included) is removed once its stage is done, since later stages and
reruns read the merged `hf/` folder (`--keep-checkpoints` keeps it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from verl_search.quickstart.options import StudyOptions

logger = logging.getLogger(__name__)


@dataclass
class Stage:
    """One stage: `name`, the option fields its output depends on (`keys`), the stages whose output
    it reads (`needs`), `run()` (which may resume a partial output), and `checkpoints`: the trainer's
    checkpoint folder, which only an unfinished attempt resumes from (`run_stages` removes it once the
    stage is done, unless `--keep-checkpoints`)."""

    name: str
    keys: tuple[str, ...]
    needs: tuple[str, ...]
    run: Callable[[], None]
    checkpoints: Path | None = None


@dataclass
class StageRecord:
    """`stages/NAME.json`: `fingerprint`, `status` (`started` | `done`), `attempts`; over every attempt:
    wall `seconds` and `cpu_seconds` (user + system of this process and of the child processes it
    waited for, `cpu_seconds`); `load` (the 1-minute load average at the start and end of each attempt)."""

    fingerprint: dict
    status: str = "started"
    seconds: float = 0.0
    attempts: int = 0
    cpu_seconds: float = 0.0
    load: list = dataclasses.field(default_factory=list)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for (their
    own waited-for descendants included, as the kernel accounts them)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def fingerprint(stage: Stage, stages: dict[str, Stage], options: StudyOptions) -> dict:
    """The options `stage` depends on, with the fingerprints of the stages it `needs`."""
    values = dataclasses.asdict(options)
    return {"options": {k: values[k] for k in stage.keys},
            "needs": {name: fingerprint(stages[name], stages, options) for name in stage.needs if name in stages}}


LEGACY_OPTIONS = {"dtype": "float32", "sft_second_hop": 0}
"""Options added after run folders were made, with the value every folder made before had: a stage recorded
without one is read as having run with it (before `--dtype`, every stage computed in float32; before
`--sft-second-hop`, every cold start searched once)."""


def with_legacy_options(recorded: dict, current: dict) -> dict:
    """The fingerprint `recorded` with each `LEGACY_OPTIONS` key that `current` has and `recorded` lacks set to
    its legacy value, in the stage's options and in those of the stages it needs."""
    out = dict(recorded)
    if "options" in recorded:
        out["options"] = {**{k: v for k, v in LEGACY_OPTIONS.items() if k in current.get("options", {})},
                          **recorded["options"]}
    if "needs" in recorded:
        out["needs"] = {name: with_legacy_options(fp, current.get("needs", {}).get(name, {}))
                        for name, fp in recorded["needs"].items()}
    return out


def fingerprint_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """`"KEY: OLD then, NEW now"` for each value that differs between two fingerprints (nested keys dotted)."""
    out = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += fingerprint_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} then, {b!r} now")
    return out


def read_record(folder: Path, name: str) -> StageRecord | None:
    """The record of stage `name` under `folder` (`None` when the stage never started)."""
    path = folder / f"{name}.json"
    return StageRecord(**json.loads(path.read_text())) if path.is_file() else None


def write_record(folder: Path, name: str, record: StageRecord) -> None:
    """Write a stage's record atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.json.tmp"
    tmp.write_text(json.dumps(dataclasses.asdict(record), indent=1))
    tmp.replace(folder / f"{name}.json")


def needs_run(folder: Path, name: str, print_: dict) -> bool:
    """False when stage `name` finished with fingerprint `print_`; True when it never started or
    did not finish with it. A record made before an option existed has its `LEGACY_OPTIONS` value.

    Raises:
        ValueError: the stage was recorded with another fingerprint (the message lists the options
            that differ and says how to start afresh).
    """
    record = read_record(folder, name)
    if record is None:
        return True
    recorded = with_legacy_options(record.fingerprint, print_)
    if recorded != print_:
        changes = "; ".join(fingerprint_differences(recorded, print_))
        raise ValueError(f"stage {name!r} in {folder.parent} was run with other options ({changes}): pass another "
                         f"--out, or the same options as before")
    return record.status != "done"


def run_stages(stages: list[Stage], options: StudyOptions) -> dict[str, dict]:
    """Run `stages` in order, skipping finished ones; return per stage `{"seconds", "cpu_seconds",
    "load"}` over every attempt (`StageRecord`).

    Shows a stage bar (tqdm: stage k/n, elapsed, ETA); the stages show their own bars.
    """
    from tqdm.auto import tqdm

    folder = Path(options.out) / "stages"
    by_name = {stage.name: stage for stage in stages}
    timings = {}
    with tqdm(total=len(stages), desc="quickstart", unit="stage") as bar:
        for stage in stages:
            print_ = fingerprint(stage, by_name, options)
            bar.set_postfix_str(stage.name)
            if needs_run(folder, stage.name, print_):
                record = read_record(folder, stage.name) or StageRecord(print_)
                record.attempts += 1
                logger.info("stage %s: running (attempt %d)", stage.name, record.attempts)
                write_record(folder, stage.name, record)
                started, cpu, load = time.perf_counter(), cpu_seconds(), os.getloadavg()[0]
                try:
                    stage.run()
                    record.status = "done"
                finally:
                    record.seconds += time.perf_counter() - started
                    record.cpu_seconds += cpu_seconds() - cpu
                    record.load.append([round(load, 2), round(os.getloadavg()[0], 2)])
                    write_record(folder, stage.name, record)
                if stage.checkpoints is not None and not options.keep_checkpoints:
                    shutil.rmtree(stage.checkpoints, ignore_errors=True)  # the stage's hf/ is what later ones read
            else:
                logger.info("stage %s: done before, skipped", stage.name)
            record = read_record(folder, stage.name)
            timings[stage.name] = {"seconds": round(record.seconds, 1), "cpu_seconds": round(record.cpu_seconds, 1),
                                   "load": record.load}
            bar.update(1)
    return timings
