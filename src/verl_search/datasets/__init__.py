"""Named datasets shipped inside the package, so the quickstart needs no file from elsewhere.

Beside them: `preprocess` (QA JSONL -> verl parquet rows) and `download` (the published Search-R1 /
FlashRAG files); this module imports neither.

| name | corpus (`--corpus NAME`) | questions (`--data` / `--input NAME[:SPLIT]`) |
| --- | --- | --- |
| `mini-wiki` | 9,993 Wikipedia passages (`mini_wiki/corpus.jsonl.gz`, 5.4 MB unpacked) | 1,558 questions answerable from it (`mini_wiki/qa.jsonl.gz`): hotpotqa 80, musique 80, 2wiki 1,398 |

Origin, fields and licences: `mini_wiki/README.md` beside this file. The files are gzip-compressed;
the corpus readers (`retrieval.corpus`) and the question readers (`datasets.preprocess`) read them
without unpacking them to disk.

Questions split (`mini-wiki:train`, `mini-wiki:test`; `mini-wiki` is all of them): a fixed rule,
stratified by `source`. Within each source the distinct normalised question texts (`normalize_question`)
are ordered by the SHA-256 of `"<source>:<text>"`; the first `TEST_QUESTIONS_PER_SOURCE[source]` texts
are the test split, every row with one of them is a test row, the rest are train. So the splits
share no id and no normalised question text, every source is in both, and the split never
changes with the file order (tests/datasets/test_datasets_on_cpu.py pins it: 320 test, 1,238 train).

Standard library only: the base install (`verl-search index build --corpus mini-wiki`) uses it.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from verl_search.rewards.qa import normalize_answer

HERE = Path(__file__).resolve().parent
SPLITS = ("train", "test")
#: test questions (distinct normalised texts) per source of mini-wiki: half of the two 80-question
#: sources, 240 of 2wiki's 1,398; 320 in all, so an eval of 40 per source covers every source
TEST_QUESTIONS_PER_SOURCE = {"hotpotqa": 40, "musique": 40, "2wiki": 240}
#: what `verl-search eval` evaluates without `--data`
DEFAULT_EVAL_DATA = "mini-wiki:test"
#: questions a training set leaves out unless `--exclude` says otherwise (`verl-search preprocess
#: --split train`): the default eval set, so a model is never evaluated on questions it trained on
DEFAULT_TRAIN_EXCLUDE = (DEFAULT_EVAL_DATA,)


@dataclass(frozen=True)
class Dataset:
    """A shipped dataset: its corpus and questions files (gzip JSONL) inside the package."""

    name: str
    corpus: Path
    questions: Path


DATASETS = {
    "mini-wiki": Dataset("mini-wiki", HERE / "mini_wiki" / "corpus.jsonl.gz", HERE / "mini_wiki" / "qa.jsonl.gz"),
}


def normalize_question(text: str) -> str:
    """A question's text as the splits and `--exclude` compare it: SQuAD normalisation (lower case,
    no punctuation, no articles, single spaces; `rewards.qa.normalize_answer`).

    >>> normalize_question("Who wrote  The Hobbit?") == normalize_question("who wrote hobbit")
    True
    """
    return normalize_answer(text)


def parse_spec(spec: str | os.PathLike) -> tuple[Dataset, str | None] | None:
    """`(dataset, split)` for `NAME` or `NAME:SPLIT` (split `None` = all rows); `None` when `spec`
    names no shipped dataset (it is then a path).

    Raises:
        ValueError: a known dataset with an unknown split (names the splits).
    """
    name, _, split = str(spec).partition(":")
    if name not in DATASETS:
        return None
    if split and split not in SPLITS:
        raise ValueError(f"{spec!r}: unknown split {split!r}; use {name}, " + " or ".join(f"{name}:{s}" for s in SPLITS))
    return DATASETS[name], split or None


def resolve_corpus(spec: str | os.PathLike) -> Path:
    """The corpus file `spec` means: a shipped dataset's corpus (`mini-wiki`), else the path itself.

    Raises:
        ValueError: `spec` is `NAME:SPLIT` (a corpus has no splits).
    """
    parsed = parse_spec(spec)
    if parsed is None:
        return Path(spec)
    if parsed[1] is not None:
        raise ValueError(f"--corpus {spec!r}: a corpus has no splits; pass --corpus {parsed[0].name}")
    return parsed[0].corpus


def open_text(path: str | os.PathLike):
    """Open a text file for reading (UTF-8), through gzip when its name ends in `.gz`."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


@functools.lru_cache(maxsize=None)
def split_of(name: str) -> dict[str, str]:
    """`{question id: "train" | "test"}` of a shipped dataset, by the rule in the module docstring.

    Raises:
        KeyError: `name` is not a shipped dataset.
    """
    rows = [row for _, row, _ in question_lines(DATASETS[name].questions)]
    texts: dict[str, set[str]] = {}
    for row in rows:
        texts.setdefault(row["source"], set()).add(normalize_question(row["question"]))
    test: set[tuple[str, str]] = set()
    for source, distinct in texts.items():
        ranked = sorted(distinct, key=lambda text: hashlib.sha256(f"{source}:{text}".encode()).hexdigest())
        test.update((source, text) for text in ranked[: TEST_QUESTIONS_PER_SOURCE[source]])
    return {row["id"]: "test" if (row["source"], normalize_question(row["question"])) in test else "train"
            for row in rows}


def question_lines(path: str | os.PathLike, dataset: str | None = None,
                   split: str | None = None) -> Iterator[tuple[int, dict | None, str | None]]:
    """`(line number, row, None)` for each line of a JSONL file (`.gz` read through gzip) that is a
    JSON object, `(line number, None, what is wrong)` for one that is not; with `dataset` and `split`,
    only the valid rows of that split of the shipped dataset (bad lines are always yielded).

    Raises:
        FileNotFoundError: `path` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file {path} does not exist")
    keep = split_of(dataset) if dataset and split else None
    with open_text(path) as handle:
        for lineno, line in enumerate(handle, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, None, f"not valid JSON ({exc.msg} at column {exc.colno}): {line.strip()[:80]!r}"
                continue
            if not isinstance(row, dict):
                yield lineno, None, f"not a JSON object: {line.strip()[:80]!r}"
            elif keep is None or keep.get(row.get("id")) == split:
                yield lineno, row, None


def read_questions(spec: str | os.PathLike) -> list[dict]:
    """The question rows of `spec`: `NAME[:SPLIT]` of a shipped dataset, or a JSONL file (`.gz` read
    through gzip), in file order.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a line that is not a JSON object (names file, line and what is wrong), or an
            unknown split.
    """
    parsed = parse_spec(spec)
    path = parsed[0].questions if parsed else Path(spec)
    rows = []
    for lineno, row, problem in question_lines(path, *((parsed[0].name, parsed[1]) if parsed else ())):
        if problem:
            raise ValueError(f"{path}:{lineno}: {problem}")
        rows.append(row)
    return rows
