"""The evaluation records the report reads: a `trajectories.jsonl` file (one JSON record per rollout, written by
`verl_search.eval.records.trajectory_record`) read by id, and the ids of sampled records (`QUESTION#k`).
Standard library only."""

from __future__ import annotations

import json
from pathlib import Path

SAMPLE_MARK = "#"
"""Separates a question's id from its sample number in the ids of repeated rows (`eval.rows.repeat_rows`)."""


def question_id(record_id: str) -> str:
    """The question a record's id belongs to: the id without its sample number.

    >>> question_id("nq/17#3"), question_id("nq/17")
    ('nq/17', 'nq/17')
    """
    return record_id.rsplit(SAMPLE_MARK, 1)[0]


def read_trajectories(path: Path) -> dict[str, dict]:
    """The records of a `trajectories.jsonl` by id (empty when the file does not exist; a later record of the
    same id replaces an earlier one)."""
    records = {}
    path = Path(path)
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["id"]] = record
    return records
