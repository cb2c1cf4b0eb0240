"""`--preset search-r1|research`: the declared tables (`eval/presets.py`), docs/eval.md's tables and the CLI agree."""

import re
from dataclasses import asdict, fields
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

import pytest

from verl_search import cli
from verl_search.eval.options import EvalOptions
from verl_search.eval.presets import PRESETS, PresetName, get_preset, with_preset
from verl_search.runtime.options import flag_name, option_fields

DOCS = Path(__file__).resolve().parents[2] / "docs" / "eval.md"
FLAGS = {flag_name(spec): spec.name for spec in option_fields(EvalOptions)}
SOURCE = re.compile(r"^[\w./-]+:\d+(-\d+)?(,\d+(-\d+)?)*$")  # path:line, path:a-b, path:a,b-c


def _docs_table(name: str) -> tuple[str, dict[str, tuple[str, str, str]]]:
    """`(section text, {key: (value, source, differs)})` of docs/eval.md's table under "### `--preset NAME`";
    a key is an `EvalOptions` field (a row naming its flag) or the name of a fixed setting."""
    text = DOCS.read_text()
    start = text.index(f"### `--preset {name}`")
    end = text.find("\n#", start + 1)
    section = text[start:end if end > 0 else None]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("setting", "---"):
            continue
        key, value, source, differs = cells
        key = FLAGS[key.strip("`")] if key.startswith("`--") else key
        assert key not in rows, f"{name}: {key} twice in docs/eval.md"
        rows[key] = (value.removeprefix("`").removesuffix("`"), source.strip("`"), differs)
    return section, rows


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_docs_table_agrees_with_the_preset_key_by_key(name):
    preset = PRESETS[name]
    section, rows = _docs_table(name)
    declared = {**preset.options, **preset.fixed}
    assert set(rows) == set(declared)
    for key, setting in declared.items():
        assert rows[key] == (str(setting.value), setting.source, setting.differs or "nothing"), key
    assert preset.commit in section and preset.repository in section


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_is_well_formed(name):
    preset = PRESETS[name]
    assert preset.name == name and re.fullmatch(r"[0-9a-f]{40}", preset.commit)
    names = {f.name for f in fields(EvalOptions)}
    assert set(preset.options) <= names and not set(preset.fixed) & names
    for setting in [*preset.options.values(), *preset.fixed.values()]:
        assert all(SOURCE.match(part) for part in setting.source.split("; ")), setting.source
    EvalOptions(data=[], preset=name, **preset.option_values())  # values EvalOptions accepts
    types = {spec.name: spec.type for spec in option_fields(EvalOptions)}
    for key, value in preset.option_values().items():  # of the field's type, as its flag would parse them
        kind = types[key]
        if get_origin(kind) in (Union, UnionType):  # X | None
            kind = next(a for a in get_args(kind) if a is not type(None))
        assert value in get_args(kind) if get_origin(kind) is Literal else type(value) is kind, key


def test_preset_lengths_follow_the_references_bounds():
    sr1 = get_preset("search-r1").option_values()
    # Search-R1's loop: max_turns turns of a generation and an observation, then one answer turn
    assert sr1["response_length"] == sr1["max_turns"] * (sr1["max_tokens_per_turn"] + sr1["max_obs_tokens"]) \
        + sr1["max_tokens_per_turn"]
    research = get_preset("research").option_values()
    # ReSearch: prompt + response within SGLang's 8,192-token context; no search cap (one that cannot bind)
    assert research["prompt_length"] + research["response_length"] == 8192
    assert research["max_turns"] >= research["response_length"]
    assert research["max_tokens_per_turn"] >= research["response_length"]
    assert research["max_obs_tokens"] >= research["response_length"]


def test_preset_names_are_the_flags_choices():
    assert set(get_args(PresetName)) == set(PRESETS)
    parser = cli.build_parser("eval")
    choices = next(a for a in parser._actions if a.dest == "command").choices["eval"]
    assert next(a for a in choices._actions if a.dest == "preset").choices == list(get_args(PresetName))


def _options(*argv: str) -> EvalOptions:
    return cli.eval_options(cli.build_parser("eval").parse_args(["eval", *argv]))


def test_cli_applies_the_preset_under_the_flags_given():
    assert _options() == EvalOptions(data=_options().data)  # no preset: the class's defaults
    research = get_preset("research").option_values()
    options = _options("--preset", "research")
    assert {key: getattr(options, key) for key in research} == research and options.preset == "research"
    # a flag given wins, even one equal to the class's default; the rest stays the preset's
    options = _options("--preset", "research", "--max-turns", "4", "--temperature", "1.0", "--samples", "8")
    assert (options.max_turns, options.temperature, options.samples) == (4, 1.0, 8)
    assert options.topk == research["topk"] and options.response_length == research["response_length"]
    # the report's meta.options (`asdict`) records the preset and the effective values
    assert asdict(options)["preset"] == "research" and asdict(options)["max_turns"] == 4
    assert _options("--preset", "search-r1", "--judge-url", "http://x/v1", "--judge-model", "m").judge_model == "m"


def test_unknown_preset_is_named_with_the_choices():
    for call in (lambda: get_preset("searchr1"), lambda: EvalOptions(data=[], preset="searchr1"),
                 lambda: with_preset({"preset": "searchr1"})):
        with pytest.raises(ValueError, match=r"'searchr1'.*choices: search-r1, research"):
            call()
    with pytest.raises(SystemExit):
        cli.build_parser("eval").parse_args(["eval", "--preset", "searchr1"])
    assert with_preset({"preset": None, "topk": 2}) == {"preset": None, "topk": 2}
