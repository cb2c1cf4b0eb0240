"""Gold-title hit@k of BM25, dense and hybrid retrieval on the mini corpus (prints numbers; not a test).

Builds (or reuses, under `--index-root`) the mini corpus's hybrid index: BM25 plus the MiniLM faiss
index, whose vectors are taken from `mini_dense_minilm` when that folder exists (`--from-faiss`,
no second encoding). Then answers every question of `mini_wiki/qa.jsonl` with the index's BM25
half, its dense half, and the fused retriever (RRF at each `--rrf-k`, and weighted fusion at each
`--dense-weight`), and prints `hit@1/3/5` per source (`eval.retrieval_quality.gold_title_recall`)
and the targets of issue 27 (hybrid hit@5 at least the better half on every source, above both
on all questions).

    python benchmarks/bench_hybrid_quality.py
    python benchmarks/bench_hybrid_quality.py --rrf-k 10 --rrf-k 60 --dense-weight 0.3 --fusion-candidates 100
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from verl_search.eval.retrieval_quality import gold_title_recall, load_qa_with_titles
from verl_search.retrieval.hybrid import HybridOptions, HybridRetriever
from verl_search.retrieval.loader import resolve_index

from bench_data import add_data_arguments, index_folder  # this folder: run as python benchmarks/...

SOURCES = ("hotpotqa", "musique", "2wiki", "all")


def half(index: Path, kind: str):
    """The `kind` (`bm25` / `dense`) half of a hybrid index, loaded."""
    spec = resolve_index(index)
    spec.select(kind)
    return spec.load()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--rrf-k", type=float, action="append", help="RRF constants to try (default: 60)")
    parser.add_argument("--dense-weight", type=float, action="append", default=[],
                        help="weighted fusion: dense weights to try (default: none)")
    parser.add_argument("--fusion-candidates", type=int, default=HybridOptions().fusion_candidates)
    args = parser.parse_args()

    rows = load_qa_with_titles(args.qa)
    index = index_folder(Path(args.index_root), "hybrid", args.corpus, args.encoder)
    bm25, dense = half(index, "bm25"), half(index, "dense")
    print(f"# gold-title hit@k on {args.qa}: {len(rows)} questions, hybrid index {index}, "
          f"{args.fusion_candidates} fusion candidates, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    runs = {"bm25": bm25, "dense": dense}
    for k in args.rrf_k or [HybridOptions().rrf_k]:
        runs[f"hybrid rrf k={k:g}"] = HybridRetriever(bm25, dense, HybridOptions(rrf_k=k, fusion_candidates=args.fusion_candidates))
    for weight in args.dense_weight:
        runs[f"hybrid weighted dense={weight:g}"] = HybridRetriever(
            bm25, dense, HybridOptions(fusion="weighted", dense_weight=weight, fusion_candidates=args.fusion_candidates))
    reports = {}
    print(f"\n| retriever | {' | '.join(f'{s} hit@5' for s in SOURCES)} | all hit@1 | all hit@3 | seconds |")
    print(f"| --- | {' | '.join('---' for _ in SOURCES)} | --- | --- | --- |")
    for name, retriever in runs.items():
        started = time.perf_counter()
        reports[name] = report = gold_title_recall(retriever, rows)
        seconds = time.perf_counter() - started
        cells = " | ".join(f"{report[s]['hit@5']:.3f}" for s in SOURCES)
        print(f"| {name} | {cells} | {report['all']['hit@1']:.3f} | {report['all']['hit@3']:.3f} | {seconds:.1f} |", flush=True)
    print("\n## issue 27 target: hybrid hit@5 >= max(bm25, dense) on every source, > both on all")
    for name in [n for n in runs if n.startswith("hybrid")]:
        verdicts = []
        for source in SOURCES:
            best = max(reports["bm25"][source]["hit@5"], reports["dense"][source]["hit@5"])
            ours = reports[name][source]["hit@5"]
            ok = ours > best if source == "all" else ours >= best
            verdicts.append(f"{source} {ours:.3f} vs {best:.3f} {'ok' if ok else 'MISSED'}")
        print(f"{name}: " + "; ".join(verdicts))
    print("\n" + json.dumps({n: {s: r[s] for s in SOURCES} for n, r in reports.items()}))


if __name__ == "__main__":
    main()
