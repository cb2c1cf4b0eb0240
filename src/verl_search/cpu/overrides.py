"""What a verl recipe needs to run on the CPU: the overrides `main_ppo` gets (`cpu_overrides`) and the
environment that loads the CPU plugin in every verl process (`cpu_env`). `verl-search train --cpu`,
`eval --engine vllm` (`cpu/local_ray.py`) and the quickstart's cold start use them.
"""

from __future__ import annotations

import os

from verl_search.cpu import vllm_cpu
from verl_search.cpu.engine import default_cpu_rollout
from verl_search.cpu.names import PLUGIN_MODULE
from verl_search.cpu.precision import mixed_precision
from verl_search.verl_config.compose import given_value

EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
PLATFORM_ENV = "VERL_PLATFORM"
CPU_LOGICAL_CPUS = 8
"""Ray's logical CPU count on a CPU run: verl and TransferQueue place several 1-CPU actors
(task runner, storage, agent-loop and reward workers) that mostly wait; 2 real cores would
leave some of them unscheduled forever."""


def cpu_overrides(given: list[str] = ()) -> list[str]:
    """What a recipe needs to run on the CPU with the plugin, each for a reason:

    - `trainer.device=cpu`; the rollout: verl's vLLM on the CPU build of vLLM where
      `vllm-cpu` is installed (the `[cpu]` extra; plus `vllm_cpu.cpu_rollout_overrides()`:
      no sleep mode, eager mode, fp32), else `verl_search_cpu` (transformers;
      `engine.default_cpu_rollout`);
    - FSDP2 for actor, reference and critic (FSDP1 hard-codes `sync_module_states=True`, a
      broadcast from a device);
    - `attn_implementation=sdpa` for actor and critic (verl's default is flash-attention);
    - fp32 compute for actor, reference and critic (verl's default bf16 is slower on CPUs without
      native bf16, and the rollout computes in fp32: their log-probs then agree to ~1e-6; the main
      job and `verl-search study --dtype` put both in bf16 where the CPU has it, `cpu.precision`);
    - no torch.compile of the entropy (`use_torch_compile=false` for actor and reference): on
      the CPU inductor compiles C++ at the first call and again at each change of shape or grad
      mode (a quickstart GRPO run reached dynamo's recompile limit, 8, in its first step); on an
      empty cache, 47.7 s against 8.6 s eager for the same calls, equal values
      (`benchmarks/bench_entropy_compile.py`, docs/benchmarks/cpu-engine.md);
    - `trainer.n_gpus_per_node` logical GPUs (default 1) and as many in Ray
      (`ray_kwargs.ray_init.num_gpus`): each is a trainer worker on the shared cores;
    - `CPU_LOGICAL_CPUS` logical CPUs for Ray; one TransferQueue storage unit, one agent-loop
      worker, one reward worker and no data-loader worker processes (verl starts 8 of each).

    `given`: the user's overrides, read for the GPU count, the rollout name and the model path;
    merge them over the result (`verl_config.compose.merge_overrides`).
    """
    given = list(given)
    gpus = given_value(given, "trainer.n_gpus_per_node", "1")
    rollout = given_value(given, "actor_rollout_ref.rollout.name")
    if rollout is None:  # chosen here only when the user named none (its warning would mislead otherwise)
        rollout = default_cpu_rollout(given_value(given, "actor_rollout_ref.model.path"))
    engine = vllm_cpu.cpu_rollout_overrides() if rollout == vllm_cpu.ROLLOUT_NAME else []
    fp32 = mixed_precision("float32")
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
        f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={fp32}",
        f"++actor_rollout_ref.ref.fsdp_config.mixed_precision={fp32}",
        f"++critic.fsdp.mixed_precision={fp32}",
        "actor_rollout_ref.actor.use_torch_compile=false",  # the reference's follows it
        "++actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "++actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        f"++ray_kwargs.ray_init.num_gpus={gpus}",
        f"ray_kwargs.ray_init.num_cpus={CPU_LOGICAL_CPUS}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
    ]


def cpu_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: `os.environ`) with the CPU plugin added to `VERL_USE_EXTERNAL_MODULES` (once,
    other modules kept), `VERL_PLATFORM=cpu` and, unless set, `TOKENIZERS_PARALLELISM=false`.
    verl imports the plugin in every process that inherits it (Ray's workers included)."""
    env = dict(os.environ if base is None else base)
    modules = [m for m in env.get(EXTERNAL_MODULES_ENV, "").split(",") if m]
    if PLUGIN_MODULE not in modules:
        modules.append(PLUGIN_MODULE)
    env[EXTERNAL_MODULES_ENV] = ",".join(modules)
    env[PLATFORM_ENV] = "cpu"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
