"""`verl-search train RECIPE [overrides] [--cpu]`: a shipped recipe through verl's own `main_ppo`.

The command is `python -m verl.trainer.main_ppo --config-path DIR --config-name NAME overrides...`,
as a user would type it, with:

* the environment the recipes read: `VERL_SEARCH_TOOL_CONFIG` / `VERL_SEARCH_AGENT_LOOPS` (the
  shipped YAMLs, unless set) and `VERL_SEARCH_URL` (the retrieval endpoint);
* with `--cpu`, the CPU plugin (`VERL_USE_EXTERNAL_MODULES=verl_search.training.cpu_plugin`,
  `VERL_PLATFORM=cpu`) and `cpu_overrides()`, placed before the user's overrides; a user override
  of the same key replaces ours.

`verl-search check-config` runs on the same recipe and overrides first, so a broken recipe fails in
seconds. The GPU recipes are unchanged: without `--cpu` nothing is added but the environment.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from verl_search.runtime import env as env_vars
from verl_search.training import vllm_cpu
from verl_search.training.names import PLUGIN_MODULE, ROLLOUT_NAME
from verl_search.verl_config.shipped import config_path

logger = logging.getLogger(__name__)

EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
PLATFORM_ENV = "VERL_PLATFORM"
FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
"""FSDP mixed-precision setting that keeps every dtype fp32."""
CPU_LOGICAL_CPUS = 8
"""Ray's logical CPU count on a CPU run: verl and TransferQueue place several 1-CPU actors
(task runner, storage, agent-loop and reward workers) that mostly wait; 2 real cores would
leave some of them unscheduled forever."""


def override_key(override: str) -> str:
    """The config key of a hydra override: `+a.b=1` -> `a.b`, `~a.b` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(defaults: list[str], given: list[str]) -> list[str]:
    """`defaults` whose key `given` does not set, then `given` (hydra refuses a key set twice)."""
    keys = {override_key(o) for o in given}
    return [o for o in defaults if override_key(o) not in keys] + list(given)


def _given_value(given: list[str], key: str, default: str | None) -> str | None:
    for override in reversed(given):
        if override_key(override) == key and "=" in override:
            return override.split("=", 1)[1]
    return default


def cpu_overrides(given: list[str] = ()) -> list[str]:
    """What a recipe needs to run on the CPU with the plugin, each for a reason:

    - `trainer.device=cpu`; the rollout: verl's vLLM on the CPU build of vLLM where
      `vllm-cpu` is installed (the `[cpu]` extra; plus `vllm_cpu.cpu_rollout_overrides()`:
      no sleep mode, eager mode, fp32), else `verl_search_cpu` (transformers);
    - FSDP2 for actor, reference and critic (FSDP1 hard-codes `sync_module_states=True`, a
      broadcast from a device);
    - `attn_implementation=sdpa` for actor and critic (verl's default is flash-attention);
    - fp32 compute for actor, reference and critic (verl's default bf16 autocast is slower on
      most CPUs, and the rollout computes in fp32: their log-probs then agree to ~1e-6);
    - `trainer.n_gpus_per_node` logical GPUs (default 1) and as many in Ray
      (`ray_kwargs.ray_init.num_gpus`): each is a trainer worker on the shared cores;
    - `CPU_LOGICAL_CPUS` logical CPUs for Ray; one TransferQueue storage unit, one agent-loop
      worker, one reward worker and no data-loader worker processes (verl starts 8 of each).
    """
    gpus = _given_value(list(given), "trainer.n_gpus_per_node", "1")
    rollout = _given_value(list(given), "actor_rollout_ref.rollout.name", None)
    if rollout is None:  # chosen here only when the user named none (its warning would mislead otherwise)
        rollout = default_cpu_rollout(_given_value(list(given), "actor_rollout_ref.model.path", None))
    engine = vllm_cpu.cpu_rollout_overrides() if rollout == vllm_cpu.ROLLOUT_NAME else []
    return [
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={gpus}",
        f"actor_rollout_ref.rollout.name={rollout}",
        *engine,
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "critic.strategy=fsdp2",
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "++critic.model.override_config.attn_implementation=sdpa",
        f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={FP32}",
        f"++actor_rollout_ref.ref.fsdp_config.mixed_precision={FP32}",
        f"++critic.fsdp.mixed_precision={FP32}",
        f"++ray_kwargs.ray_init.num_gpus={gpus}",
        f"ray_kwargs.ray_init.num_cpus={CPU_LOGICAL_CPUS}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
    ]


def default_cpu_rollout(model: str | None = None) -> str:
    """`vllm` where the supported `vllm-cpu` is installed, else `verl_search_cpu`; also `verl_search_cpu`
    (with a warning) when the model folder `model` has a head size vLLM's CPU attention has no kernel for
    (`vllm_cpu.unsupported_head_size`)."""
    version = vllm_cpu.vllm_cpu_version()
    if version == vllm_cpu.SUPPORTED_VLLM_CPU_VERSION:
        size = vllm_cpu.unsupported_head_size(model)
        if size is None:
            return vllm_cpu.ROLLOUT_NAME
        logger.warning("%s has head size %d, for which vLLM's CPU attention has no kernel: using the transformers "
                       "rollout (%s)", model, size, ROLLOUT_NAME)
        return ROLLOUT_NAME
    if version is not None:
        logger.warning("vllm-cpu %s is installed, the CPU vLLM rollout needs %s: using the transformers rollout "
                       "(%s)", version, vllm_cpu.SUPPORTED_VLLM_CPU_VERSION, ROLLOUT_NAME)
    return ROLLOUT_NAME


def train_overrides(given: list[str], cpu: bool) -> list[str]:
    """The overrides `main_ppo` gets: `cpu_overrides()` (with `cpu`) merged under `given`."""
    return merge_overrides(cpu_overrides(given), given) if cpu else list(given)


def train_env(cpu: bool, retrieval_url: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for `main_ppo` (Ray's local workers inherit it).

    Args:
        cpu: add the CPU plugin and platform.
        retrieval_url: the `/retrieve` endpoint (`VERL_SEARCH_URL`); default: keep the inherited one.
        base: the environment to start from (default: `os.environ`).
    """
    env = dict(os.environ if base is None else base)
    env.setdefault(env_vars.TOOL_CONFIG, config_path("tool"))
    env.setdefault(env_vars.AGENT_LOOPS, config_path("agent-loop"))
    if retrieval_url:
        env[env_vars.URL] = retrieval_url
    if cpu:
        modules = [m for m in env.get(EXTERNAL_MODULES_ENV, "").split(",") if m]
        if PLUGIN_MODULE not in modules:
            modules.append(PLUGIN_MODULE)
        env[EXTERNAL_MODULES_ENV] = ",".join(modules)
        env[PLATFORM_ENV] = "cpu"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


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
