"""Retrieval quality against gold passage titles (e.g. `mini_wiki/qa.jsonl`'s `gold_titles`).

Two numbers per `source` and cut-off k:

* `hit@k`: share of questions with at least one gold title among the top-k passage titles (the
  "top-k gold-title recall" quoted in `shared/MODELS.md`);
* `recall@k`: mean share of a question's gold titles found in the top-k (stricter for multi-hop
  questions, whose second-hop passage rarely matches the question's words).
"""

from __future__ import annotations

import os
from collections import defaultdict

from verl_search.datasets import read_questions
from verl_search.retrieval.base import Retriever


def load_qa_with_titles(spec: str | os.PathLike) -> list[dict]:
    """Rows of a question set that have `question` and a non-empty `gold_titles` list: a JSONL file
    (`.gz` too) or a shipped set (`mini-wiki`, `mini-wiki:test`; `verl_search.datasets.read_questions`).

    Raises:
        ValueError: on a line that is not JSON or a row that lacks those fields (names file and line).
    """
    rows = read_questions(spec)
    for number, row in enumerate(rows, start=1):
        if not isinstance(row.get("question"), str) or not row.get("gold_titles"):
            raise ValueError(f"{spec}: question {number} (id {row.get('id')!r}) needs a string 'question' and a "
                             "non-empty 'gold_titles' list")
    return rows


def gold_title_recall(
    retriever: Retriever, rows: list[dict], ks: tuple[int, ...] = (1, 3, 5), batch_size: int = 256
) -> dict[str, dict[str, float]]:
    """`hit@k` and `recall@k` per `source` (and `"all"`), over `rows` with `question`/`gold_titles`.

    Returns:
        `{source: {"n": count, "hit@1": ..., "recall@1": ..., ...}}`, values in [0, 1].
    """
    topk = max(ks)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        hits = retriever.search([row["question"] for row in batch], topk)
        for row, row_hits in zip(batch, hits):
            gold = set(row["gold_titles"])
            titles = [hit.passage.title for hit in row_hits]
            for source in (row.get("source", "unknown"), "all"):
                sums[source]["n"] += 1
                for k in ks:
                    found = gold & set(titles[:k])
                    sums[source][f"hit@{k}"] += 1.0 if found else 0.0
                    sums[source][f"recall@{k}"] += len(found) / len(gold)
    report = {}
    for source, totals in sums.items():
        n = totals["n"]
        report[source] = {"n": int(n), **{key: value / n for key, value in totals.items() if key != "n"}}
    return report
