"""`verl-search train RECIPE [overrides] [--cpu]`: a shipped recipe through verl's own `main_ppo`.

The command is `python -m verl.trainer.main_ppo --config-path DIR --config-name NAME overrides...`,
as a user would type it, with:

* the environment the recipes read: `VERL_SEARCH_TOOL_CONFIG` / `VERL_SEARCH_AGENT_LOOPS` (the
  shipped YAMLs, unless set) and `VERL_SEARCH_URL` (the retrieval endpoint);
* with `--cpu`, the CPU plugin (`VERL_USE_EXTERNAL_MODULES=verl_search.cpu.plugin`,
  `VERL_PLATFORM=cpu`) and `cpu.overrides.cpu_overrides()`, placed before the user's overrides; a
  user override of the same key replaces ours.

`verl-search check-config` runs on the same recipe and overrides first, so a broken recipe fails in
seconds. The GPU recipes are unchanged: without `--cpu` nothing is added but the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from verl_search.cpu.overrides import cpu_env, cpu_overrides
from verl_search.runtime import env as env_vars
from verl_search.verl_config.compose import merge_overrides
from verl_search.verl_config.shipped import config_path


def train_overrides(given: list[str], cpu: bool) -> list[str]:
    """The overrides `main_ppo` gets: `cpu_overrides()` (with `cpu`) merged under `given`."""
    return merge_overrides(cpu_overrides(given), given) if cpu else list(given)


def train_env(cpu: bool, retrieval_url: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for `main_ppo` (Ray's local workers inherit it).

    Args:
        cpu: add the CPU plugin and platform (`cpu.overrides.cpu_env`).
        retrieval_url: the `/retrieve` endpoint (`VERL_SEARCH_URL`); default: keep the inherited one.
        base: the environment to start from (default: `os.environ`).
    """
    env = dict(os.environ if base is None else base)
    env.setdefault(env_vars.TOOL_CONFIG, config_path("tool"))
    env.setdefault(env_vars.AGENT_LOOPS, config_path("agent-loop"))
    if retrieval_url:
        env[env_vars.URL] = retrieval_url
    return cpu_env(env) if cpu else env


def check_in_child(recipe: str | os.PathLike, overrides: list[str], require_engine: bool = False) -> list[str]:
    """`verl_config.check.check_config` of `recipe` with `overrides` (the ones `main_ppo` will get), run in a
    child process so that verl's imports do not stay in a launcher that waits for the whole run; returns the
    problems (empty: fine)."""
    from verl_search.runtime.child import in_child
    from verl_search.verl_config.check import check_config

    return in_child(check_config, str(recipe), overrides, require_engine=require_engine)


def main_ppo_command(recipe: str | os.PathLike, overrides: list[str]) -> list[str]:
    """`python -m verl.trainer.main_ppo --config-path DIR --config-name NAME overrides...`."""
    recipe = Path(recipe).resolve()
    if not recipe.is_file():
        raise FileNotFoundError(f"recipe {recipe} does not exist; pass a recipe YAML such as "
                                "examples/grpo_qwen2.5-3b-instruct_tool/config.yaml")
    return [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={recipe.parent}",
            f"--config-name={recipe.stem}", *overrides]


def run_training(recipe: str | os.PathLike, overrides: list[str], *, cpu: bool = False,
                 retrieval_url: str | None = None) -> int:
    """Run `main_ppo` on `recipe` and return its exit code (blocking; output goes to ours)."""
    command = main_ppo_command(recipe, train_overrides(overrides, cpu))
    return subprocess.call(command, env=train_env(cpu, retrieval_url))
