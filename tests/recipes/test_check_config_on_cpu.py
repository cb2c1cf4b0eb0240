"""`check-config` accepts every shipped recipe and rejects one broken recipe per failure it
guards against. The tiny Qwen2 and the mini data stand in for the real model and data paths."""

import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import MINI_QA, REPO
from verl_search.check_config import check_config
from verl_search.data.preprocess import Source, build_rows, write_parquet

RECIPES = sorted((REPO / "examples").glob("*/config.yaml"))
TOOL_RECIPE = REPO / "examples" / "grpo_qwen2.5-3b-instruct_tool" / "config.yaml"


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipe_data")
    paths = {}
    for protocol in ("tool", "search_r1"):
        paths[protocol] = folder / f"{protocol}.parquet"
        write_parquet(build_rows([Source.parse(str(MINI_QA))], "train", protocol, max_per_source=2), paths[protocol])
    return paths


def stand_ins(tiny_qwen, data_file):
    return [f"actor_rollout_ref.model.path={tiny_qwen}", f"critic.model.path={tiny_qwen}",
            f"data.train_files={data_file}", f"data.val_files={data_file}"]


def test_shipped_recipes_exist():
    assert {r.parent.name for r in RECIPES} == {"grpo_qwen2.5-3b-instruct_tool", "ppo_qwen2.5-3b-base_search_r1"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.parent.name)
def test_every_shipped_recipe_passes(recipe, tiny_qwen, parquet):
    protocol = "tool" if "tool" in recipe.parent.name else "search_r1"
    assert check_config(recipe, stand_ins(tiny_qwen, parquet[protocol])) == []


def rewrite(parquet_path, tmp_path, change):
    frame = pd.read_parquet(parquet_path)
    change(frame)
    out = tmp_path / "broken.parquet"
    frame.to_parquet(out)
    return out


@pytest.mark.parametrize(
    "overrides, data_change, expected",
    [
        (["actor_rollout_ref.rollout.multi_turn.tool_config_path=/nonexistent/tools.yaml"], None,
         "tool_config_path /nonexistent/tools.yaml does not exist"),  # tool config missing
        ("BAD_TOOL_CLASS", None, "'verl_search.tools.nope.NopeTool' in"),  # tool class does not import
        (["actor_rollout_ref.rollout.multi_turn.format=qwen"], None, "'qwen' is not a verl tool parser"),  # parser
        ([], lambda f: f.__setitem__("agent_name", "nope_agent"), "agent loop 'nope_agent' is not registered"),
        (["actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"], lambda f: f.drop(columns="agent_name", inplace=True),
         "tools would never be called (verl #3008)"),  # agent_name missing, single-turn default
        (["reward.custom_reward_function.path=pkg://verl_search.nope"], None, "cannot be loaded"),  # reward import
        (["reward.custom_reward_function.name=gold_answers"], None, "wrong signature"),  # reward signature
        ([], lambda f: f.drop(columns="reward_model", inplace=True), "no 'reward_model' column"),  # parquet columns
        (["actor_rollout_ref.rollout.response_length=9000"], None, "exceeds the model's context (8192"),  # lengths
        (["actor_rollout_ref.rollout.multi_turn.max_tool_response_length=256"], None,
         "below tool search's max_observation_chars=3000"),  # verl would cut observations blindly
        (["actor_rollout_ref.rollout.no_such_key=1"], None, "does not compose"),  # a typo in an override
    ],
)
def test_broken_recipes_are_rejected(overrides, data_change, expected, tiny_qwen, parquet, tmp_path):
    data_file = rewrite(parquet["tool"], tmp_path, data_change) if data_change else parquet["tool"]
    if overrides == "BAD_TOOL_CLASS":
        bad = tmp_path / "tools.yaml"
        bad.write_text("tools:\n  - class_name: verl_search.tools.nope.NopeTool\n    config: {type: native}\n")
        overrides = [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}"]
    problems = check_config(TOOL_RECIPE, stand_ins(tiny_qwen, data_file) + overrides)
    assert any(expected in p for p in problems), problems


def test_cli_exit_codes(tiny_qwen, parquet):
    command = [sys.executable, "-m", "verl_search.cli", "check-config", str(TOOL_RECIPE), *stand_ins(tiny_qwen, parquet["tool"])]
    ok = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(command + ["actor_rollout_ref.rollout.multi_turn.format=qwen"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "not a verl tool parser" in bad.stderr


def test_download_fails_fast_without_the_hub(tmp_path):
    from verl_search.server.runner import free_port

    env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HUB_OFFLINE": "0"}
    result = subprocess.run([sys.executable, "-m", "verl_search.cli", "download", "datasets", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "cannot reach" in result.stderr and list(tmp_path.iterdir()) == []
    offline = subprocess.run([sys.executable, "-m", "verl_search.cli", "download", "wiki18", "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=60, env={**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 2 and "HF_HUB_OFFLINE is set" in offline.stderr
