"""FlashRAG-format QA JSONL -> verl parquet rows (what `RLHFDataset` and the agent loops read).

Input rows: `{"id": str, "question": str, "golden_answers": [str, ...]}` (FlashRAG's format; `.jsonl`
or `.jsonl.gz`), or a shipped question set by name (`mini-wiki`, `mini-wiki:train`, `mini-wiki:test`;
`verl_search.datasets`). Output columns:

| column | value |
| --- | --- |
| `data_source` | dataset name: the row's `source` field, else the input's name (default: its folder, `nq`, ...) |
| `prompt` | the protocol's chat messages: `[{"role": "user", "content": <template with the question>}]`; `research`: ReSearch's system prompt, then the bare question |
| `ability` | `"fact-reasoning"` |
| `reward_model` | `{"ground_truth": {"target": golden_answers}, "style": "rule"}` |
| `extra_info` | `index`, `split`, `id`, `question`, `protocol`, `need_tools_kwargs`, `tools_kwargs` |
| `agent_name` | the protocol's agent loop: `tool_agent`, `search_r1_agent`, `research_agent`, or a baseline's (`direct_agent`, `cot_agent`, `rag_agent`, `ircot_agent`) |

`agent_name` selects the agent loop per row: without it verl runs `single_turn_agent` and the
tool is never called (verl issue #3008). `tools_kwargs.search.create_kwargs` reaches
`SearchTool.create` (`topk` there overrides the tool's default).

`verl-search preprocess` (`PreprocessOptions`, `preprocess`) writes one parquet file; a training set
(`--split train`) leaves out, by default, every question whose normalised text is in the default eval
set (`mini-wiki:test`, `verl_search.datasets.DEFAULT_TRAIN_EXCLUDE`), and says how many it left out.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from verl_search.agent_protocol.registry import ProtocolName, get_protocol
from verl_search.datasets import DEFAULT_TRAIN_EXCLUDE, normalize_question, parse_spec, question_lines
from verl_search.agent_protocol.vocabulary import SEARCH_TOOL

logger = logging.getLogger(__name__)


class RowError(ValueError):
    """A malformed input row (the message names file and line)."""


def make_row(example: dict, index: int, split: str, data_source: str, protocol: str = "tool",
             topk: int | None = None) -> dict:
    """One verl row from one FlashRAG example.

    The question is stripped and gets a final `?` if it has none, as Search-R1's preprocessing
    does.

    Args:
        example: `{"id", "question", "golden_answers"}`.
        index: the row's index (`extra_info.index`; verl uses it to group GRPO samples).
        split: `"train"` or `"test"`.
        data_source: the dataset name written to `data_source`.
        protocol: a `verl_search.agent_protocol.registry` name: `"tool"` (hermes tool calls), `"search_r1"`
            (Search-R1 tags) or `"research"` (ReSearch tags).
        topk: passages per search for this row (`create_kwargs.topk`); None = the tool's default.

    Raises:
        RowError: if the question is missing/blank or `golden_answers` is not a non-empty list of strings.
        ValueError: on an unknown protocol.
    """
    spec = get_protocol(protocol)
    question = example.get("question")
    if not isinstance(question, str) or not question.strip():
        raise RowError('"question" must be a non-empty string')
    answers = example.get("golden_answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise RowError('"golden_answers" must be a non-empty list of non-empty strings')
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    create_kwargs = {"question": question, "data_source": data_source, "topk": topk}
    return {
        "data_source": data_source,
        "prompt": spec.messages(question),
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": list(answers)}, "style": "rule"},
        "extra_info": {
            "index": index,
            "split": split,
            "id": str(example.get("id", index)),
            "question": question,
            "protocol": protocol,
            "need_tools_kwargs": spec.uses_tools,
            "tools_kwargs": {SEARCH_TOOL: {"create_kwargs": create_kwargs}},
        },
        "agent_name": spec.agent_name,
    }


@dataclass
class Source:
    """An input file, the `data_source` name its rows get, and (for a shipped dataset) the split of
    it to keep (`None`: every row)."""

    path: Path
    name: str
    split: str | None = None
    dataset: str | None = None

    @classmethod
    def parse(cls, spec: str) -> "Source":
        """`NAME=PATH`, `PATH` (name: the file's folder, e.g. `qa/nq/test.jsonl` -> `nq`), or a shipped
        dataset `DATASET[:SPLIT]` (`mini-wiki:test`; its rows carry their own `source`).

        Raises:
            ValueError: a shipped dataset with an unknown split.
        """
        name, sep, path = spec.partition("=")
        if not sep:
            path, name = spec, None
        shipped = parse_spec(path)
        if shipped is not None:
            dataset, split = shipped
            return cls(path=dataset.questions, name=name or dataset.name, split=split, dataset=dataset.name)
        return cls(path=Path(path), name=name or Path(path).resolve().parent.name)


def read_examples(source: Source, on_bad_row: str = "error") -> list[tuple[int, dict]]:
    """`(line_number, example)` pairs of a FlashRAG JSONL file, checked.

    Args:
        on_bad_row: `"error"` raises at the first bad row; `"skip"` logs each bad row (file:line
            and reason) and leaves it out.

    Raises:
        RowError: a bad row with `on_bad_row="error"`, naming file and line.
        FileNotFoundError: the file does not exist.
    """
    examples = []
    for lineno, example, problem in question_lines(source.path, source.dataset, source.split):
        try:
            if problem:
                raise RowError(problem)
            make_row(example, 0, "check", source.name)  # validates the fields
        except RowError as exc:
            message = f"{source.path}:{lineno}: {exc}"
            if on_bad_row == "error":
                raise RowError(message + " (pass --on-bad-row skip to leave bad rows out, reported)") from exc
            logger.warning("skipping bad row %s", message)
            continue
        examples.append((lineno, example))
    return examples


def build_rows(sources: list[Source], split: str, protocol: str, max_per_source: int | None = None,
               seed: int = 0, topk: int | None = None, on_bad_row: str = "error",
               exclude: set[str] | frozenset[str] = frozenset(), sample: str = "random") -> list[dict]:
    """Rows for several inputs, merged in input order, `extra_info.index` numbering them.

    A row's `data_source` is its own `source` field when it has one (e.g. `mini-wiki` mixes
    hotpotqa, musique and 2wiki), else the input's name. Questions whose normalised text
    (`datasets.normalize_question`) is in `exclude` are left out (and counted in the log) before
    `max_per_source` keeps a sample (fixed by `seed`) of at most N rows per data source: `sample`
    as `sample_per_source` takes it.
    """
    rows: list[dict] = []
    for source in sources:
        groups: dict[str, list[dict]] = {}
        left_out = 0
        for _, example in read_examples(source, on_bad_row):
            if exclude and normalize_question(example["question"]) in exclude:
                left_out += 1
                continue
            name = example.get("source") if isinstance(example.get("source"), str) else source.name
            groups.setdefault(name, []).append(example)
        if left_out:
            logger.info("%s: left out %d questions that are in the excluded sets", source.path, left_out)
        for name, examples in groups.items():
            examples = sample_per_source(examples, name, max_per_source, seed, sample)
            for example in examples:
                rows.append(make_row(example, len(rows), split, name, protocol, topk))
            logger.info("%s: %d rows from %s", name, len(examples), source.path)
    return rows


SAMPLE_METHODS = ("random", "shuffled")
"""`sample_per_source` methods (`--sample`)."""


def sample_per_source(items: list, name: str, max_per_source: int | None, seed: int = 0,
                      method: str = "random") -> list:
    """At most `max_per_source` of one data source's `items` (`--max-per-source` of preprocessing and eval).

    `method`:

    * `random` (default): a random sample fixed by `seed` and the source's `name`, kept in file order.
    * `shuffled`: ReSearch's validation set (Agent-RL/ReSearch, branch `re-search`, `data/prepare_musique.py`:
      `random.seed(42)`, `random.shuffle(lines)`, `lines[:100]`): all items shuffled by `random.Random(seed)`,
      the first `max_per_source` kept in shuffled order. With `seed` 42 and 100, MuSiQue dev gives ReSearch's
      100 questions.

    `None` keeps them all, in file order.

    >>> sample_per_source(list("abcdef"), "nq", 3, seed=0) == sample_per_source(list("abcdef"), "nq", 3, seed=0)
    True
    >>> sample_per_source(list("abcdef"), "nq", 3, seed=42, method="shuffled")
    ['d', 'b', 'c']

    Raises:
        ValueError: if `method` is not one of `SAMPLE_METHODS`.
    """
    if method not in SAMPLE_METHODS:
        raise ValueError(f"sample method {method!r} is not one of {', '.join(SAMPLE_METHODS)}")
    if max_per_source is None:
        return list(items)
    if method == "shuffled":
        shuffled = list(items)
        random.Random(seed).shuffle(shuffled)
        return shuffled[:max_per_source]
    if len(items) <= max_per_source:
        return list(items)
    keep = sorted(random.Random(f"{seed}:{name}").sample(range(len(items)), max_per_source))
    return [items[i] for i in keep]


def write_parquet(rows: list[dict], out: str | os.PathLike) -> None:
    """Write rows to a parquet file atomically (a temporary file in the same folder, then renamed)."""
    import pandas as pd

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass
class PreprocessOptions:
    """Options of `preprocess` (the `verl-search preprocess` flags; `--input` is added by the CLI).

    Attributes:
        inputs: `[NAME=]PATH` of FlashRAG JSONL files (`.gz` too) or shipped sets (`mini-wiki:train`).
        out: the parquet file to write (atomically).
        split: `train` or `test` (`extra_info.split`).
        protocol: `tool` (hermes tool calls), `search_r1` (Search-R1 tags) or `research` (ReSearch tags).
        max_per_source, seed: random sample of at most N rows per data source.
        sample: how `max_per_source` samples (`sample_per_source`): `random` (file order) or `shuffled`
            (ReSearch's validation set: `--max-per-source 100 --seed 42 --sample shuffled`).
        topk: passages per search for these rows (default: the tool's).
        on_bad_row: `error` stops at the first bad line (file:line and what is wrong); `skip` logs each.
        exclude: question sets whose questions (by normalised text) are left out; default: for
            `--split train`, `DEFAULT_TRAIN_EXCLUDE` (the default eval set), for `test` none;
            `none` excludes nothing.
    """

    inputs: list[str]
    out: str = field(metadata={"help": "output parquet file (written atomically)"})
    split: Literal["train", "test"] = field(metadata={"help": "extra_info.split of the rows"})
    protocol: ProtocolName = field(default="tool", metadata={
        "help": "tool (hermes tool calls), search_r1 (Search-R1 tags) or research (ReSearch tags)"})
    max_per_source: int | None = field(default=None, metadata={"help": "random sample of at most N rows per data source"})
    seed: int = field(default=0, metadata={"help": "seed of the --max-per-source sample"})
    sample: Literal["random", "shuffled"] = field(default="random", metadata={
        "help": "random: a random sample in file order; shuffled: shuffle with --seed, keep the first N "
                "(ReSearch's validation set: --max-per-source 100 --seed 42 --sample shuffled)"})
    topk: int | None = field(default=None, metadata={"help": "passages per search for these rows"})
    on_bad_row: Literal["error", "skip"] = field(default="error", metadata={
        "help": "error: stop at the first bad line (file:line and what is wrong); skip: leave it out, logged"})
    exclude: list[str] | None = field(default=None, metadata={
        "help": "[NAME=]PATH or DATASET[:SPLIT] whose questions (normalised text) are left out; repeatable; "
                f"default for --split train: {', '.join(DEFAULT_TRAIN_EXCLUDE)} (the default eval set); none: nothing"})


def excluded_questions(specs: list[str]) -> frozenset[str]:
    """The normalised question texts of the question sets `specs` (`[NAME=]PATH` or `DATASET[:SPLIT]`).

    Raises:
        FileNotFoundError, RowError: as `read_examples`.
    """
    return frozenset(normalize_question(example["question"]) for spec in specs
                     for _, example in read_examples(Source.parse(spec)))


def preprocess(options: PreprocessOptions) -> int:
    """Write `options.out` from `options.inputs` (see `PreprocessOptions`); return the number of rows.

    Raises:
        FileNotFoundError: an input does not exist.
        RowError: a bad line with `on_bad_row="error"` (names file:line and what is wrong).
        ValueError: no row is left to write.
    """
    exclude = options.exclude
    if exclude is None:
        exclude = list(DEFAULT_TRAIN_EXCLUDE) if options.split == "train" else []
    exclude = [spec for spec in exclude if spec != "none"]
    if exclude:
        logger.info("leaving out the questions of %s (--exclude none keeps them)", ", ".join(exclude))
    rows = build_rows([Source.parse(spec) for spec in options.inputs], options.split, options.protocol,
                      options.max_per_source, options.seed, options.topk, options.on_bad_row,
                      excluded_questions(exclude), options.sample)
    if not rows:
        raise ValueError(f"no rows left from {options.inputs} to write to {options.out}")
    write_parquet(rows, options.out)
    logger.info("wrote %d rows to %s", len(rows), options.out)
    return len(rows)
