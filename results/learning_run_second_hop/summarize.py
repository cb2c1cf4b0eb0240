"""Print the tables of README.md that the run's own report.md does not hold: this run's cold start (64 one-search and
32 second-search trajectories) against learning_run's (96 one-search; its first 64 are this one's), paired on the
320 test questions; each model's funnel (`verl_search.report.funnel`, from the kept `gold_in_top_k.json` here and
learning_run's searches replayed on the mini-wiki BM25 index); and what the second searches were: how many
questions searched twice, how many second queries name a page the first observation showed (a corpus title), and
on how many of those the gold became visible.

    python results/learning_run_second_hop/summarize.py [--index INDEX]

Without `--index`, the mini-wiki BM25 index is built in a temporary folder first, as the study's `index` stage
builds it (about 10 s).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from verl_search.report.compare import paired
from verl_search.report.funnel import funnel, funnel_table, gold_in_top_k, searched_queries
from verl_search.report.observations import gold_visible
from verl_search.report.records import read_trajectories
from verl_search.rewards.qa import answer_in_observation

HERE = Path(__file__).parent
_FAILS = importlib.util.spec_from_file_location("where_it_fails",
                                                HERE.parent / "learning_run_repeats" / "where_it_fails.py")
where_it_fails = importlib.util.module_from_spec(_FAILS)
_FAILS.loader.exec_module(where_it_fails)
FIRST = HERE.parent / "learning_run"
MODELS = {"learning_run's cold start (96 one-search)": FIRST / "eval" / "cold_start",
          "cold start (64 one-search + 32 second-search)": HERE / "eval" / "cold_start",
          "grpo": HERE / "eval" / "grpo", "grpo_control": HERE / "eval" / "grpo_control"}


def interval(c: dict) -> str:
    return f"{c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] ({c['better']} / {c['worse']})"


def second_searches(records: list[dict], titles: dict[str, str]) -> dict:
    """Questions searched twice or more; of those, second queries that name a page (a corpus title) the first
    observation showed; and questions whose gold no observation showed until the second search."""
    from verl_search.training.second_hop import named_titles

    twice = [r for r in records if len(searched_queries(r)) >= 2]
    named, found = 0, 0
    for r in twice:
        observations = [t["observation"] for t in r["turns"] if t.get("observation") and not t.get("search_failed")]
        second_query = searched_queries(r)[1]
        named += second_query.lower() in {t.lower() for t in named_titles(observations[0], titles, set())}
        found += not answer_in_observation(observations[0], r["golden_answers"]) and gold_visible(r)
    return {"n": len(records), "twice": len(twice), "named": named, "gold_after_second": found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, default=None, help="the study's BM25 index (default: built here)")
    args = parser.parse_args()
    from verl_search.training.second_hop import corpus_titles

    records = {name: list(read_trajectories(folder / "trajectories.jsonl").values()) for name, folder in MODELS.items()}
    with where_it_fails.mini_wiki_retriever(args.index) as retriever:
        replays = {name: gold_in_top_k(rows, retriever, 3) for name, rows in records.items()}
        titles = corpus_titles(retriever)
    kept = {name: json.loads((folder / "gold_in_top_k.json").read_text())["questions"]
            for name, folder in MODELS.items() if (folder / "gold_in_top_k.json").is_file()}
    differ = [name for name in kept if replays[name]["questions"] != kept[name]]
    if differ:
        raise RuntimeError(f"the replay on {args.index or 'the built index'} differs from the kept gold_in_top_k.json of {differ}: another index")
    names = list(MODELS)
    one, two = names[0], names[1]
    print("# The second-search cold start against the one-search one, and what GRPO did with it\n")
    print("## Cold start against cold start, the 320 test questions (paired bootstrap, 10,000 resamples)\n")
    print("| comparison | F1 | EM |\n| --- | --- | --- |")
    for a, b in [(one, two), (two, "grpo"), ("grpo_control", "grpo"), (one, "grpo")]:
        print(f"| {a} -> {b} | {interval(paired(records[a], records[b], 'f1', 10000, 0))} | "
              f"{interval(paired(records[a], records[b], 'em', 10000, 0))} |")
    print("\n## Where the answers were lost\n")
    print(funnel_table({name: funnel(records[name], replays[name]) for name in names}, replays))
    print("## Second searches\n\n| model | questions | searched twice | second query names a page the first observation "
          "showed | gold visible only after the second search |\n| --- | ---: | ---: | ---: | ---: |")
    for name in names:
        s = second_searches(records[name], titles)
        print(f"| {name} | {s['n']} | {s['twice']} | {s['named']} | {s['gold_after_second']} |")


if __name__ == "__main__":
    main()
