"""docs/training.md's settings tables against both sides: every reference cell is the value
`examples/references/` records for that recipe's reference script (read by hand, with file and line), every
"ours" cell is what `main_ppo` would compose for that recipe (and the shipped agent-loop and tool YAMLs for
`search_r1_agent.*`, `research_agent.*` and the tool's top-k), and wherever a recipe does not match its reference,
the row says why."""

from __future__ import annotations

import functools
import re

import pytest
import yaml
from omegaconf import OmegaConf

from tests.conftest import REPO
from verl_search.verl_config.check import ENV_DEFAULTS, _environ_defaults
from verl_search.verl_config.compose import compose_verl_config
from verl_search.verl_config.shipped import config_path

DOC = REPO / "docs" / "training.md"
REFERENCES = REPO / "examples" / "references"
RECIPES = {
    "ppo": "ppo_qwen2.5-3b-base_search_r1",
    "grpo": "grpo_qwen2.5-3b-base_search_r1",
    "tool": "grpo_qwen2.5-3b-instruct_tool",
    "qwen3": "grpo_qwen3-4b-instruct_tool",
    "megatron": "ppo_qwen2.5-3b-base_search_r1_megatron",
    "research": "grpo_qwen2.5-7b-instruct_research",
}
FACTS = {"ppo": "search_r1_train_ppo", "megatron": "search_r1_train_ppo", "grpo": "search_r1_train_grpo",
         "tool": "verl_0.7_search_multiturn", "qwen3": "verl_0.7_search_multiturn", "research": "research_train"}
"""Recipe -> its reference's facts file."""
HEADER = "| key | Search-R1 | verl 0.7 | ours | reason |"
COLUMNS = {1: ("ppo", "grpo"), 2: ("tool",)}
"""Reference column of the main table -> the recipes whose facts it states (megatron shares ppo's, qwen3 tool's)."""
RESEARCH_HEADER = "| key | ReSearch | ours | reason |"
SHARED = {"megatron": "ppo", "qwen3": "tool"}
"""Recipes whose reference cells are another recipe's (the same reference script)."""


@functools.cache
def facts(recipe: str) -> dict:
    return yaml.safe_load((REFERENCES / f"{FACTS[recipe]}.yaml").read_text())["settings"]


def table(header: str, width: int) -> list[list[str]]:
    lines = DOC.read_text().splitlines()
    rows = []
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == width, f"a row of {DOC.name} has {len(cells)} cells, not {width}: {line}"
        rows.append(cells)
    return rows


def parse(cell: str, recipes: tuple[str, ...], key: str) -> dict[str, str]:
    """`recipe `value`` pairs name their recipes; one `value` is every recipe's of `recipes`; empty: none."""
    if not cell:
        return {}
    pairs = dict(re.findall(r"(\w+) `([^`]*)`", cell))
    if not pairs:
        single = re.fullmatch(r"`([^`]*)`", cell)
        assert single, f"{key}: the cell is neither `value` nor recipe `value` pairs: {cell!r}"
        pairs = dict.fromkeys(recipes, single.group(1))
    assert set(pairs) <= set(recipes), f"{key}: unknown recipe in {cell!r}"
    return pairs


def rows() -> dict[str, dict]:
    """key -> {"reference": {recipe: value}, "ours": {recipe: value}, "reason": text}, both tables."""
    out = {}
    for key, search_r1, verl07, ours, reason in table(HEADER, 5):
        key = key.strip("`")
        reference = {**parse(search_r1, COLUMNS[1], key), **parse(verl07, COLUMNS[2], key)}
        reference.update({shared: reference[source] for shared, source in SHARED.items() if source in reference})
        stated = parse(ours, ("ppo", "grpo", "tool", "qwen3", "megatron"), key)
        if "ppo" in stated and "megatron" not in stated:
            stated["megatron"] = stated["ppo"]
        out[key] = {"reference": reference, "ours": stated, "reason": reason}
    for key, research, ours, reason in table(RESEARCH_HEADER, 4):
        key = key.strip("`")
        entry = out.setdefault(key, {"reference": {}, "ours": {}, "reason": ""})
        entry["reference"].update(parse(research, ("research",), key))
        entry["ours"].update(parse(ours, ("research",), key))
        entry["research_reason"] = reason
    return out


ROWS = rows()


@pytest.fixture(scope="module")
def configs() -> dict:
    with _environ_defaults({variable: config_path(name) for variable, name in ENV_DEFAULTS.items()}):
        return {short: compose_verl_config(recipe=REPO / "examples" / folder / "config.yaml")
                for short, folder in RECIPES.items()}


@pytest.fixture(scope="module")
def shipped() -> dict:
    loops = {entry.name: entry for entry in OmegaConf.load(config_path("agent-loop"))}
    tool = OmegaConf.load(config_path("tool")).tools[0].config
    return {"loops": loops, "tool": tool}


MISSING = "-"


def actual(config, shipped, recipe: str, key: str):
    """What `recipe` composes to for the table's `key` (`-`: no such key)."""
    loop, _, setting = key.partition(".")
    if loop in shipped["loops"]:
        if config.actor_rollout_ref.rollout.agent.default_agent_loop != loop:
            return MISSING
        return shipped["loops"][loop][setting]
    if key == "(updates per step)":
        actor = config.actor_rollout_ref.actor
        # verl multiplies both by rollout.n, which cancels
        return config.data.train_batch_size // actor.ppo_mini_batch_size * actor.ppo_epochs
    if key == "(SearchTool topk)":
        return shipped["tool"].topk if config.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent" \
            else MISSING
    return OmegaConf.select(config, key, default=MISSING)


def same(stated, value) -> bool:
    """A cell's or a fact's value against another value: numbers as numbers, booleans and None as YAML writes
    them, lists as their Python text with or without quotes."""
    if value is None:
        return str(stated).lower() in ("none", "null")
    if isinstance(value, bool) or isinstance(stated, bool):
        return str(stated).lower() == str(value).lower()
    try:
        return float(stated) == float(value)
    except (TypeError, ValueError):
        pass
    if isinstance(value, (int, float)):
        return False
    if not isinstance(value, str):  # an OmegaConf list
        value = str(list(value))
    plain = lambda text: str(text).replace("'", "").replace('"', "").replace(" ", "")  # noqa: E731
    return plain(stated) == plain(value)


def test_every_facts_entry_names_its_source_file_and_line():
    for name in sorted(set(FACTS.values())):
        document = yaml.safe_load((REFERENCES / f"{name}.yaml").read_text())
        assert {"reference", "repository", "branch", "commit", "settings"} <= set(document), name
        assert re.fullmatch(r"[0-9a-f]{40}", document["commit"]), name
        for key, fact in document["settings"].items():
            assert set(fact) <= {"value", "at", "note"} and "value" in fact, (name, key)
            assert re.match(r"[\w./-]+\.(sh|yaml|py):\d", fact["at"]), (name, key, fact["at"])


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_reference_value_has_its_row_and_the_cell_states_it(recipe):
    for key, fact in facts(recipe).items():
        assert key in ROWS, f"{FACTS[recipe]}.yaml sets {key}; docs/training.md has no row for it"
        stated = ROWS[key]["reference"].get(recipe)
        assert stated is not None, f"{key}: the reference cell of {recipe} is empty; {FACTS[recipe]} says {fact}"
        assert same(stated, fact["value"]), f"{key}: the table says {stated!r} for {recipe}'s reference; " \
                                            f"{FACTS[recipe]}.yaml says {fact['value']!r} ({fact['at']})"


def test_no_reference_cell_without_a_fact():
    for key, row in ROWS.items():
        for recipe in row["reference"]:
            assert key in facts(recipe), f"{key}: the table states {recipe}'s reference, {FACTS[recipe]}.yaml does not"


CLAIMS = [(key, recipe, value) for key, row in ROWS.items() for recipe, value in row["ours"].items()]


def test_the_table_covers_the_settings_the_issue_names():
    keys = {key for key, _, _ in CLAIMS}
    for needed in ("actor_rollout_ref.model.path", "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size",
                   "(updates per step)", "search_r1_agent.max_turns", "search_r1_agent.last_search_notice",
                   "data.max_response_length", "actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef",
                   "actor_rollout_ref.actor.entropy_coeff", "actor_rollout_ref.rollout.top_p",
                   "critic.optim.lr_warmup_steps_ratio", "actor_rollout_ref.actor.clip_ratio_c",
                   "actor_rollout_ref.actor.loss_agg_mode", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"):
        assert needed in keys, needed


@pytest.mark.parametrize("key, recipe, stated", CLAIMS, ids=[f"{recipe}:{key}" for key, recipe, _ in CLAIMS])
def test_every_ours_cell_is_what_the_recipe_composes_to(key, recipe, stated, configs, shipped):
    value = actual(configs[recipe], shipped, recipe, key)
    if stated == MISSING:
        assert value == MISSING, f"{recipe} has {key} = {value!r}; the table says it has none"
        return
    assert value != MISSING, f"{recipe}: {key} is not in the composed config"
    assert same(stated, value), f"docs/training.md says {recipe} {key} = {stated!r}; the recipe composes to {value!r}"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_difference_from_the_reference_has_a_reason(recipe, configs, shipped):
    unexplained = []
    for key, fact in facts(recipe).items():
        value = actual(configs[recipe], shipped, recipe, key)
        reason = ROWS[key]["research_reason" if recipe == "research" else "reason"]
        if not same(fact["value"], value) and not reason:
            unexplained.append(f"{key}: {value!r} against {fact['value']!r} ({fact['at']})")
    assert not unexplained, f"{RECIPES[recipe]} differs from its reference without a reason: {unexplained}"
