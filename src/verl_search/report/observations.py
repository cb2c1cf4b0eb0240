"""What a model saw and what it did with it, per evaluated question (`trajectories.jsonl` records,
`verl_search.eval.records`): whether a gold answer was visible in its observations, the top passage of its
first search, how it searched; and the conditional metrics the quickstart's report shows per model.

A model cannot extract an answer its observations do not hold: with `--max-obs-tokens 160` most observations
are cut, and the share of questions whose gold is visible bounds what better extraction can win (the
"gold visible" ceiling). EM and F1 split by visibility say which step fails: retrieval and the cut (gold not
visible) or extraction (gold visible, answer wrong). Visibility is `rewards.qa.answer_in_observation` on the
observation text the agent loop recorded (its decoded observation tokens): the check the cold start selects
its trajectories by (`verl_search.training.trajectories.gold_visible`).
"""

from __future__ import annotations

import re

from verl_search.report.compare import paired
from verl_search.rewards.qa import answer_in_observation, exact_match, f1_score, normalize_answer

_SEARCH_R1_TITLE = re.compile(r'Doc 1\(Title: (?:"(?P<quoted>[^\n]*?)"(?=\)|, id: )|(?P<plain>[^\n]*?)(?=\)|, id: ))')
_RESULT_TITLE = re.compile(r"<result>\s*\n(?P<line>[^\n]*)")
_IRCOT_TITLE = re.compile(r"\AWikipedia Title: (?P<line>[^\n]*)\n")


def observations(record: dict) -> list[str]:
    """The observations a record's model read, in turn order (`turns[].observation`; turns without one left out)."""
    return [turn["observation"] for turn in record.get("turns") or [] if turn.get("observation")]


def gold_visible(record: dict) -> bool:
    """Whether a gold answer (`golden_answers`) is visible in any observation of the record
    (`rewards.qa.answer_in_observation`).

    >>> gold_visible({"golden_answers": ["Paris"], "turns": [{"observation": "<information>Doc 1(Title: "
    ...               "\\"France\\") Its capital is Paris.</information>"}]})
    True
    """
    return any(answer_in_observation(text, record["golden_answers"]) for text in observations(record))


def passage_title(observation: str) -> str | None:
    """The title of the first passage of an observation: Search-R1's `Doc 1(Title: "T") ...` (its quotes
    dropped), the first line of ReSearch's `<result>` block (`"T"`, quotes dropped) or IRCoT's first
    `Wikipedia Title: T` line (`agent_protocol.ircot.PASSAGE_TEMPLATE`, quotes dropped); None for anything else (a
    failed search, the correction message).

    >>> passage_title('\\n\\n<information>Doc 1(Title: "Jaws (film)") Jaws is a 1975 film.</information>')
    'Jaws (film)'
    >>> passage_title(' <result>\\n"Jaws"\\nJaws is a 1975 film.\\n</result>'), passage_title("search failed: 503")
    ('Jaws', None)
    >>> passage_title('Wikipedia Title: "Jaws"\\nJaws is a 1975 film.\\n\\n')
    'Jaws'
    """
    match = _SEARCH_R1_TITLE.search(observation)
    if match:
        return (match["quoted"] if match["quoted"] is not None else match["plain"]).strip()
    match = _RESULT_TITLE.search(observation)
    if match and match["line"].strip() and "</result>" not in match["line"]:
        return match["line"].strip().strip('"').strip()
    match = _IRCOT_TITLE.search(observation)
    if match and match["line"].strip():
        return match["line"].strip().strip('"').strip()
    return None


def top_title(record: dict) -> str | None:
    """The title of the top passage of the record's first search (the observation of its first turn with a
    query; `passage_title`), or None: no search, or its observation shows no passage."""
    for turn in record.get("turns") or []:
        if turn.get("queries") and turn.get("observation"):
            return passage_title(turn["observation"])
    return None


def _scores(records: list[dict]) -> dict:
    n = len(records)
    return {"n": n, "em": sum(r["em"] for r in records) / n if n else None,
            "f1": sum(r["f1"] for r in records) / n if n else None}


def conditional_metrics(records: list[dict]) -> dict:
    """One model's conditional metrics over its evaluation records.

    Returns `{"n", "gold_visible" (share of questions whose gold is visible in an observation, 0..1),
    "visible" / "not_visible": {"n", "em", "f1"} (EM and F1 of those questions; `None` where n is 0),
    "searches_per_question" (mean `num_searches`), "queries" (queries searched: those of turns with an
    observation), "queries_differ" (share of them that differ from the question text once normalised,
    `rewards.qa.normalize_answer`; `None` without queries), "second_search" (share of questions with two
    searches or more), "top_title": {"n" (questions whose first search showed a passage), "em", "f1"}
    (answering every question with the title of the top passage of its first search, `top_title`; no title
    scores 0)}`.

    Raises:
        ValueError: `records` is empty.
    """
    if not records:
        raise ValueError("conditional_metrics needs the records of an evaluation, got none")
    n = len(records)
    visible = [gold_visible(r) for r in records]
    queries = [(q, r["question"] or "") for r in records for turn in r.get("turns") or [] if turn.get("observation")
               for q in turn.get("queries", [])]  # a turn without an observation searched nothing
    differ = sum(normalize_answer(q) != normalize_answer(question) for q, question in queries)
    titles = [(top_title(r), r["golden_answers"]) for r in records]
    return {
        "n": n, "gold_visible": sum(visible) / n,
        "visible": _scores([r for r, v in zip(records, visible) if v]),
        "not_visible": _scores([r for r, v in zip(records, visible) if not v]),
        "searches_per_question": sum(r["num_searches"] for r in records) / n,
        "queries": len(queries), "queries_differ": differ / len(queries) if queries else None,
        "second_search": sum(r["num_searches"] >= 2 for r in records) / n,
        "top_title": {"n": sum(t is not None for t, _ in titles),
                      "em": sum(exact_match(t, g) for t, g in titles if t is not None) / n,
                      "f1": sum(f1_score(t, g) for t, g in titles if t is not None) / n},
    }


def seen_subset_comparisons(records: dict[str, list[dict]], seen_by: str, pairs: list[tuple[str, str]],
                            samples: int, seed: int) -> dict:
    """Paired comparisons on the fixed subset of questions whose gold answer is visible in `seen_by`'s own
    observations (`gold_visible` on its records): where a better reader of what the start model retrieved could
    gain. A gain of GRPO's over the start (and over its control) on them is better reading learned; on the other
    questions retrieval or the observation's cut stands in the way.

    Args:
        records: model name -> its evaluation records (the same questions). seen_by: the model whose
            observations fix the subset (the start of GRPO). pairs: `(a, b)` model names, compared `a -> b`.
        samples, seed: of the paired bootstrap (`compare.paired`).

    Returns `{"model": seen_by, "n": questions in the subset, "comparisons": {"a -> b: em|f1": paired(...)}}`;
    `comparisons` is empty when the subset is.
    """
    ids = {r["id"] for r in records[seen_by] if gold_visible(r)}
    comparisons = {f"{a} -> {b}: {key}": paired(records[a], records[b], key, samples, seed, only=ids)
                   for a, b in pairs for key in ("em", "f1")} if ids else {}
    return {"model": seen_by, "n": len(ids), "comparisons": comparisons}


def _pair(cell: dict) -> str:
    return "-" if not cell["n"] else f"{cell['em']:.3f} / {cell['f1']:.3f} ({cell['n']})"


def conditional_table(metrics: dict[str, dict]) -> str:
    """Markdown: one row per model (`metrics`: model name -> `conditional_metrics`)."""
    lines = ["| model | gold visible | EM / F1 (n), gold visible | EM / F1 (n), gold not visible | searches/q | "
             "queries ≠ question | second search | top-title answer EM / F1 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model, m in metrics.items():
        differ = "-" if m["queries_differ"] is None else f"{m['queries_differ']:.2f} of {m['queries']}"
        lines.append(f"| {model} | {m['gold_visible']:.3f} | {_pair(m['visible'])} | {_pair(m['not_visible'])} | "
                     f"{m['searches_per_question']:.2f} | {differ} | {m['second_search']:.2f} | "
                     f"{m['top_title']['em']:.3f} / {m['top_title']['f1']:.3f} |")
    return "\n".join(lines) + "\n"
