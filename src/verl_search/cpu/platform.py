"""A CPU platform for verl's `PlatformRegistry`, so `main_ppo` runs without an accelerator.

verl resolves every device question through `verl.plugin.platform.get_platform()`
(`verl/utils/device.py`): the device string, the `torch.<device>` module, the collective backend,
the Ray resource name. `PlatformCPU` answers them for the CPU:

* device `cpu`, collective backend `gloo`;
* Ray resource `GPU`, so verl's resource pools schedule as usual: start Ray with logical GPUs
  (`+ray_kwargs.ray_init.num_gpus=N`, N = `trainer.n_gpus_per_node`); each stands for a share of
  the CPU, no device is touched;
* `device_module` is `CPUDeviceModule`: `torch.cpu` plus what verl calls on `torch.cuda`
  (`empty_cache`, `mem_get_info`, `memory_allocated`, `get_rng_state`, `get_device_name`, ...),
  answered from the process's memory (RSS) or as no-ops.

Selected with `VERL_PLATFORM=cpu`; registered by `verl_search.cpu.plugin`.
"""

from __future__ import annotations

import os
import platform as host_platform
import types
from contextlib import contextmanager
from typing import Any

import torch

PLATFORM_NAME = "cpu"


def _rss_bytes() -> int:
    """Resident memory of this process in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError):
        available = total
    return available, total


class CPUDeviceModule(types.ModuleType):
    """`torch.cpu` with the `torch.cuda` calls verl makes, answered for host memory.

    Memory statistics are bytes of this process's RSS (`memory_allocated`, `memory_reserved`,
    the `max_*` variants) and of host memory (`mem_get_info` -> `(free, total)`). Cache, IPC and
    allocator calls are no-ops; RNG state is torch's CPU generator's. Anything else is looked up
    on `torch.cpu`.
    """

    def __init__(self) -> None:
        super().__init__("verl_search_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return "cpu"  # as torch.cpu.current_device(); verl passes it to `.to(...)`

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return host_platform.processor() or host_platform.machine() or "cpu"

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return _host_memory()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return _rss_bytes()

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


def make_platform_class():
    """The `PlatformBase` subclass (built on call: verl is imported only when asked)."""
    from verl.plugin.platform.platform_base import PlatformBase

    device_module = CPUDeviceModule()

    class PlatformCPU(PlatformBase):
        """verl on the CPU: device `cpu`, backend `gloo`, Ray resource `GPU` (logical)."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: device_module)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # never auto-detected: only VERL_PLATFORM=cpu selects it
            return False

        def current_device(self) -> str:
            # verl calls `.to(get_device_id())`: an int would mean an accelerator index
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            # Ray sets it for actors holding logical GPUs; nothing reads it on the CPU
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def rollout_env_vars(self) -> dict[str, str]:
            # vLLM's CPU settings (KV cache GiB, thread binding) for the vLLM server actor
            from verl_search.cpu.vllm_cpu import cpu_rollout_env

            return cpu_rollout_env()

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    return PlatformCPU
