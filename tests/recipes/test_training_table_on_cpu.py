"""docs/training.md's settings tables say what each recipe sets; every "ours" cell is read here from the
config `main_ppo` would compose for that recipe (and from the shipped agent-loop YAML for `search_r1_agent.*` and
`research_agent.*`)."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO
from verl_search.verl_config.check import ENV_DEFAULTS, _environ_defaults
from verl_search.verl_config.shipped import config_path
from verl_search.verl_config.compose import compose_verl_config

DOC = REPO / "docs" / "training.md"
RECIPES = {
    "ppo": "ppo_qwen2.5-3b-base_search_r1",
    "grpo": "grpo_qwen2.5-3b-base_search_r1",
    "tool": "grpo_qwen2.5-3b-instruct_tool",
    "megatron": "ppo_qwen2.5-3b-base_search_r1_megatron",
}
HEADER = "| key | Search-R1 | verl 0.7 | ours | reason |"
RESEARCH = "grpo_qwen2.5-7b-instruct_research"
RESEARCH_HEADER = "| key | ReSearch | ours | reason |"


def table_claims() -> list[tuple[str, str, str]]:
    """(key, recipe, value) for every "ours" cell of the table, as docs/training.md states the rules:
    `recipe `value`` pairs name their recipes, one value is every recipe's, and the Megatron recipe has the
    PPO recipe's value wherever only `ppo` is named; `-`: the recipe has no such key."""
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER) + 2
    claims = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"a row of {DOC.name} has {len(cells)} cells: {line}"
        key, ours = cells[0].strip("`"), cells[3]
        pairs = dict(re.findall(r"(\w+) `([^`]*)`", ours))
        if not pairs:
            single = re.fullmatch(r"`([^`]*)`", ours)
            assert single, f"the ours cell of {key} is neither `value` nor recipe `value` pairs: {ours!r}"
            pairs = dict.fromkeys(RECIPES, single.group(1))
        assert set(pairs) <= set(RECIPES), f"{key}: unknown recipe in {ours!r}"
        if "ppo" in pairs and "megatron" not in pairs:
            pairs["megatron"] = pairs["ppo"]
        claims += [(key, recipe, value) for recipe, value in pairs.items()]
    return claims


def research_claims() -> list[tuple[str, str, str]]:
    """(key, "research", value) for every "ours" cell of the ReSearch recipe's table (one recipe, one value)."""
    lines = DOC.read_text().splitlines()
    claims = []
    for line in lines[lines.index(RESEARCH_HEADER) + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row of {DOC.name}'s ReSearch table has {len(cells)} cells: {line}"
        single = re.fullmatch(r"`([^`]*)`", cells[2])
        assert single, f"the ours cell of {cells[0]} is not one `value`: {cells[2]!r}"
        claims.append((cells[0].strip("`"), "research", single.group(1)))
    return claims


@pytest.fixture(scope="module")
def configs() -> dict:
    composed = {}
    with _environ_defaults({variable: config_path(name) for variable, name in ENV_DEFAULTS.items()}):
        for short, folder in {**RECIPES, "research": RESEARCH}.items():
            composed[short] = compose_verl_config(recipe=REPO / "examples" / folder / "config.yaml")
    return composed


@pytest.fixture(scope="module")
def agent_loop() -> dict:
    return {entry.name: entry for entry in OmegaConf.load(config_path("agent-loop"))}


def actual(config, agent_loop, recipe: str, key: str):
    loop, _, setting = key.partition(".")
    if loop in agent_loop:
        assert config.actor_rollout_ref.rollout.agent.default_agent_loop == loop, recipe
        return agent_loop[loop][setting]
    if key == "(updates per step)":
        actor = config.actor_rollout_ref.actor
        # verl multiplies both by rollout.n, which cancels
        return config.data.train_batch_size // actor.ppo_mini_batch_size * actor.ppo_epochs
    value = OmegaConf.select(config, key, default="<missing>")
    assert value != "<missing>", f"{recipe}: {key} is not in the composed config"
    return value


def same(stated: str, value) -> bool:
    if isinstance(value, bool):
        return stated == str(value).lower()
    if isinstance(value, (int, float)):
        return float(stated) == float(value)
    return stated == str(value)


CLAIMS = table_claims() + research_claims()


def test_the_table_covers_the_settings_the_issue_names():
    keys = {key for key, _, _ in CLAIMS}
    for needed in ("actor_rollout_ref.model.path", "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size",
                   "(updates per step)", "search_r1_agent.max_turns", "data.max_response_length",
                   "actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.entropy_coeff",
                   "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"):
        assert needed in keys, needed


@pytest.mark.parametrize("key, recipe, stated", CLAIMS, ids=[f"{recipe}:{key}" for key, recipe, _ in CLAIMS])
def test_every_ours_cell_is_what_the_recipe_composes_to(key, recipe, stated, configs, agent_loop):
    if stated == "-":
        assert OmegaConf.select(configs[recipe], key, default="<missing>") == "<missing>", f"{recipe} has {key}"
        return
    value = actual(configs[recipe], agent_loop, recipe, key)
    assert same(stated, value), f"docs/training.md says {recipe} {key} = {stated!r}; the recipe composes to {value!r}"
