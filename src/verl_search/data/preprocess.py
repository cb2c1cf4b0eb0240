"""FlashRAG-format QA JSONL -> verl parquet rows (what `RLHFDataset` and the agent loops read).

Input rows: `{"id": str, "question": str, "golden_answers": [str, ...]}` (the `../shared/data/qa/`
files, FlashRAG's format). Output columns:

| column | value |
| --- | --- |
| `data_source` | dataset name: the row's `source` field, else the input's name (default: its folder, `nq`, ...) |
| `prompt` | `[{"role": "user", "content": <template with the question>}]` |
| `ability` | `"fact-reasoning"` |
| `reward_model` | `{"ground_truth": {"target": golden_answers}, "style": "rule"}` |
| `extra_info` | `index`, `split`, `id`, `question`, `protocol`, `need_tools_kwargs`, `tools_kwargs` |
| `agent_name` | `tool_agent` (tool protocol) or `search_r1_agent` (tag protocol) |

`agent_name` selects the agent loop per row: without it verl runs `single_turn_agent` and the
tool is never called (verl issue #3008). `tools_kwargs.search.create_kwargs` reaches
`SearchTool.create` (`topk` there overrides the tool's default).
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

from verl_search.data.prompts import AGENT_NAMES, TEMPLATES

logger = logging.getLogger(__name__)

TOOL_NAME = "search"


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
        protocol: `"tool"` (hermes tool calls) or `"search_r1"` (tags).
        topk: passages per search for this row (`create_kwargs.topk`); None = the tool's default.

    Raises:
        RowError: if the question is missing/blank or `golden_answers` is not a non-empty list of strings.
        ValueError: on an unknown protocol.
    """
    if protocol not in TEMPLATES:
        raise ValueError(f"protocol must be one of {sorted(TEMPLATES)}, got {protocol!r}")
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
        "prompt": [{"role": "user", "content": TEMPLATES[protocol].format(question=question)}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": list(answers)}, "style": "rule"},
        "extra_info": {
            "index": index,
            "split": split,
            "id": str(example.get("id", index)),
            "question": question,
            "protocol": protocol,
            "need_tools_kwargs": protocol == "tool",
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": create_kwargs}},
        },
        "agent_name": AGENT_NAMES[protocol],
    }


@dataclass
class Source:
    """An input file and the `data_source` name its rows get."""

    path: Path
    name: str

    @classmethod
    def parse(cls, spec: str) -> "Source":
        """`NAME=PATH`, or `PATH` (name: the file's folder, e.g. `qa/nq/test.jsonl` -> `nq`)."""
        name, sep, path = spec.partition("=")
        if not sep:
            path, name = spec, Path(spec).resolve().parent.name
        return cls(path=Path(path), name=name)


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
    with open(source.path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            try:
                example = json.loads(line)
                if not isinstance(example, dict):
                    raise RowError("not a JSON object")
                make_row(example, 0, "check", source.name)  # validates the fields
            except (json.JSONDecodeError, RowError) as exc:
                message = f"{source.path}:{lineno}: {exc}"
                if on_bad_row == "error":
                    raise RowError(message + " (pass --on-bad-row skip to leave bad rows out, reported)") from exc
                logger.warning("skipping bad row %s", message)
                continue
            examples.append((lineno, example))
    return examples


def build_rows(sources: list[Source], split: str, protocol: str, max_per_source: int | None = None,
               seed: int = 0, topk: int | None = None, on_bad_row: str = "error") -> list[dict]:
    """Rows for several inputs, merged in input order, `extra_info.index` numbering them.

    A row's `data_source` is its own `source` field when it has one (e.g. `mini_wiki/qa.jsonl`
    mixes hotpotqa, musique and 2wiki), else the input's name. `max_per_source` keeps a random
    sample (fixed by `seed`) of at most N rows per data source, in file order.
    """
    rows: list[dict] = []
    for source in sources:
        groups: dict[str, list[dict]] = {}
        for _, example in read_examples(source, on_bad_row):
            name = example.get("source") if isinstance(example.get("source"), str) else source.name
            groups.setdefault(name, []).append(example)
        for name, examples in groups.items():
            examples = sample_per_source(examples, name, max_per_source, seed)
            for example in examples:
                rows.append(make_row(example, len(rows), split, name, protocol, topk))
            logger.info("%s: %d rows from %s", name, len(examples), source.path)
    return rows


def sample_per_source(items: list, name: str, max_per_source: int | None, seed: int = 0) -> list:
    """At most `max_per_source` of one data source's `items`: a random sample fixed by `seed` and
    the source's `name`, kept in their order (`--max-per-source` of preprocessing and eval).
    `None` keeps them all.

    >>> sample_per_source(list("abcdef"), "nq", 3, seed=0) == sample_per_source(list("abcdef"), "nq", 3, seed=0)
    True
    """
    if max_per_source is None or len(items) <= max_per_source:
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
