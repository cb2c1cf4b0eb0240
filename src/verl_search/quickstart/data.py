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


GRPO_QUESTIONS_PER_STEP = 16
"""Questions offered to GRPO per step and per question it trains on (`write_grpo_questions`: 2 steps of 2
questions draw from 64), room for DAPO's dynamic sampling to replace the groups it filters out."""


def write_grpo_questions(train_file: Path, index: Path, model: str, exclude: Path, out_file: Path, limit: int,
                         settings) -> dict:
    """Write to `out_file` up to `limit` training questions of `train_file` (verl rows) whose gold answer is
    visible in the observation of the cold start's search, exactly as the agent loop renders it
    (`training.cold_start.visible_rows`, same tokenizer, top-k and cut), leaving out the questions the cold start
    trained on (`exclude`: its `cold_start.json`); return `visible_rows`' counts with `"excluded"`. With the cold
    start's `second_hop`, a share of them as large as the cold start's (`second_hop / examples`) are questions
    whose gold a second search shows (`training.second_hop.second_hop_rows`, its counts in `"second_hop"`).

    These are the questions the cold-started model can answer from what it reads, and does not know by heart:
    on the kept runs' unfiltered GRPO groups 4 of 15 groups whose gold was visible carried a reward
    difference against 6 of 65 whose gold was not, so GRPO's dynamic sampling draws fewer groups for each
    one it trains on (docs/quickstart.md).

    Args:
        settings: the cold start's `training.cold_start.ColdStartOptions` (protocol limits, top-k, seed).

    Raises:
        ValueError: no training question qualifies.
    """
    import json

    from transformers import AutoTokenizer

    from verl_search.datasets.preprocess import write_parquet
    from verl_search.retrieval.loader import resolve_index
    from verl_search.training.cold_start import prompt_builder, read_rows, visible_rows

    trained = set(json.loads(Path(exclude).read_text())["questions"]) if Path(exclude).is_file() else set()
    rows = [row for row in read_rows(train_file) if row["extra_info"]["question"] not in trained]
    tokenizer = AutoTokenizer.from_pretrained(model)
    retriever, builder = resolve_index(index).load(), prompt_builder(model, tokenizer)
    trajectory = settings.trajectory_settings(tokenizer, model)
    two = round(limit * settings.second_hop / settings.examples) if settings.second_hop else 0
    chosen, counts = visible_rows(rows, retriever, tokenizer, builder, topk=settings.topk, limit=limit - two,
                                  seed=settings.seed + 1, **trajectory)
    if two:  # as many second-search questions as in the cold start, in proportion
        import random

        from verl_search.training.second_hop import second_hop_rows

        second, counts["second_hop"] = second_hop_rows(rows, retriever, tokenizer, builder, topk=settings.topk,
                                                       limit=two, seed=settings.seed + 1, **trajectory)
        chosen = chosen + second
        random.Random(settings.seed + 1).shuffle(chosen)
    if not chosen:
        raise ValueError(f"no training question of {train_file} has its gold answer visible in its "
                         f"{settings.max_obs_tokens}-token observation; raise --max-obs-tokens")
    write_parquet([row for row, *_ in chosen], out_file)
    counts["excluded"] = len(trained)
    logger.info("GRPO's questions: %d whose gold is visible in the observation (%d examined, %d cold-start "
                "questions left out), %d more after a second search", counts["visible"], counts["candidates"],
                len(trained), len(chosen) - counts["visible"])
    return counts
