"""Print where_it_fails.md: for the cold start, the five 8-step GRPO models and the four permuted-reward controls of
summarize.py, each question of the 320 at the first step it failed (`verl_search.report.funnel`: no search, the
gold in none of the full top-k passages, cut out of the observation, visible but answered wrong, visible and
right), the recorded queries replayed on the mini-wiki BM25 index the study builds; then, per GRPO model and
control, the sentences a study's report prints under that table ("Where the answers were lost"), against the cold
start and on the 101 questions whose gold the cold start saw. Last, for the questions the cold start lost at
retrieval, what other searches on the same index would have found: the same query's top 10, and one more search
per supporting page the top 3 missed (the page's title as the query: an oracle second hop, `gold_titles` of
`mini-wiki:test`).

    cd results/learning_run_repeats && python where_it_fails.py [--index INDEX] > where_it_fails.md

Without `--index`, the BM25 index of the packaged mini-wiki corpus is built in a temporary folder first (about
10 s), as the study's `index` stage builds it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import tempfile
from pathlib import Path

from verl_search.report.funnel import funnel, funnel_table, gold_in_top_k, searched_queries, step_of, where_it_fails
from verl_search.report.observations import seen_subset_comparisons

HERE = Path(__file__).parent
_SUMMARY = importlib.util.spec_from_file_location("learning_run_repeats_summarize", HERE / "summarize.py")
summary = importlib.util.module_from_spec(_SUMMARY)
_SUMMARY.loader.exec_module(summary)


def headroom(records: list[dict], replay: dict, retriever, topk: int) -> dict:
    """For the records lost at retrieval (`step_of` "not_retrieved"): how many have a supporting page (a gold
    title) among their first search's top `topk`, the gold in the same query's top 10, and the gold in the top
    `topk` of a search for a supporting page's title that the first search missed."""
    from verl_search.datasets import read_questions
    from verl_search.rewards.qa import answer_in_text

    titles = {row["id"]: set(row["gold_titles"]) for row in read_questions("mini-wiki:test")}
    lost = [r for r in records if step_of(r, replay["questions"].get(r["id"])) == "not_retrieved"]

    def shows(hits, golds) -> bool:
        return answer_in_text("\n".join(h.passage.contents for h in hits), golds)

    counts = {"lost": len(lost), "supporting_page_in_top_k": 0, "gold_in_top_10": 0, "gold_after_second_hop": 0}
    for record in lost:
        query, pages = searched_queries(record)[0], titles[record["id"].split("/", 1)[-1]]
        hits = retriever.search([query], 10)[0]
        found = {h.passage.title for h in hits[:topk]}
        counts["supporting_page_in_top_k"] += bool(pages & found)
        counts["gold_in_top_10"] += shows(hits, record["golden_answers"])
        counts["gold_after_second_hop"] += any(shows(hop, record["golden_answers"])
                                               for hop in retriever.search(sorted(pages - found), topk))
    return counts


@contextlib.contextmanager
def mini_wiki_retriever(index: Path | None):
    """The study's BM25 retriever over the packaged mini-wiki corpus: `index` loaded, or (None) built first in a
    temporary folder as the study's `index` stage builds it, removed on exit."""
    from verl_search.retrieval.loader import resolve_index

    with tempfile.TemporaryDirectory() as tmp:
        if index is None:
            from verl_search.quickstart.data import corpus_path
            from verl_search.retrieval.index_builder import BuildOptions, build_index

            index = Path(tmp) / "index"
            build_index(corpus_path(), index, BuildOptions(retriever="bm25", overwrite=True))
        yield resolve_index(index).load()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, default=None, help="the study's BM25 index (default: built here)")
    args = parser.parse_args()
    options = json.loads((summary.FIRST / "report.json").read_text())["meta"]["options"]
    with mini_wiki_retriever(args.index) as retriever:
        folders = {"cold_start": summary.FIRST / "eval" / "cold_start", **summary.MODELS, **summary.CONTROLS}
        records = {name: list(summary.records(folder).values()) for name, folder in folders.items()}
        replays = {name: gold_in_top_k(rows, retriever, options["topk"]) for name, rows in records.items()}
        more = headroom(records["cold_start"], replays["cold_start"], retriever, options["topk"])
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
    print(f"## What other searches would have found\n\nOf the {more['lost']} questions the cold start lost at "
          "retrieval, "
          f"its first search's top {options['topk']} held a supporting page (a gold title) for "
          f"{more['supporting_page_in_top_k']}; the same query's top 10 holds the gold for {more['gold_in_top_10']}; "
          f"one more search per supporting page it missed, with that page's title as the query (an oracle second "
          f"hop), puts the gold in the top {options['topk']} for {more['gold_after_second_hop']}.")


if __name__ == "__main__":
    main()
