"""The rows `verl-search eval` evaluates: JSONL inputs preprocessed, parquet rows as they are,
sampled per data source by the same function as preprocessing's `--max-per-source`."""

from __future__ import annotations

from verl_search.data.preprocess import Source, build_rows, sample_per_source


def row_id(row: dict) -> str:
    """A question's id in the output: `data_source/id`."""
    return f"{row['data_source']}/{row['extra_info']['id']}"


def select_rows(data: list[str], protocol: str, max_per_source: int | None, seed: int) -> list[dict]:
    """The verl rows to evaluate, `extra_info.index` renumbered 0..n-1.

    Args:
        data: `[NAME=]PATH` of FlashRAG JSONL (preprocessed with `protocol`) or verl parquet files.
        max_per_source, seed: see `verl_search.data.preprocess.sample_per_source`.

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
    for index, row in enumerate(rows):
        row["extra_info"] = {**row["extra_info"], "index": index}
    return rows
