"""`verl-search index check`: what an index finds on a question set, and whether hybrid fusion costs recall there.

Hybrid retrieval pays only where BM25 and the dense encoder find different gold passages. Where one of them is
far ahead, every passage the other promotes into the top k risks one the better one had: on the shipped
`mini-wiki` questions BM25 finds the gold title of 2wiki questions in the top 5 for 0.956 of them and MiniLM for
0.695, and `serve`'s default fusion (RRF, k 60) finds it for 0.863 (docs/benchmarks/hybrid.md). Whether a corpus,
encoder and fusion suit each other is measured, not guessed: this check answers a question set with gold titles
through the index (for a hybrid index: its BM25 half, its dense half, and the fusion as `serve` would run it with
the given `HybridOptions`), reports gold-title hit@k per source (`eval.retrieval_quality.gold_title_recall`), and
warns for each source where the hybrid's hit@k is more than `tolerance` below the better half's, naming the half
to serve instead (`serve --retriever bm25|dense`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from verl_search.eval.retrieval_quality import gold_title_recall, load_qa_with_titles
from verl_search.retrieval.hybrid import HybridOptions
from verl_search.retrieval.loader import resolve_index

logger = logging.getLogger(__name__)

HALVES = ("bm25", "dense")


@dataclass
class IndexCheckOptions:
    """`index check` settings.

    Attributes:
        questions: a JSONL question set whose rows have `question`, `gold_titles` and `source` (`.gz` too), or a
            shipped set (`mini-wiki`, `mini-wiki:test`); default `mini-wiki`.
        k: the cut-off of the hit@k the warning compares (default 5; hit@1 is reported too).
        tolerance: a hybrid index is flagged on a source where its hit@k is below the better half's by more than
            this (default 0.01, a share of questions).

    Raises:
        ValueError: `k < 1` or `tolerance < 0`, naming the flag.
    """

    questions: str = field(default="mini-wiki", metadata={
        "help": "question set with gold_titles: a JSONL file or a shipped set (mini-wiki, mini-wiki:test)"})
    k: int = field(default=5, metadata={"help": "hit@k cut-off that the hybrid warning compares"})
    tolerance: float = field(default=0.01, metadata={
        "help": "warn where hybrid hit@k is below the better half's by more than this"})

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"--k must be >= 1, got {self.k}")
        if self.tolerance < 0:
            raise ValueError(f"--tolerance must be >= 0, got {self.tolerance}")


@dataclass
class IndexCheck:
    """What `check_index` measured.

    Attributes:
        reports: per retriever (`bm25`, `dense`, `hybrid`, or the index's one kind), `gold_title_recall`'s
            `{source: {"n", "hit@1", "hit@K", "recall@..."}}`.
        losses: for a hybrid index, one `(source, hybrid hit@k, better half, its hit@k)` per source (and `all`)
            where the hybrid is below the better half by more than the tolerance.
        k: the cut-off.
    """

    reports: dict[str, dict[str, dict[str, float]]]
    losses: list[tuple[str, float, str, float]]
    k: int

    def table(self) -> str:
        """A markdown table: one row per retriever, hit@1 and hit@k per source, `all` last."""
        sources = sorted({s for report in self.reports.values() for s in report} - {"all"}) + ["all"]
        n = next(iter(self.reports.values()))
        head = " | ".join(f"{s} ({n[s]['n']}) hit@1 / hit@{self.k}" for s in sources)
        lines = [f"| retriever | {head} |", "| --- |" + " --- |" * len(sources)]
        for name, report in self.reports.items():
            cells = " | ".join(f"{report[s]['hit@1']:.3f} / {report[s][f'hit@{self.k}']:.3f}" for s in sources)
            lines.append(f"| {name} | {cells} |")
        return "\n".join(lines)


def check_index(index: str | os.PathLike, options: IndexCheckOptions | None = None,
                hybrid: HybridOptions | None = None, corpus: str | None = None,
                encoder: str | None = None) -> IndexCheck:
    """Answer `options.questions` through `index` and compare a hybrid index with its halves.

    Args:
        index: an index folder (or a Search-R1 faiss file with `corpus` and `encoder`), as `serve --index`.
        options: the question set, cut-off and tolerance (default `IndexCheckOptions()`).
        hybrid: a hybrid index's fusion, as `serve` takes it (default `HybridOptions()`: what `serve` runs).
        corpus, encoder: as `serve --corpus/--encoder` (default: the manifest's).

    Returns:
        an `IndexCheck`; each loss is also logged as a warning naming the source, both numbers and the flag to
        serve the better half alone.

    Raises:
        as `resolve_index` and `load_qa_with_titles` (a missing file, a row without `gold_titles`).
    """
    options = options or IndexCheckOptions()
    rows = load_qa_with_titles(options.questions)
    spec = resolve_index(index, corpus=corpus, encoder=encoder)
    ks = tuple(sorted({1, options.k}))
    if spec.kind != "hybrid":
        return IndexCheck({spec.kind: gold_title_recall(spec.load(), rows, ks)}, [], options.k)
    spec.hybrid = hybrid or HybridOptions()
    fused = spec.load()  # a HybridRetriever: its halves are the BM25 and dense retrievers of the index
    retrievers = {"bm25": fused.sparse, "dense": fused.dense, "hybrid": fused}
    reports = {name: gold_title_recall(retriever, rows, ks) for name, retriever in retrievers.items()}
    key, losses = f"hit@{options.k}", []
    for source in sorted(reports["hybrid"], key=lambda name: (name == "all", name)):
        best = max(HALVES, key=lambda half: reports[half][source][key])
        ours, theirs = reports["hybrid"][source][key], reports[best][source][key]
        if ours < theirs - options.tolerance:
            losses.append((source, ours, best, theirs))
            logger.warning("hybrid fusion costs recall on %s: %s %.3f against %s alone %.3f (%d questions; "
                           "tolerance %.3f): serve this index with --retriever %s for such questions, or try "
                           "another fusion (--fusion, --rrf-k, --dense-weight, --fusion-candidates)",
                           source, key, ours, best, theirs, reports["hybrid"][source]["n"], options.tolerance, best)
    return IndexCheck(reports, losses, options.k)
