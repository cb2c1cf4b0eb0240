"""Fusion choices for the hybrid index, compared on cached runs (prints numbers; not a test).

Answers every question of the QA set once with the hybrid index's BM25 half and its dense half
(`--depth` candidates each, cached as JSON under `--index-root`, so a second run costs no encoder
pass), then fuses the two cached rankings in every way of the grid below and scores gold-title
hit@5 per source (as `eval.retrieval_quality.gold_title_recall` does):

* candidate depth per retriever (`--depths`; the server's `--fusion-candidates`);
* RRF (Cormack et al. 2009) with `k` in `--rrf-ks`, and weighted RRF (the dense ranking's
  `1 / (k + rank)` times a weight below 1, BM25's times 1);
* weighted CombSUM and CombMNZ (Fox & Shaw 1994; Lee 1997) over per-query min-max or z-score
  normalised scores, `(1 - w) * bm25 + w * dense` (a row missing from one list takes that list's
  lowest normalised score; CombMNZ multiplies by the number of lists holding the row).

It prints the best settings by the issue-27 margin (hybrid minus the better retriever, worst
source) and by hit@5 on all questions, whether any setting meets the target on every source, and a
repeated 2-fold cross-validation (settings picked on one half of each source's questions, scored on
the other) that estimates what picking a fusion on these questions is worth on unseen ones.
With `--ranx` (`pip install ranx`) it also scores ranx's unweighted fusions at each depth.

    python benchmarks/bench_hybrid_fusion_grid.py
    python benchmarks/bench_hybrid_fusion_grid.py --ranx --depths 20
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from verl_search.eval.retrieval_quality import load_qa_with_titles
from verl_search.retrieval.hybrid import reciprocal_rank_fusion, weighted_score_fusion

from bench_hybrid_quality import SOURCES, half  # this folder: run as python benchmarks/...
from bench_retrieval_server import add_data_arguments, index_folder

PER_SOURCE = SOURCES[:-1]


def cached_runs(index: Path, rows: list[dict], depth: int, cache: Path) -> dict:
    """`{"bm25": [[[row, score], ...] per question], "dense": ..., "titles": {row: title}}`, from `cache`
    when it was written for the same index, questions and depth."""
    key = {"index": str(index), "questions": [row["question"] for row in rows], "depth": depth}
    if cache.is_file():
        stored = json.loads(cache.read_text())
        if stored["key"] == key:
            return stored
    runs: dict = {"key": key}
    questions = key["questions"]
    for kind in ("bm25", "dense"):
        retriever = half(index, kind)
        runs[kind] = [[[int(r), float(s)] for r, s in result]
                      for start in range(0, len(questions), 256)
                      for result in retriever.search_rows(questions[start:start + 256], depth)]
    rows_seen = {r for kind in ("bm25", "dense") for result in runs[kind] for r, _ in result}
    runs["titles"] = {str(r): retriever.corpus.get(r).title for r in sorted(rows_seen)}
    cache.write_text(json.dumps(runs))
    return runs


def weighted_rrf(bm25: list[int], dense: list[int], k: float, dense_weight: float) -> list[int]:
    """RRF with the dense ranking's terms scaled by `dense_weight` (1.0: the library's RRF)."""
    if dense_weight == 1.0:
        return [r for r, _ in reciprocal_rank_fusion([bm25, dense], k)]
    scores: dict[int, float] = defaultdict(float)
    for ranking, weight in ((bm25, 1.0), (dense, dense_weight)):
        for rank, row in enumerate(ranking, start=1):
            scores[row] += weight / (k + rank)
    order = list(dict.fromkeys(r for pair in zip(bm25, dense) for r in pair)) + bm25[len(dense):] + dense[len(bm25):]
    return sorted(dict.fromkeys(order), key=lambda r: -scores[r])


def comb(bm25: list, dense: list, how: str, w: float, mnz: bool) -> list[int]:
    """Weighted CombSUM (or CombMNZ) of per-query normalised scores; min-max CombSUM is the library's."""
    if how == "minmax" and not mnz:
        return [r for r, _ in weighted_score_fusion([bm25, dense], [1.0 - w, w])]
    normalised = []
    for result in (bm25, dense):
        scores = np.array([s for _, s in result], dtype=float)
        if how == "minmax":
            span = scores.max() - scores.min() if len(scores) else 0.0
            values = np.ones_like(scores) if span == 0 else (scores - scores.min()) / span
        else:
            values = (scores - scores.mean()) / (scores.std() or 1.0) if len(scores) else scores
        normalised.append(({r: float(v) for (r, _), v in zip(result, values)}, float(values.min()) if len(values) else 0.0))
    (nb, lowb), (nd, lowd) = normalised
    order = list(dict.fromkeys(r for pair in zip(bm25, dense) for r, _ in pair))
    order += [r for r, _ in bm25[len(dense):] + dense[len(bm25):]]
    fused = {r: (1 - w) * nb.get(r, lowb) + w * nd.get(r, lowd) for r in dict.fromkeys(order)}
    if mnz:
        fused = {r: s * ((r in nb) + (r in nd)) for r, s in fused.items()}
    return sorted(fused, key=lambda r: -fused[r])


def grid(depths, rrf_ks, rrf_weights, score_weights):
    """`{name: (depth, fuse(bm25 pairs, dense pairs) -> rows)}` for every setting."""
    settings = {}
    for depth in depths:
        for k in rrf_ks:
            for weight in rrf_weights:
                settings[f"RRF k={k:g} dense x{weight:g}, {depth} cand."] = (
                    depth, lambda b, d, k=k, weight=weight: weighted_rrf([r for r, _ in b], [r for r, _ in d], k, weight))
        for how in ("minmax", "zscore"):
            for mnz in (False, True):
                for w in score_weights:
                    settings[f"Comb{'MNZ' if mnz else 'SUM'} {how} dense {w:g}, {depth} cand."] = (
                        depth, lambda b, d, how=how, w=w, mnz=mnz: comb(b, d, how, w, mnz))
    return settings


def hit_vector(runs: dict, gold: list[set], fuse, depth: int) -> np.ndarray:
    titles = runs["titles"]
    return np.array([bool(g & {titles[str(r)] for r in fuse(b[:depth], d[:depth])[:5]})
                     for g, b, d in zip(gold, runs["bm25"], runs["dense"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--depth", type=int, default=100, help="candidates cached per retriever and question")
    parser.add_argument("--depths", default="5,10,20,50,100", help="fusion candidate depths to try (<= --depth)")
    parser.add_argument("--rrf-ks", default="0,2,5,10,20,60")
    parser.add_argument("--rrf-dense-weights", default="0.3,0.5,0.7,1")
    parser.add_argument("--score-dense-weights", default="0.1,0.2,0.3,0.4,0.5")
    parser.add_argument("--repeats", type=int, default=20, help="2-fold cross-validation repeats")
    parser.add_argument("--ranx", action="store_true", help="also score ranx's unweighted fusions (needs ranx)")
    args = parser.parse_args()
    floats = lambda text: [float(x) for x in text.split(",")]  # noqa: E731

    rows = load_qa_with_titles(args.qa)
    index = index_folder(Path(args.index_root), "hybrid", args.corpus, args.encoder)
    runs = cached_runs(index, rows, args.depth, Path(args.index_root) / f"mini_hybrid_runs_{args.depth}.json")
    gold = [set(row["gold_titles"]) for row in rows]
    source = np.array([row.get("source", "unknown") for row in rows])
    print(f"# {len(rows)} questions of {args.qa}, hybrid index {index}, {args.depth} cached candidates per retriever, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")

    hits = {"bm25": hit_vector(runs, gold, lambda b, d: [r for r, _ in b], 5),
            "dense": hit_vector(runs, gold, lambda b, d: [r for r, _ in d], 5)}
    settings = grid([int(x) for x in args.depths.split(",")], floats(args.rrf_ks), floats(args.rrf_dense_weights),
                    floats(args.score_dense_weights))
    for name, (depth, fuse) in settings.items():
        hits[name] = hit_vector(runs, gold, fuse, depth)

    def per_source(h, mask=None):
        mask = np.ones(len(h), bool) if mask is None else mask
        return {s: float(h[mask & (source == s)].mean()) for s in PER_SOURCE} | {"all": float(h[mask].mean())}

    def margin(name, mask=None):
        ours, b, d = per_source(hits[name], mask), per_source(hits["bm25"], mask), per_source(hits["dense"], mask)
        return min(ours[s] - max(b[s], d[s]) for s in SOURCES)

    full = {name: per_source(h) for name, h in hits.items()}
    fused = list(settings)
    meets = [n for n in fused if all(full[n][s] >= max(full["bm25"][s], full["dense"][s]) for s in PER_SOURCE)
             and full[n]["all"] > max(full["bm25"]["all"], full["dense"]["all"])]

    def table(names, title):
        print(f"\n{title}\n\n| setting | {' | '.join(f'{s} hit@5' for s in SOURCES)} | worst margin |")
        print(f"| --- | {' | '.join('---' for _ in SOURCES)} | --- |")
        for name in names:
            cells = " | ".join(f"{full[name][s]:.3f}" for s in SOURCES)
            print(f"| {name} | {cells} | {'' if name in ('bm25', 'dense') else f'{margin(name):+.3f}'} |")

    table(["bm25", "dense"] + sorted(fused, key=lambda n: (-margin(n), -full[n]["all"]))[:6],
          f"## {len(fused)} fusion settings: the best by worst margin (hybrid minus the better retriever, worst source)")
    table(sorted(fused, key=lambda n: -full[n]["all"])[:6], "## the best by hit@5 on all questions")
    print("\n## who finds a gold title in its top 5\n\n| source | both | BM25 only | dense only | neither |\n| --- | --- | --- | --- | --- |")
    for s in PER_SOURCE:
        b, d = hits["bm25"][source == s], hits["dense"][source == s]
        print(f"| {s} | {int((b & d).sum())} | {int((b & ~d).sum())} | {int((~b & d).sum())} | {int((~b & ~d).sum())} |")
    documented = ["RRF k=60 dense x1, 50 cand.", "RRF k=20 dense x1, 50 cand.", "CombSUM minmax dense 0.5, 50 cand.",
                  "CombSUM minmax dense 0.3, 50 cand."]
    table([n for n in documented if n in settings], "## serve's default (RRF k=60, 50 candidates) and weighted fusion")
    for family in ("RRF k=60 dense x1,", "CombSUM minmax", "CombSUM zscore", "CombMNZ minmax", "CombMNZ zscore"):
        members = [n for n in fused if n.startswith(family)]
        table(sorted(members, key=lambda n: (-margin(n), -full[n]["all"]))[:1], f"## best of {family.rstrip(',')}")
    print(f"\nsettings meeting the issue-27 target (>= the better retriever on every source, > both on all): "
          f"{meets or 'none'}")

    rng = np.random.default_rng(0)
    for criterion in ("worst margin", "all hit@5"):
        scores, picks = defaultdict(list), Counter()
        for _ in range(args.repeats):
            fold = np.zeros(len(rows), int)
            for s in PER_SOURCE:
                members = np.flatnonzero(source == s)
                rng.shuffle(members)
                fold[members[: len(members) // 2]] = 1
            held_out = np.zeros(len(rows), bool)
            for f in (0, 1):
                train = fold != f
                key = ((lambda n: (margin(n, train), per_source(hits[n], train)["all"])) if criterion == "worst margin"
                       else (lambda n: per_source(hits[n], train)["all"]))
                pick = max(fused, key=key)
                picks[pick] += 1
                held_out[fold == f] = hits[pick][fold == f]
            for s, value in per_source(held_out).items():
                scores[s].append(value)
        print(f"\n2-fold cross-validation x{args.repeats}, setting picked by {criterion} on the other half: "
              + "; ".join(f"{s} {np.mean(v):.3f} +- {np.std(v):.3f}" for s, v in scores.items())
              + f" (most picked: {picks.most_common(2)})")

    if args.ranx:
        from ranx import Run, fuse

        for depth in [int(x) for x in args.depths.split(",")]:
            ranx_runs = [Run({str(i): {str(r): s for r, s in result[:depth]} or {"-1": 0.0}
                              for i, result in enumerate(runs[kind])}, name=kind) for kind in ("bm25", "dense")]
            for method, norm in (("rrf", "min-max"), ("sum", "min-max"), ("sum", "zmuv"), ("mnz", "min-max"),
                                 ("mnz", "zmuv"), ("isr", "min-max"), ("bordafuse", "min-max"), ("condorcet", "min-max")):
                fused_run = fuse(runs=ranx_runs, norm=norm, method=method).to_dict()
                h = np.array([bool(g & {runs["titles"].get(doc, "") for doc, _ in
                                        sorted(fused_run.get(str(i), {}).items(), key=lambda kv: -kv[1])[:5]})
                              for i, g in enumerate(gold)])
                print(f"ranx {method} ({norm}), {depth} cand.: " + " ".join(f"{s} {v:.3f}" for s, v in per_source(h).items()))


if __name__ == "__main__":
    main()
