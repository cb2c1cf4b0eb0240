"""Baselines that know nothing, and results by question shape: what a model's score must beat before it counts.

Multi-hop QA sets hold many comparison questions that name their two candidate answers ("Which film came out
first, X or Y?", 2WikiMultiHopQA's and HotpotQA's comparison type): a policy that always names one position
scores about half of them without reading anything, and RL can learn such a bias from a train split whose gold
is more often in one position. Every report therefore shows, beside each model:

* the baselines: always the first-named option, always the last-named option (two-option questions; no answer
  elsewhere), the most frequent gold answer of the training questions (every question), and the title of the top
  passage of a model's first search (`observations.top_title`: what a reader that never reads past the title
  scores with the same retriever);
* the ceiling "gold visible": the share of questions whose gold answer is visible in that model's observations
  (`observations.gold_visible`), the most a perfect extraction from what it saw could answer;
* each model's EM and F1 by question shape (`two_option`, `yes_no`, `open`) and, on two-option questions, the
  share of its answers that name the first option, the last option or neither.

A model's gain on a shape counts only above the best baseline there.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from verl_search.rewards.qa import exact_match, f1_score, normalize_answer

SHAPES = ("two_option", "yes_no", "open")
"""Question shapes, in report order."""
_TWO_OPTIONS = re.compile(r",\s*(?:the\s+)?(?P<first>[^,?]+?)\s+or\s+(?:the\s+)?(?P<last>[^,?]+?)\s*\?\s*$", re.I)
_YES_NO = re.compile(r"^(?:is|are|was|were|do|does|did|can|could|has|have|had|will|would|should)\b", re.I)


def question_options(question: str) -> tuple[str, str] | None:
    """The two candidate answers a question names at its end (`"..., X or Y?"`), or None.

    >>> question_options("Which film came out first, Tree Without Fruit or Small Town Boy?")
    ('Tree Without Fruit', 'Small Town Boy')
    >>> question_options("Who directed Jaws?") is None
    True
    """
    match = _TWO_OPTIONS.search(question.strip())
    return (match["first"].strip(), match["last"].strip()) if match else None


def named_option(options: tuple[str, str], answer: str) -> str:
    """`first`, `last` or `neither`: which of a two-option question's options (`question_options`) `answer`
    names (normalised exact match; the first when both normalise alike).

    >>> named_option(("Jaws", "Alien"), "alien")
    'last'
    """
    answer = normalize_answer(answer)
    first, last = (normalize_answer(option) for option in options)
    return "first" if answer == first else "last" if answer == last else "neither"


def gold_position(question: str, golds: Iterable[str]) -> str | None:
    """`first` or `last`: which option of a two-option question the gold answers name; None for another shape,
    or golds naming both options or neither.

    >>> gold_position("Which film came out first, Jaws or Alien?", ["Alien"])
    'last'
    """
    options = question_options(question)
    if options is None or normalize_answer(options[0]) == normalize_answer(options[1]):
        return None
    named = {named_option(options, str(gold)) for gold in golds} - {"neither"}
    return named.pop() if len(named) == 1 else None


def question_shape(question: str) -> str:
    """`two_option` ("..., X or Y?"), `yes_no` (opens with an auxiliary verb: "Are X and Y both ...?") or
    `open`.

    >>> question_shape("Are Jaws and Alien both American films?"), question_shape("Who directed Jaws?")
    ('yes_no', 'open')
    """
    if question_options(question):
        return "two_option"
    return "yes_no" if _YES_NO.match(question.strip()) else "open"


def most_frequent_answer(golds: Iterable[list[str]]) -> str:
    """The most frequent normalised first gold answer of the training questions (ties: first seen).

    Raises:
        ValueError: no answers.
    """
    counts = Counter(normalize_answer(answers[0]) for answers in golds if len(answers))
    if not counts:
        raise ValueError("most_frequent_answer needs at least one training question with a gold answer")
    return counts.most_common(1)[0][0]


TITLE_BASELINE = "top passage title"
"""The baseline answering with the title of the top passage of a model's first search."""
CEILING = "gold visible"
"""The row of the share of questions whose gold answer a model's observations show."""


def baseline_predictions(question: str, frequent: str | None, title: str | None = None,
                         with_title: bool = False) -> dict[str, str | None]:
    """Each baseline's answer to `question` (None: it does not answer that question); with `with_title`, the
    baseline `TITLE_BASELINE` answers `title` (the question's top passage title, `observations.top_title`)."""
    options = question_options(question)
    predictions = {"first option": options[0] if options else None, "last option": options[1] if options else None}
    if frequent is not None:
        predictions["most frequent training answer"] = frequent
    if with_title:
        predictions[TITLE_BASELINE] = title
    return predictions


def _cell(records: list[tuple[str, list[str]]]) -> dict:
    """`{n, em, f1}` of (prediction, golds) pairs; a missing prediction scores 0."""
    n = len(records)
    em = sum(exact_match(p, g) for p, g in records if p is not None)
    f1 = sum(f1_score(p, g) for p, g in records if p is not None)
    return {"n": n, "em": em / n if n else 0.0, "f1": f1 / n if n else 0.0}


def option_shares(records: list[dict]) -> dict[str, float]:
    """On the two-option questions of `records`: the share of predictions naming the first option, the last
    option, or neither (normalised exact match against each option)."""
    named = Counter()
    for record in records:
        options = question_options(record["question"])
        if options:
            named[named_option(options, record.get("prediction") or "")] += 1
    total = sum(named.values())
    return {key: named[key] / total if total else 0.0 for key in ("first", "last", "neither")}


def searcher(models: dict[str, list[dict]]) -> str | None:
    """The model whose first searches the title baseline and the ceiling read: the first, in order, whose first
    search showed a passage on at least half as many questions as the model that did so on most (so the model
    training started from, past an untrained one that rarely searches); None where no model searched."""
    from verl_search.report.observations import top_title

    counts = {name: sum(top_title(r) is not None for r in records) for name, records in models.items()}
    best = max(counts.values(), default=0)
    return next(name for name, count in counts.items() if count >= best / 2) if best else None


def by_shape(models: dict[str, list[dict]], frequent: str | None = None, seen_by: str | None = None) -> dict[str, dict]:
    """EM and F1 by question shape for every model and every baseline, on the questions of the first model.

    Args:
        models: model name -> evaluation records (`question`, `golden_answers`, `prediction`, `em`, `f1`;
            `turns` for `seen_by`).
        frequent: the baseline "most frequent training answer" (`most_frequent_answer`); None leaves it out.
        seen_by: a model of `models` (`searcher`): the baseline `TITLE_BASELINE` answers with the top passage
            title of its first search, and the row `CEILING` is the share of questions whose gold its
            observations show; None leaves both out.

    Returns:
        `{row name: {"kind": "model" | "baseline" | "ceiling", shape or "all": {n, em, f1} (the ceiling: {n,
        share}), "options": option_shares, "seen_by": model}}` (`options` for models only; `seen_by` for the
        title baseline and the ceiling).
    """
    from verl_search.report.observations import gold_visible, top_title

    if not models:
        return {}
    seen = {r["id"]: r for r in models[seen_by]} if seen_by else {}
    questions = next(iter(models.values()))
    result: dict[str, dict] = {}
    for name, records in models.items():
        row: dict = {"kind": "model"}
        for shape in (*SHAPES, "all"):
            chosen = [r for r in records if shape == "all" or question_shape(r["question"]) == shape]
            n = len(chosen)
            row[shape] = {"n": n, "em": sum(r["em"] for r in chosen) / n if n else 0.0,
                          "f1": sum(r["f1"] for r in chosen) / n if n else 0.0}
        row["options"] = option_shares(records)
        result[name] = row
    titles = {qid: top_title(record) for qid, record in seen.items()}
    names = list(baseline_predictions("", frequent, with_title=bool(seen_by)))
    for name in names:
        row = {"kind": "baseline", **({"seen_by": seen_by} if name == TITLE_BASELINE else {})}
        for shape in (*SHAPES, "all"):
            chosen = [r for r in questions if shape == "all" or question_shape(r["question"]) == shape]
            row[shape] = _cell([(baseline_predictions(r["question"], frequent, titles.get(r["id"]),
                                                      bool(seen_by))[name], list(r["golden_answers"]))
                                for r in chosen])
        result[name] = row
    if seen_by:
        row = {"kind": "ceiling", "seen_by": seen_by}
        for shape in (*SHAPES, "all"):
            chosen = [r for r in questions if shape == "all" or question_shape(r["question"]) == shape]
            visible = sum(r["id"] in seen and gold_visible(seen[r["id"]]) for r in chosen)
            row[shape] = {"n": len(chosen), "share": visible / len(chosen) if chosen else 0.0}
        result[CEILING] = row
    return result


def shape_table(rows: dict[str, dict]) -> str:
    """Markdown: one row per model and baseline; EM / F1 per shape (with n in the header) and, for models, the
    share of two-option answers naming the first / last / neither option."""
    if not rows:
        return ""
    first = next(iter(rows.values()))
    header = " | ".join(f"{shape} (n={first[shape]['n']}) EM / F1" for shape in (*SHAPES, "all"))
    lines = [f"| row | {header} | two-option answers: first / last / neither |",
             "| --- | " + " | ".join("---" for _ in (*SHAPES, "all")) + " | --- |"]
    for name, row in rows.items():
        if row["kind"] == "ceiling":
            cells = " | ".join(f"{row[s]['share']:.3f} of questions" for s in (*SHAPES, "all"))
        else:
            cells = " | ".join(f"{row[s]['em']:.3f} / {row[s]['f1']:.3f}" for s in (*SHAPES, "all"))
        options = row.get("options")
        shares = f"{options['first']:.2f} / {options['last']:.2f} / {options['neither']:.2f}" if options else ""
        label = {"model": name, "baseline": f"baseline: {name}", "ceiling": f"ceiling: {name}"}[row["kind"]]
        if row.get("seen_by"):
            label += f" ({row['seen_by']}'s {'first search' if row['kind'] == 'baseline' else 'observations'})"
        lines.append(f"| {label} | {cells} | {shares} |")
    return "\n".join(lines) + "\n"
