"""The quickstart's questions and corpus: the shipped `mini-wiki` dataset and its fixed split
(`verl_search.datasets`), as verl rows of a tag protocol (Search-R1's by default, or ReSearch's)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

logger = logging.getLogger(__name__)

DATASET = "mini-wiki"


def corpus_path() -> Path:
    """The mini corpus file shipped in the package."""
    from verl_search.datasets import resolve_corpus

    return resolve_corpus(DATASET)


def split_rows(split: str, questions: int | None = None, seed: int = 0, protocol: str = "search_r1") -> list[dict]:
    """verl rows (of `protocol`, default `search_r1`) of `mini-wiki:SPLIT`, `extra_info.index` numbering them.

    Args:
        split: `train` or `test`.
        questions: keep about this many, spread evenly over the data sources (`ceil(questions /
            sources)` per source, a sample fixed by `seed`; a smaller source gives all it has, with a
            warning naming it);
            `None` keeps all.

    Raises:
        ValueError: an unknown split.
    """
    from verl_search.datasets.preprocess import make_row, sample_per_source
    from verl_search.datasets import read_questions

    by_source: dict[str, list[dict]] = {}
    for example in read_questions(f"{DATASET}:{split}"):
        by_source.setdefault(example["source"], []).append(example)
    per_source = None if questions is None else max(1, math.ceil(questions / len(by_source)))
    rows: list[dict] = []
    for source in sorted(by_source):
        if per_source is not None and len(by_source[source]) < per_source:
            logger.warning("%s:%s holds %d %s questions, fewer than the %d per source that %d questions ask for: "
                           "all %d are used", DATASET, split, len(by_source[source]), source, per_source, questions,
                           len(by_source[source]))
        for example in sample_per_source(by_source[source], source, per_source, seed):
            rows.append(make_row(example, len(rows), split, source, protocol))
    return rows


def write_split(train_file: Path, test_file: Path, test_questions: int | None, seed: int = 0,
                protocol: str = "search_r1") -> None:
    """Write `mini-wiki:train` (every question) to `train_file` and about `test_questions` of
    `mini-wiki:test` to `test_file` as verl parquet files (`split_rows`)."""
    from verl_search.datasets.preprocess import write_parquet

    write_parquet(split_rows("train", seed=seed, protocol=protocol), train_file)
    write_parquet(split_rows("test", test_questions, seed, protocol), test_file)
