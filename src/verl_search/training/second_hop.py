"""Cold-start trajectories with a second search: the question's first search misses the gold, the first
observation names a page (a corpus title, as the model read it), and a search for that page shows the gold.

The study's report places most lost test questions at retrieval: one search with the question as the query puts
the gold in none of its passages, and every model searched exactly that once, since the cold start teaches only
that (`report.funnel`; results/learning_run_repeats/where_it_fails.md). These trajectories teach a second search
whose query the model can read off its first observation (`SECOND_SEARCH_TURN`): a skill that applies to new
questions, and that GRPO can then reward or not.

A question qualifies when, as the agent loop renders it (same tokenizer, same cut, `trajectories.trajectory_tokens`):

1. the gold is not visible in the first observation (`trajectories.gold_visible`);
2. a corpus title other than the first search's passages is named in that observation (whole words, normalised,
   `rewards.qa.answer_in_text`'s test; titles of 4 characters or more once normalised), tried in the order they
   appear, at most `MAX_CANDIDATES`;
3. with that title as the second query, the gold is visible in the second observation.

The page is chosen with the gold in hand (an oracle): the trajectory shows a second search that works, not how to
tell which named page will.
"""

from __future__ import annotations

import logging
import random

logger = logging.getLogger(__name__)

#: named pages tried per question, in the order the first observation names them
MAX_CANDIDATES = 5
#: titles shorter than this once normalised are not matched (initials, years and the like match everywhere)
MIN_TITLE_CHARS = 4


def corpus_titles(retriever) -> dict[str, str]:
    """Normalised title -> title (the first passage's spelling) of every passage of `retriever`'s corpus
    (`retriever.corpus`: a `retrieval.corpus.JsonlCorpus`, as BM25 and dense retrievers hold), titles shorter
    than `MIN_TITLE_CHARS` once normalised left out.

    Raises:
        ValueError: the retriever holds no corpus (a remote or hybrid one).
    """
    from verl_search.rewards.qa import normalize_answer

    corpus = getattr(retriever, "corpus", None)
    if corpus is None:
        raise ValueError(f"a second-hop cold start reads page titles from the index's corpus; a {retriever.kind!r} "
                         "retriever holds none: build a BM25 or dense index (`verl-search index build`)")
    titles: dict[str, str] = {}
    for row in range(len(corpus)):
        title = corpus.get(row).title
        key = normalize_answer(title)
        if len(key) >= MIN_TITLE_CHARS:
            titles.setdefault(key, title)
    return titles


def named_titles(text: str, titles: dict[str, str], leave_out: set[str]) -> list[str]:
    """The titles of `titles` (`corpus_titles`) named in `text` as whole normalised words, in order of first
    appearance, without those in `leave_out` (normalised or not).

    >>> named_titles("Born in Paris, France.", {"paris": "Paris", "france": "France", "pari": "Pari"}, {"France"})
    ['Paris']
    """
    from verl_search.rewards.qa import normalize_answer

    padded = f" {normalize_answer(text)} "
    skip = {normalize_answer(t) for t in leave_out}
    found = [(padded.find(f" {key} "), title) for key, title in titles.items()
             if key not in skip and f" {key} " in padded]
    return [title for _, title in sorted(found)]


def second_hop_rows(rows: list[dict], retriever, tokenizer, builder, *, topk: int, limit: int, seed: int,
                    titles: dict[str, str] | None = None, **settings) -> tuple[list[tuple], dict]:
    """`(row, hits, (query, second_hits))` for up to `limit` verl rows that qualify (module docstring), in a
    random order fixed by `seed`.

    Args:
        rows: verl rows of the `search_r1` protocol; retriever: the index (`search(queries, topk)`, and
            `corpus` unless `titles` is given).
        tokenizer, builder: the model's tokenizer and `cold_start.prompt_builder`.
        titles: `corpus_titles(retriever)` when computed already.
        settings: `trajectories.trajectory_tokens`' keyword arguments (`max_turns` at least 2).

    Returns `(chosen, counts)`: counts `{"rows": rows offered, "candidates": rows examined, "first_missed":
    those whose gold the first observation does not show, "named": of those, with a named page, "visible":
    chosen}`.
    """
    from verl_search.training.trajectories import gold_visible, observation_text, trajectory_tokens

    titles = corpus_titles(retriever) if titles is None else titles
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    chosen = []
    counts = {"rows": len(rows), "candidates": 0, "first_missed": 0, "named": 0, "visible": 0}
    for row, hits in zip(rows, retriever.search([row["extra_info"]["question"] for row in rows], topk)):
        if len(chosen) == limit:
            break
        counts["candidates"] += 1
        ids, mask = trajectory_tokens(row, hits, tokenizer, builder, **settings)
        if gold_visible(row, ids, mask, tokenizer):
            continue  # one search shows it: a one-hop trajectory (`cold_start.visible_rows`)
        counts["first_missed"] += 1
        named = named_titles(observation_text(ids, mask, tokenizer), titles,
                             {hit.passage.title for hit in hits})[:MAX_CANDIDATES]
        counts["named"] += bool(named)
        for query, second in zip(named, retriever.search(named, topk) if named else []):
            ids, mask = trajectory_tokens(row, hits, tokenizer, builder, second=(query, second), **settings)
            if gold_visible(row, ids, mask, tokenizer):
                chosen.append((row, hits, (query, second)))
                break
    counts["visible"] = len(chosen)
    logger.info("second-hop trajectories: %d of %d questions examined (%d not answered by the first search, %d of "
                "them naming a page)", len(chosen), counts["candidates"], counts["first_missed"], counts["named"])
    return chosen, counts
