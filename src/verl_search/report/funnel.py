"""Where each evaluated question was lost on its way to a right answer: the search, retrieval, the
observation's cut, or extraction.

A question is placed at the first step it failed (`STEPS`):

1. `no_search`: the model never searched, or every search failed.
2. `not_retrieved`: it searched, but no gold alias is in the full top-k passages of any of its searches.
3. `cut`: a gold alias is in the full top-k passages, but not in what the model read (the agent loop cut the
   observation to `--max-obs-tokens`).
4. `misread`: the gold was visible in an observation, and the answer is not an exact match.
5. `right`: the gold was visible, and the answer is an exact match.

A right answer without the gold visible (a guess, most often one of the two options a question names) is
counted apart (`right_unseen`); its question stays at the step where the path to the gold broke.

"Visible" is `report.observations.gold_visible` (the agent loop's recorded observations). "In the full top-k
passages" cannot be read from the records, which keep only what the model read. `gold_in_top_k` replays the
recorded queries on the run's own index with the same top-k and applies the same whole-word check
(`rewards.qa.answer_in_text`) to the passages whole: their title lines and texts, which is what the search tool
renders before the cut, less the frame `answer_in_observation` leaves out. A gold the model saw counts as
retrieved. The replay also compares the top passage of every first search with the one recorded, which shows
whether the index is the one the run searched.
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_search.report.observations import gold_visible, top_title
from verl_search.rewards.qa import answer_in_text

#: the steps in the order a question passes them; a question is counted at the first one it failed
STEPS = ("no_search", "not_retrieved", "cut", "misread", "right")
#: the steps that lose a question, and the words the report uses for each
LOSSES = {"no_search": "searching (no search, or every search failed)",
          "not_retrieved": "retrieval (the gold in no top-k passage)",
          "cut": "the observation's cut (the gold retrieved, cut out of what the model read)",
          "misread": "extraction (the gold visible, the answer wrong)"}
#: the file `write_gold_in_top_k` writes beside each evaluation's `trajectories.jsonl`
FILE = "gold_in_top_k.json"


def searched_queries(record: dict) -> list[str]:
    """The queries of a record's searches that returned passages: turns with an observation that did not
    fail (`search_failed`), in turn order."""
    return [query for turn in record.get("turns") or [] if turn.get("observation") and not turn.get("search_failed")
            for query in turn.get("queries") or []]


def gold_in_top_k(records: list[dict], retriever, topk: int) -> dict:
    """Replay one evaluation's searches on `retriever` and say, per question, whether a gold alias is in the
    full top-`topk` passages of any of its searches.

    Args:
        records: `trajectories.jsonl` records (`verl_search.eval.records`).
        retriever: the index the run searched (`verl_search.retrieval.base.Retriever`: `search(queries, topk)`).
        topk: passages per search, as the run searched (`--topk`, default 3).

    Returns `{"topk", "searches": distinct queries replayed, "first_passages": first searches whose
    observation shows a top passage, "first_passage_matches": of those, how many the replay's top passage has
    the same title, "questions": {id: True | False | None (nothing searched)}}`.
    """
    queries = sorted({query for record in records for query in searched_queries(record)})
    hits = dict(zip(queries, retriever.search(queries, topk))) if queries else {}
    questions, shown, matches = {}, 0, 0
    for record in records:
        searched = searched_queries(record)
        questions[record["id"]] = any(answer_in_text("\n".join(h.passage.contents for h in hits[q]),
                                                     record["golden_answers"]) for q in searched) if searched else None
        recorded = top_title(record)
        if searched and recorded is not None:
            shown += 1
            replayed = hits[searched[0]]
            matches += bool(replayed) and replayed[0].passage.title == recorded
    return {"topk": topk, "searches": len(queries), "first_passages": shown, "first_passage_matches": matches,
            "questions": questions}


def write_gold_in_top_k(out: Path, index: Path, topk: int) -> dict[str, dict]:
    """`gold_in_top_k` for every evaluation of run folder `out` (`eval/NAME/trajectories.jsonl`), written to
    `eval/NAME/gold_in_top_k.json`; the index is loaded once (`retrieval.loader.resolve_index`).

    Returns model name -> what was written. Raises FileNotFoundError: `index` is not an index folder.
    """
    from verl_search.report.records import read_trajectories
    from verl_search.retrieval.loader import resolve_index

    paths = sorted(Path(out).glob("eval/*/trajectories.jsonl"))
    if not paths:
        return {}
    retriever = resolve_index(index).load()
    written = {}
    for path in paths:
        written[path.parent.name] = gold_in_top_k(list(read_trajectories(path).values()), retriever, topk)
        (path.parent / FILE).write_text(json.dumps(written[path.parent.name], indent=1), encoding="utf-8")
    return written


def read_gold_in_top_k(out: Path, models) -> dict[str, dict]:
    """The `gold_in_top_k.json` of each of `models` under `out/eval/` that has one."""
    paths = {model: Path(out) / "eval" / model / FILE for model in models}
    return {model: json.loads(path.read_text(encoding="utf-8")) for model, path in paths.items() if path.is_file()}


def step_of(record: dict, retrieved: bool | None) -> str:
    """The step of `STEPS` a record stopped at; `retrieved`: its `gold_in_top_k` answer."""
    if not searched_queries(record):
        return "no_search"
    if gold_visible(record):
        return "right" if record["em"] else "misread"
    return "cut" if retrieved else "not_retrieved"


def funnel(records: list[dict], replay: dict) -> dict:
    """One model's funnel: `{"n", STEP: questions stopped there, for each of `STEPS`, "right_unseen": right
    answers (EM) without the gold visible, "lost_most": the losing step with the most questions (ties: the
    earlier step)}`. `replay`: the model's `gold_in_top_k` output (questions missing from it count as not
    retrieved).

    Raises:
        ValueError: `records` is empty.
    """
    if not records:
        raise ValueError("funnel needs the records of an evaluation, got none")
    steps = [step_of(r, replay["questions"].get(r["id"])) for r in records]
    counts = {"n": len(records), **{step: steps.count(step) for step in STEPS}}
    counts["right_unseen"] = sum(bool(r["em"]) for r, s in zip(records, steps) if s not in ("misread", "right"))
    counts["lost_most"] = max(LOSSES, key=lambda step: (counts[step], -STEPS.index(step)))
    return counts


def same_queries(start: list[dict], other: list[dict]) -> int:
    """Questions (matched by id) on which `other` searched exactly the queries `start` searched."""
    queries = {r["id"]: searched_queries(r) for r in start}
    return sum(r["id"] in queries and searched_queries(r) == queries[r["id"]] for r in other)


def funnel_table(funnels: dict[str, dict], replays: dict[str, dict]) -> str:
    """Markdown: one row per model (`funnels`: model -> `funnel`; `replays`: model -> `gold_in_top_k`)."""
    lines = ["| model | n | no search | gold not in top-k | gold cut out | gold visible, wrong | gold visible, right | "
             "right, gold not visible | lost most at | replay: same top passage |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for model, f in funnels.items():
        replay = replays[model]
        lines.append(f"| {model} | {f['n']} | {f['no_search']} | {f['not_retrieved']} | {f['cut']} | {f['misread']} | "
                     f"{f['right']} | {f['right_unseen']} | {f['lost_most']} | "
                     f"{replay['first_passage_matches']} of {replay['first_passages']} |")
    return "\n".join(lines) + "\n"


def _interval(comparison: dict | None) -> str:
    if not comparison:
        return ""
    low, high = comparison["ci95"]
    verdict = "above 0" if low > 0 else "below 0" if high < 0 else "including 0"
    return f"{comparison['mean_diff']:+.3f} [{low:+.3f}, {high:+.3f}], {verdict}"


def where_it_fails(funnels: dict[str, dict], records: dict[str, list[dict]], start: str | None,
                   seen_subset: dict | None) -> list[str]:
    """The sentences under the funnel table, each computed from it: where the start model loses most
    questions, and for every trained model after it (GRPO, the control) whether its searches were the start's,
    how each step's count moved, and its F1 on the questions whose gold the start saw (`seen_subset`'s F1
    comparisons into the model: from the start, from the control; there only extraction can change the answer
    when the searches are the start's)."""
    if not start or start not in funnels:
        return []
    f = funnels[start]
    lines = [f"- {start} loses most questions at {LOSSES[f['lost_most']]}: {f[f['lost_most']]} of {f['n']}; "
             f"{f['right']} reach a right answer with the gold visible, {f['right_unseen']} more without it."]
    comparisons = (seen_subset or {}).get("comparisons", {})
    for model in [m for m in funnels if m != start and list(funnels).index(m) > list(funnels).index(start)]:
        g, same = funnels[model], same_queries(records[start], records[model])
        moved = ", ".join(f"{step.replace('_', ' ')} {f[step]} -> {g[step]}" for step in STEPS)
        seen = "; ".join(f"{key.removesuffix(': f1')} {_interval(comparisons[key])}" for key in comparisons
                         if key.endswith(f" -> {model}: f1"))
        lines.append(f"- {model} searched exactly {start}'s queries on {same} of {g['n']} questions, so its retrieval "
                     f"and cut can differ from {start}'s on {g['n'] - same} questions at most; by step: {moved}."
                     + (f" On the {seen_subset['n']} questions whose gold {start} saw, F1 {seen}." if seen else ""))
    return lines


def funnel_section(records: dict[str, list[dict]], replays: dict[str, dict], start: str | None,
                   seen_subset: dict | None) -> tuple[dict, str]:
    """`({model: funnel}, markdown)` of the report's section "Where the answers were lost"; models without a
    replay (`gold_in_top_k.json`) are left out, and without any the section says how to make them."""
    funnels = {model: funnel(rows, replays[model]) for model, rows in records.items() if rows and model in replays}
    lines = ["## Where the answers were lost", ""]
    if not funnels:
        return {}, "\n".join(lines + ["Not replayed: no evaluation has its `gold_in_top_k.json` (rerender the report "
                                      "with the run's index: `python -m verl_search.report.quickstart RUN --index "
                                      "INDEX`).", ""])
    topk = next(iter(replays.values()))["topk"]
    lines += [f"Each question at the first step it failed (`verl_search.report.funnel`): no search; the gold in none "
              f"of the full top-{topk} passages of its searches (the recorded queries replayed on the run's index); "
              "retrieved but cut out of what the model read; visible but answered wrong (EM); visible and right. "
              "Right answers without the gold visible are counted apart. The last column compares the replay's top "
              "passage with the recorded one, first searches only.", "", funnel_table(funnels, replays),
              *where_it_fails(funnels, records, start, seen_subset), ""]
    return funnels, "\n".join(lines)
