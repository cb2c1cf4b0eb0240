"""Print where_it_fails.md: for the cold start, the five 8-step GRPO models and the four permuted-reward controls of
summarize.py, each question of the 320 at the first step it failed (`verl_search.report.funnel`: no search, the
gold in none of the full top-k passages, cut out of the observation, visible but answered wrong, visible and
right), the recorded queries replayed on the mini-wiki BM25 index the study builds; then, per GRPO model and
control, the sentences a study's report prints under that table ("Where the answers were lost"), against the cold
start and on the 101 questions whose gold the cold start saw.

    python results/learning_run_repeats/where_it_fails.py [--index INDEX] > results/learning_run_repeats/where_it_fails.md

Without `--index`, the BM25 index of the packaged mini-wiki corpus is built in a temporary folder first (about
10 s), as the study's `index` stage builds it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

from verl_search.report.funnel import funnel, funnel_table, gold_in_top_k, where_it_fails
from verl_search.report.observations import seen_subset_comparisons

HERE = Path(__file__).parent
_SUMMARY = importlib.util.spec_from_file_location("learning_run_repeats_summarize", HERE / "summarize.py")
summary = importlib.util.module_from_spec(_SUMMARY)
_SUMMARY.loader.exec_module(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, default=None, help="the study's BM25 index (default: built here)")
    args = parser.parse_args()
    from verl_search.retrieval.loader import resolve_index

    options = json.loads((summary.FIRST / "report.json").read_text())["meta"]["options"]
    with tempfile.TemporaryDirectory() as tmp:
        index = args.index
        if index is None:
            from verl_search.quickstart.data import corpus_path
            from verl_search.retrieval.index_builder import BuildOptions, build_index

            index = Path(tmp) / "index"
            build_index(corpus_path(), index, BuildOptions(retriever="bm25", overwrite=True))
        retriever = resolve_index(index).load()
        folders = {"cold_start": summary.FIRST / "eval" / "cold_start", **summary.MODELS, **summary.CONTROLS}
        records = {name: list(summary.records(folder).values()) for name, folder in folders.items()}
        replays = {name: gold_in_top_k(rows, retriever, options["topk"]) for name, rows in records.items()}
    funnels = {name: funnel(rows, replays[name]) for name, rows in records.items()}
    print("# Where the answers were lost: the cold start, five GRPO runs and four controls\n")
    print(f"`python results/learning_run_repeats/where_it_fails.py` (top-{options['topk']}, observations cut to "
          f"{options['max_obs_tokens']} tokens; `verl_search.report.funnel`; the columns as in a study's report).\n")
    print(funnel_table(funnels, replays))
    for name in [*summary.MODELS, *summary.CONTROLS]:
        pair = {"cold_start": records["cold_start"], name: records[name]}
        subset = seen_subset_comparisons(pair, "cold_start", [("cold_start", name)], 10000, 0)
        lines = where_it_fails({"cold_start": funnels["cold_start"], name: funnels[name]}, pair, "cold_start", subset)
        print(f"## {name}\n\n" + "\n".join(lines[1:] if name != next(iter(summary.MODELS)) else lines) + "\n")


if __name__ == "__main__":
    main()
