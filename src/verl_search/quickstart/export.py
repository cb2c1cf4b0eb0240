"""`--export`: the files of a quickstart run folder that back its report, copied without the index, checkpoints
or models (what `results/` keeps of a run, less the trimming its README describes)."""

from __future__ import annotations

from pathlib import Path

from verl_search.report.quickstart import CONTROL

#: what `export_run` keeps of a run folder: the report, every log and metrics file, the cold-start
#: summary and trajectories, each evaluation's trajectories and report, the stage records
KEPT = ("report.md", "report.json", "curves.png", "stages/*.json", "data/*.parquet", "data/grpo_questions.json",
        "cold_start/cold_start.json", "cold_start/trajectories.parquet", "cold_start/sft.log",
        "cold_start/metrics.jsonl", "grpo/train.log", "grpo/metrics.jsonl", "grpo/agent_loops.yaml",
        f"{CONTROL}/train.log", f"{CONTROL}/metrics.jsonl", "eval/*/trajectories.jsonl", "eval/*/report.*",
        "eval/*/gold_in_top_k.json",
        "eval/seconds.json")
#: files above this size are gzip-compressed in the export (`NAME.gz`)
COMPRESS_ABOVE = 1_000_000


def export_run(out: Path, dest: Path) -> list[Path]:
    """Copy the files of run folder `out` that back its report (`KEPT`, plus every GRPO step's
    rollouts, the control's too, about 26 KB per step of 4 x 4, which the report's per-step signal table reads) into
    `dest`, without the index, checkpoints or models; return the files written. Files over
    `COMPRESS_ABOVE` bytes are gzip-compressed."""
    import gzip
    import shutil

    rollouts = {p for run in ("grpo", CONTROL) for p in (out / run / "rollouts").glob("*.jsonl")}
    sources = sorted({p for pattern in KEPT for p in out.glob(pattern) if p.is_file()} | rollouts)
    written = []
    for source in sources:
        target = dest / source.relative_to(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.stat().st_size > COMPRESS_ABOVE:
            target = target.with_name(target.name + ".gz")
            with open(source, "rb") as src, gzip.open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(source, target)
        written.append(target)
    return written
