"""Hit rate of the query cache on recorded search traffic (prints numbers; not a test).

Reads the `queries` of every turn of a `verl-search eval` run's `trajectories.jsonl` (e.g. a run
over questions repeated n times at temperature 1, as GRPO's n rollouts of one question), replays
them, one `/retrieve` request per recorded search call, against a real server with the cache on
(`--cache-mb`) and prints searches, distinct normalised queries, and the share of queries the
cache answered (from `/health`), overall and per data source. With a cache large enough to hold
every answer (the default 256 MiB holds millions of top-3 answers of the mini corpus), the hit
count is `searches - distinct` whatever the order the rollouts ran in.

    python benchmarks/cache_hit_rate.py --trajectories runs/grpo5/trajectories.jsonl --index indexes/mini_bm25

`--rollouts DIR` reads a GRPO training run's rollouts instead: verl's `trainer.rollout_data_dir`
dumps (`STEP.jsonl`, one line per trajectory with its decoded `output`), every `<search>` the
policy wrote (the Search-R1 tag protocol), grouped by step.

    python benchmarks/cache_hit_rate.py --rollouts runs/learn/rollouts --index runs/learn/mini_bm25
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import httpx

from verl_search.server.cache import normalise_query
from verl_search.server.local import SubprocessServer


def recorded_searches(path: str) -> list[tuple[str, list[str]]]:
    """`(data_source, queries)` of every search call recorded in a trajectories file, in file order."""
    calls = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            for turn in record.get("turns", []):
                if turn.get("queries"):
                    calls.append((record.get("data_source", "?"), list(turn["queries"])))
    return calls


def rollout_searches(folder: str) -> list[tuple[str, list[str]]]:
    """`("step N", [query])` of every `<search>` in verl's rollout dumps under `folder`, step by step."""
    from verl_search.rewards.qa import strip_retrieved

    calls = []
    for dump in sorted(Path(folder).glob("*.jsonl"), key=lambda p: int(p.stem)):
        for line in dump.read_text(encoding="utf-8").splitlines():
            written = strip_retrieved(json.loads(line)["output"])  # retrieved text and fixed messages excluded
            calls += [(f"step {dump.stem}", [query.strip()]) for query in re.findall(r"<search>(.*?)</search>", written, re.S)]
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trajectories", help="trajectories.jsonl of a verl-search eval run")
    source.add_argument("--rollouts", help="verl's rollout_data_dir of a Search-R1-protocol training run")
    parser.add_argument("--index", required=True, help="index folder to serve")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--cache-mb", default="256")
    args = parser.parse_args()

    if args.rollouts:
        calls = rollout_searches(args.rollouts)
        rollouts = sum(len(p.read_text().splitlines()) for p in Path(args.rollouts).glob("*.jsonl"))
    else:
        calls = recorded_searches(args.trajectories)
        with open(args.trajectories, encoding="utf-8") as handle:
            rollouts = sum(1 for _ in handle)
    per_source: dict[str, list[str]] = defaultdict(list)
    for source, queries in calls:
        per_source[source].extend(normalise_query(q) for q in queries)
    with SubprocessServer(["--index", args.index, "--cache-mb", args.cache_mb]) as server, httpx.Client(timeout=60) as client:
        for _, queries in calls:
            client.post(f"{server.url}/retrieve", json={"queries": queries, "topk": args.topk}).raise_for_status()
        health = client.get(f"{server.url}/health").json()
    searched = health["cache_hits"] + health["cache_misses"]
    print(f"# {args.rollouts or args.trajectories}: {rollouts} rollouts, {len(calls)} search calls")
    print(f"queries {searched}, distinct {len(set(q for qs in per_source.values() for q in qs))}, "
          f"cache hits {health['cache_hits']} ({health['cache_hits'] / max(1, searched):.0%} never reached the retriever), "
          f"retriever queries {health['queries']}")
    for source, queries in sorted(per_source.items()):
        print(f"  {source}: queries {len(queries)}, distinct {len(set(queries))}, "
              f"repeat share {1 - len(set(queries)) / max(1, len(queries)):.0%}")


if __name__ == "__main__":
    main()
