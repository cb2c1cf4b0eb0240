"""A local Ray whose processes load the CPU plugin: what `verl-search eval --engine vllm` runs verl's
rollout replicas in (`eval/verl_run.with_vllm`), as `verl-search train --cpu` does for `main_ppo`.
"""

from __future__ import annotations

import contextlib
import importlib
import os

from verl_search.cpu.names import PLUGIN_MODULE
from verl_search.cpu.overrides import CPU_LOGICAL_CPUS, cpu_env


@contextlib.contextmanager
def cpu_ray():
    """A local Ray whose processes (this one included) load the CPU plugin, as `train --cpu`'s do.

    Sets `VERL_USE_EXTERNAL_MODULES` / `VERL_PLATFORM` in this process for the block (verl reads
    them when imported; the plugin module is imported here as verl's hook would), starts Ray with
    `overrides.CPU_LOGICAL_CPUS` logical CPUs and one logical GPU, and shuts it down at the end.
    Raises `RuntimeError` if a Ray instance is already running in this process.
    """
    import ray

    if ray.is_initialized():
        raise RuntimeError("eval --engine vllm starts its own local Ray; this process already runs one")
    env = cpu_env(base={})
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

    from verl_search.cpu.platform import PLATFORM_NAME

    if get_platform().device_name != PLATFORM_NAME:
        set_platform(PlatformRegistry.get(PLATFORM_NAME)())
