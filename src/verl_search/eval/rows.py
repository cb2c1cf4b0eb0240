"""The rows `verl-search eval` evaluates: JSONL inputs preprocessed, parquet rows as they are,
sampled per data source by the same function as preprocessing's `--max-per-source`."""

from __future__ import annotations

from verl_search.datasets.preprocess import Source, build_rows, sample_per_source
from verl_search.report.records import SAMPLE_MARK


def row_id(row: dict) -> str:
    """A question's id in the output: `data_source/id` (`data_source/id#k` for sample k, `repeat_rows`)."""
    return f"{row['data_source']}/{row['extra_info']['id']}"



def repeat_rows(rows: list[dict], samples: int) -> list[dict]:
    """Each row `samples` times, sample k's `extra_info.id` suffixed `#k` (1: the rows as they are)."""
    if samples == 1:
        return rows
    return [{**row, "extra_info": {**row["extra_info"], "id": f"{row['extra_info']['id']}{SAMPLE_MARK}{k}"}}
            for row in rows for k in range(samples)]


def select_rows(data: list[str], protocol: str, max_per_source: int | None, seed: int,
                samples: int = 1) -> list[dict]:
    """The verl rows to evaluate, `extra_info.index` renumbered 0..n-1.

    Args:
        data: `[NAME=]PATH` of FlashRAG JSONL (preprocessed with `protocol`) or verl parquet files.
        max_per_source, seed: see `verl_search.datasets.preprocess.sample_per_source`.
        samples: rows per question (`repeat_rows`).

    Raises:
        FileNotFoundError: an input does not exist.
        RowError: a malformed JSONL row (file and line named).
    """
    rows: list[dict] = []
    for spec in data:
        source = Source.parse(spec)
        if not source.path.is_file():
            raise FileNotFoundError(f"data file {source.path} does not exist")
        if source.path.suffix == ".parquet":
            import pandas as pd

            groups: dict[str, list[dict]] = {}
            for row in pd.read_parquet(source.path).to_dict("records"):
                groups.setdefault(row["data_source"], []).append(row)
            for name, group in groups.items():
                rows += sample_per_source(group, name, max_per_source, seed)
        else:
            rows += build_rows([source], "test", protocol, max_per_source, seed)
    rows = repeat_rows(rows, samples)
    for index, row in enumerate(rows):
        row["extra_info"] = {**row["extra_info"], "index": index}
    return rows
